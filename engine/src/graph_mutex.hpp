// The engine's request lock (lazy and naive requests of recorded nodes and
// the lazy window): a futex mutex that spins briefly before sleeping.
#pragma once

#include <atomic>
#include <cstdint>

#include "sync.hpp"

namespace lazydag::engine::detail {

/// Critical sections under it are mostly short (a request, a list
/// insertion; a lazy wait's walk of its subgraph is the long one), so a
/// waiter that spins a little usually gets the lock without sleeping;
/// under real contention it sleeps on a futex. The uncontended lock is one
/// compare-and-swap and the unlock one exchange, inlined: glibc's adaptive
/// mutex, called through the PLT, took about 8% of a recorded `x + 1`
/// (two lock/unlock pairs: the push and the deletion of its result).
/// The word is 0 (free), 1 (locked) or 2 (locked, and a thread may sleep
/// on it): Drepper's "Futexes Are Tricky", mutex 3. Lockable: use with
/// std::unique_lock.
class GraphMutex {
 public:
  GraphMutex() = default;
  GraphMutex(const GraphMutex&) = delete;
  GraphMutex& operator=(const GraphMutex&) = delete;

  void lock() noexcept {
    if (!try_lock()) lock_slow();
  }
  bool try_lock() noexcept {
    std::uint32_t c = 0;
    return word_.compare_exchange_strong(c, 1, std::memory_order_acquire, std::memory_order_relaxed);
  }
  void unlock() noexcept {
    if (word_.exchange(0, std::memory_order_release) == 2) futex_wake_one(word_);
  }

 private:
  void lock_slow() noexcept {
    // Spin first: the holder is usually a few hundred nanoseconds from
    // unlocking. Yielding stays out of it: a holder preempted on this core
    // is what the futex below is for.
    for (int i = 0; i < kSpins; ++i) {
      cpu_relax();
      if (word_.load(std::memory_order_relaxed) == 0 && try_lock()) return;
    }
    // Mark it contended, then sleep until an unlock finds the mark. A
    // thread that takes the lock this way leaves the mark (2): its unlock
    // may wake a thread for nothing, never miss one.
    while (word_.exchange(2, std::memory_order_acquire) != 0) futex_wait(word_, 2, -1);
  }

  static constexpr int kSpins = 128;
  std::atomic<std::uint32_t> word_{0};
};

}  // namespace lazydag::engine::detail
