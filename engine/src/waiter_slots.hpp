// WaiterSlots: the frontend threads inside a blocking call. A wait takes a
// slot (its tag is the index + 1) for its duration; a node wait tags the
// nodes of its subgraph with it, and a completion that makes a tagged node
// ready hands the node to the slot's help list. Slots are preallocated, so
// waits allocate nothing; when all are taken a wait runs untagged (tag 0:
// it still helps with the ready queue).
//
// Also counted: the waitalls and the window stalls registered, which a
// completion consults to decide whether to wake the waiters. A waiter
// raises its count (seq_cst) before it first checks its condition, and a
// completion stores its effect before it reads the counts (seq_cst): one
// of the two sees the other (docs/architecture.md, "Lost wake-ups").
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <mutex>

#include "node.hpp"
#include "small_vector.hpp"
#include "sync.hpp"

namespace lazydag::engine::detail {

enum class WaitMode : std::uint8_t { kNode, kAll, kThrottle };

// One frontend thread inside a blocking call.
struct Waiter {
  SpinLock lock;                   // guards help and in_use
  SmallVector<Node*, 16> help;     // ready nodes of its subgraph, one ref each
  bool in_use = false;
  WaitMode mode = WaitMode::kNode;
  std::atomic<bool> idle{false};   // looking for work (spinning or parked): hand it work
};

class WaiterSlots {
 public:
  static constexpr std::uint32_t kMaxWaiters = 64;

  /// A free slot's tag (index + 1) for a wait of `mode`, or 0 when all are
  /// taken. The mode's count is raised first, either way.
  std::uint32_t acquire(WaitMode mode) noexcept {
    if (mode == WaitMode::kAll) {
      all_.fetch_add(1, std::memory_order_seq_cst);
    } else if (mode == WaitMode::kThrottle) {
      throttle_.fetch_add(1, std::memory_order_seq_cst);
    }
    for (std::uint32_t i = 0; i < kMaxWaiters; ++i) {
      Waiter& w = slots_[i];
      std::lock_guard g(w.lock);
      if (w.in_use) continue;
      w.in_use = true;
      w.mode = mode;
      w.idle.store(false, std::memory_order_relaxed);
      return i + 1;
    }
    return 0;
  }

  /// Ends what acquire() began. The nodes still on the slot's help list
  /// (one ref each) are moved to `left`, for the caller to queue or drop.
  void release(std::uint32_t tag, WaitMode mode, SmallVector<Node*, 16>& left) {
    if (mode == WaitMode::kAll) {
      all_.fetch_sub(1, std::memory_order_seq_cst);
    } else if (mode == WaitMode::kThrottle) {
      throttle_.fetch_sub(1, std::memory_order_seq_cst);
    }
    if (tag == 0) return;
    Waiter& w = at(tag);
    std::lock_guard g(w.lock);
    w.in_use = false;
    w.idle.store(false, std::memory_order_relaxed);
    for (Node* n : w.help) left.push_back(n);
    w.help.clear();
  }

  /// The slot of `tag` (>= 1).
  Waiter& at(std::uint32_t tag) noexcept { return slots_[tag - 1]; }

  /// Whether a waitall, or a window stall, is registered.
  [[nodiscard]] bool any_waitall(std::memory_order mo = std::memory_order_seq_cst) const noexcept {
    return all_.load(mo) != 0;
  }
  [[nodiscard]] bool any_throttled(std::memory_order mo = std::memory_order_seq_cst) const noexcept {
    return throttle_.load(mo) != 0;
  }

 private:
  std::array<Waiter, kMaxWaiters> slots_;
  std::atomic<std::uint32_t> all_{0};       // kAll waits registered
  std::atomic<std::uint32_t> throttle_{0};  // kThrottle waits registered
};

}  // namespace lazydag::engine::detail
