#include "thread_slot.hpp"

#include <atomic>
#include <bit>
#include <cstdint>

namespace lazydag::engine::detail {
namespace {

static_assert(kThreadSlots == 64, "one bit per slot in a 64-bit mask");

std::atomic<std::uint64_t> g_taken{0};

// -1: not asked yet; -2: none (all taken, or exiting). Trivially
// destructible, so it can be read by thread_local destructors that run
// after the guard's.
thread_local int t_slot = -1;

// Gives the slot back when the thread exits. acq_rel on the mask: the next
// owner's accesses to a pool's cache for this slot happen after this
// thread's.
struct SlotGuard {
  int slot = -1;
  ~SlotGuard() {
    if (slot < 0) return;
    t_slot = -2;
    g_taken.fetch_and(~(std::uint64_t{1} << slot), std::memory_order_acq_rel);
  }
};

int take_slot() noexcept {
  thread_local SlotGuard guard;
  std::uint64_t taken = g_taken.load(std::memory_order_relaxed);
  for (;;) {
    if (taken == ~std::uint64_t{0}) {
      t_slot = -2;
      return -1;
    }
    const int s = std::countr_one(taken);
    if (g_taken.compare_exchange_weak(taken, taken | (std::uint64_t{1} << s), std::memory_order_acq_rel,
                                      std::memory_order_relaxed)) {
      guard.slot = s;
      t_slot = s;
      return s;
    }
  }
}

}  // namespace

int thread_slot() noexcept {
  const int s = t_slot;
  if (s >= 0) return s;
  if (s == -2) return -1;
  return take_slot();
}

}  // namespace lazydag::engine::detail
