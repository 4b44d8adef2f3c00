// EventCount: the futex word that waiting frontend threads park on, and
// the count of those parked (as Folly's and Eigen's EventCount). A thread
// that found nothing to do announces itself with prepare(), which returns
// the current epoch, checks its condition once more, and park()s with that
// epoch unless the condition now holds; every event a parked thread may be
// waiting for calls notify_all() after making the event visible. notify_all
// bumps the epoch first, so a notification between prepare() and park()
// makes the futex return at once: no wake-up is lost. The seq_cst orders
// make "the waiter announced itself, then checked" and "the notifier made
// the event visible, then read the parked count" a total order: one of the
// two sees the other.
#pragma once

#include <atomic>
#include <cstdint>

#include "sync.hpp"

namespace lazydag::engine::detail {

class EventCount {
 public:
  /// Wakes every parked thread (no system call when none is parked).
  void notify_all() noexcept {
    epoch_.fetch_add(1, std::memory_order_seq_cst);
    if (parked_.load(std::memory_order_seq_cst) != 0) futex_wake_all(epoch_);
  }
  /// Announces the calling thread as about to park; returns the epoch to
  /// pass to park(). Every prepare() is followed by one done().
  std::uint32_t prepare() noexcept {
    parked_.fetch_add(1, std::memory_order_seq_cst);
    return epoch_.load(std::memory_order_seq_cst);
  }
  /// Parks until notified after prepare() returned `epoch`, or for at most
  /// `timeout_ns` (< 0: no limit); may return spuriously.
  void park(std::uint32_t epoch, std::int64_t timeout_ns) noexcept { futex_wait(epoch_, epoch, timeout_ns); }
  /// Ends what prepare() began (parked or not).
  void done() noexcept { parked_.fetch_sub(1, std::memory_order_seq_cst); }
  /// Whether any thread is between prepare() and done().
  [[nodiscard]] bool any_parked() const noexcept { return parked_.load(std::memory_order_seq_cst) != 0; }

 private:
  std::atomic<std::uint32_t> epoch_{0};
  std::atomic<std::uint32_t> parked_{0};
};

}  // namespace lazydag::engine::detail
