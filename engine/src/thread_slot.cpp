#include "thread_slot.hpp"

#include <atomic>
#include <bit>
#include <cstdint>

namespace lazydag::engine::detail {
namespace {

static_assert(kThreadSlots == 64, "one bit per slot in a 64-bit mask");

std::atomic<std::uint64_t> g_taken{0};

// Gives the slot back when the thread exits. acq_rel on the mask: the next
// owner's accesses to a pool's cache for this slot happen after this
// thread's.
struct SlotGuard {
  int slot = -1;
  ~SlotGuard() {
    if (slot < 0) return;
    t_thread_slot = -2;
    g_taken.fetch_and(~(std::uint64_t{1} << slot), std::memory_order_acq_rel);
  }
};

}  // namespace

constinit thread_local int t_thread_slot = -1;

int take_thread_slot() noexcept {
  thread_local SlotGuard guard;
  std::uint64_t taken = g_taken.load(std::memory_order_relaxed);
  for (;;) {
    if (taken == ~std::uint64_t{0}) {
      t_thread_slot = -2;
      return -1;
    }
    const int s = std::countr_one(taken);
    if (g_taken.compare_exchange_weak(taken, taken | (std::uint64_t{1} << s), std::memory_order_acq_rel,
                                      std::memory_order_relaxed)) {
      guard.slot = s;
      t_thread_slot = s;
      return s;
    }
  }
}

}  // namespace lazydag::engine::detail
