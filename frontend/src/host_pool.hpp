// A caching pool for array storage on the host: freed buffers are kept by
// size class and handed out again, so a program that makes arrays of the
// same sizes every step stops paying for fresh pages (a 64 MiB array costs
// 16k page faults when it comes fresh from mmap).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <new>
#include <vector>

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
  static std::size_t size_class(std::size_t n) {
    n = n == 0 ? 64 : n;
    if (n <= 4096) return (n + 63) / 64 * 64;
    std::size_t p = 4096;
    while (p * 2 < n) p *= 2;
    const std::size_t step = p / 4;
    return (n + step - 1) / step * step;
  }

  /// A 64-byte aligned buffer of at least size_class(n) bytes. Thread-safe.
  void* allocate(std::size_t n) {
    const std::size_t c = size_class(n);
    {
      std::lock_guard lk(mu_);
      auto it = free_.find(c);
      if (it != free_.end() && !it->second.empty()) {
        void* p = it->second.back();
        it->second.pop_back();
        cached_ -= c;
        return p;
      }
    }
    void* p = std::aligned_alloc(64, c);
    if (p == nullptr) {
      trim();  // give the cache back and try once more
      p = std::aligned_alloc(64, c);
      if (p == nullptr) throw std::bad_alloc();
    }
    return p;
  }

  /// Returns a buffer from allocate(n). Thread-safe.
  void release(void* p, std::size_t n) {
    const std::size_t c = size_class(n);
    {
      std::lock_guard lk(mu_);
      if (cached_ + c <= kCacheLimit) {
        free_[c].push_back(p);
        cached_ += c;
        return;
      }
    }
    std::free(p);
  }

  /// Frees every cached buffer.
  void trim() {
    std::map<std::size_t, std::vector<void*>> drop;
    {
      std::lock_guard lk(mu_);
      drop.swap(free_);
      cached_ = 0;
    }
    for (auto& [c, v] : drop) {
      for (void* p : v) std::free(p);
    }
  }

  [[nodiscard]] std::size_t cached_bytes() {
    std::lock_guard lk(mu_);
    return cached_;
  }

 private:
  HostPool() = default;
  std::mutex mu_;
  std::map<std::size_t, std::vector<void*>> free_;
  std::size_t cached_ = 0;
};

}  // namespace lazydag::detail
