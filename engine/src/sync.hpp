// Low-level synchronisation for the scheduler: a leaf spin lock, a CPU
// relax hint and a futex word that threads park on with a deadline.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace lazydag::engine::detail {

inline void cpu_relax() noexcept {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

/// A test-and-test-and-set lock for critical sections of a few instructions
/// (no allocation, no user code inside). After a short spin it yields, so a
/// holder preempted on an oversubscribed machine gets its core back instead
/// of the waiter burning the rest of its quantum.
class SpinLock {
 public:
  void lock() noexcept {
    for (unsigned spins = 0;; ) {
      if (!locked_.exchange(true, std::memory_order_acquire)) return;
      while (locked_.load(std::memory_order_relaxed)) {
        if (++spins < 64) {
          cpu_relax();
        } else {
          std::this_thread::yield();
        }
      }
    }
  }
  bool try_lock() noexcept {
    return !locked_.load(std::memory_order_relaxed) && !locked_.exchange(true, std::memory_order_acquire);
  }
  void unlock() noexcept { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

/// Spins until found() or `limit` passes, yielding the core every 16 tries
/// (so a thread that has the work, or a device executor, can run on it).
/// Returns whether found() held.
template <class Found>
bool spin_for(std::chrono::nanoseconds limit, Found found) {
  const auto until = std::chrono::steady_clock::now() + limit;
  for (unsigned i = 0;; ++i) {
    if (found()) return true;
    if (i % 16 == 15) {
      if (std::chrono::steady_clock::now() >= until) return false;
      std::this_thread::yield();
    } else {
      cpu_relax();
    }
  }
}

/// Parks the calling thread while `word` holds `expected`, for at most
/// `timeout_ns` (< 0: no limit). Returns at once if the value differs; may
/// return spuriously. Linux futex; other systems spin-yield.
void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected, std::int64_t timeout_ns) noexcept;
/// Wakes every thread parked on `word`.
void futex_wake_all(std::atomic<std::uint32_t>& word) noexcept;
/// Wakes one thread parked on `word`.
void futex_wake_one(std::atomic<std::uint32_t>& word) noexcept;

}  // namespace lazydag::engine::detail
