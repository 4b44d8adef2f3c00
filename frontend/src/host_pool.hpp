// A caching pool for array storage on the host: freed buffers are kept by
// size class and handed out again, so a program that makes arrays of the
// same sizes every step stops paying for fresh pages (a 64 MiB array costs
// 16k page faults when it comes fresh from mmap).
#pragma once

#include <array>
#include <cstddef>
#include <new>

// The size classes and the shared free lists are the sim device's pool.
#include "../../engine/src/block_cache.hpp"

namespace lazydag::detail {

class HostPool {
 public:
  /// Cached (free) bytes beyond this are returned to the system at once.
  static constexpr std::size_t kCacheLimit = std::size_t{1} << 30;

  /// Never destroyed: buffers may come back from ops that the engine runs
  /// during static destruction (the engine's destructor runs what is
  /// recorded), after a function-local static pool would be gone.
  static HostPool& get() {
    static HostPool* pool = new HostPool();
    return *pool;
  }

  /// The size class of a request: 64-byte granules up to 4 KiB, then four
  /// classes per power of two (at most 25% slack).
  static std::size_t size_class(std::size_t n) { return engine::detail::BlockCache::size_class(n); }

  /// A 64-byte aligned buffer of at least size_class(n) bytes. Thread-safe.
  void* allocate(std::size_t n) {
    const std::size_t c = size_class(n);
    if (c <= kSmall) {
      if (ThreadCache* t = ThreadCache::mine(); t != nullptr) {
        if (void* p = t->take(c); p != nullptr) return p;
      }
    }
    void* p = shared_.allocate(c);  // trims its cache and retries once when the system has none
    if (p == nullptr) throw std::bad_alloc();
    return p;
  }

  /// Returns a buffer from allocate(n). Thread-safe.
  void release(void* p, std::size_t n) {
    const std::size_t c = size_class(n);
    if (c <= kSmall) {
      if (ThreadCache* t = ThreadCache::mine(); t != nullptr && t->put(p, c)) return;
    }
    release_shared(p, c);
  }

  /// Frees every buffer of the shared cache, and of the calling thread's.
  void trim() {
    if (ThreadCache* t = ThreadCache::mine(); t != nullptr) t->flush();
    shared_.trim();
  }

  /// Bytes of the shared cache (each thread keeps up to kThreadCacheBytes
  /// of small buffers besides).
  [[nodiscard]] std::size_t cached_bytes() const { return shared_.cached(); }

  /// Buffers of at most kSmall bytes are also cached per thread, up to
  /// kPerClass of a size class and kThreadCacheBytes in all: a tiny op's
  /// output then comes and goes without the lock and the map (perf of
  /// 10,000 one-element x + 1 put 8.6% of samples in that lock).
  static constexpr std::size_t kSmall = 4096;
  static constexpr std::size_t kPerClass = 16;
  static constexpr std::size_t kThreadCacheBytes = std::size_t{64} << 10;

 private:
  HostPool() = default;

  // The calling thread's small buffers. Trivially reachable to the end of
  // the thread: after its destructor has run (the engine runs what is still
  // recorded when the process exits, after the main thread's thread_local
  // objects are gone) mine() returns null and the shared cache is used.
  class ThreadCache {
   public:
    static ThreadCache* mine() {
      if (gone()) return nullptr;
      thread_local ThreadCache t;
      return &t;
    }
    ThreadCache() = default;
    ThreadCache(const ThreadCache&) = delete;
    ThreadCache& operator=(const ThreadCache&) = delete;
    ~ThreadCache() {
      gone() = true;
      flush();
    }
    void* take(std::size_t c) {
      List& l = lists_[c / 64 - 1];
      if (l.n == 0) return nullptr;
      bytes_ -= c;
      return l.p[--l.n];
    }
    bool put(void* p, std::size_t c) {
      List& l = lists_[c / 64 - 1];
      if (l.n == kPerClass || bytes_ + c > kThreadCacheBytes) return false;
      l.p[l.n++] = p;
      bytes_ += c;
      return true;
    }
    /// Hands every buffer to the shared cache.
    void flush() {
      for (std::size_t k = 0; k < lists_.size(); ++k) {
        List& l = lists_[k];
        while (l.n > 0) HostPool::get().release_shared(l.p[--l.n], (k + 1) * 64);
      }
      bytes_ = 0;
    }

   private:
    static bool& gone() {
      thread_local bool g = false;  // trivially destructible: usable to the end
      return g;
    }
    struct List {
      std::array<void*, kPerClass> p{};
      std::size_t n = 0;
    };
    std::array<List, kSmall / 64> lists_{};
    std::size_t bytes_ = 0;
  };

  void release_shared(void* p, std::size_t c) { shared_.deallocate(p, c); }

  // The cache shared by all threads: the sim device's pool, with this
  // pool's limit (kept under AddressSanitizer too).
  engine::detail::BlockCache shared_{kCacheLimit};
};

}  // namespace lazydag::detail
