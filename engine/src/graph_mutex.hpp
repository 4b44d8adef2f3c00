// The engine's graph lock: a mutex that spins briefly before sleeping.
#pragma once

#include <pthread.h>

namespace lazydag::engine::detail {

/// Critical sections under the graph lock are short (O(read + write set)),
/// so a waiter that spins a little usually gets the lock without the two
/// futex system calls of a sleeping std::mutex. glibc's adaptive mutex does
/// exactly that and falls back to sleeping under real contention.
/// Lockable: use with std::unique_lock and std::condition_variable_any.
class GraphMutex {
 public:
  GraphMutex() {
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
#ifdef PTHREAD_ADAPTIVE_MUTEX_INITIALIZER_NP
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ADAPTIVE_NP);
#endif
    pthread_mutex_init(&mu_, &attr);
    pthread_mutexattr_destroy(&attr);
  }
  ~GraphMutex() { pthread_mutex_destroy(&mu_); }
  GraphMutex(const GraphMutex&) = delete;
  GraphMutex& operator=(const GraphMutex&) = delete;

  void lock() noexcept { pthread_mutex_lock(&mu_); }
  bool try_lock() noexcept { return pthread_mutex_trylock(&mu_) == 0; }
  void unlock() noexcept { pthread_mutex_unlock(&mu_); }

 private:
  pthread_mutex_t mu_;
};

}  // namespace lazydag::engine::detail
