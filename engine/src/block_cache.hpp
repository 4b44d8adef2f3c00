// BlockCache: the memory pool of an emulated device (and the shared part of
// the frontend's host pool, frontend/src/host_pool.hpp). Freed blocks are kept
// by size class and handed out again, as a GPU's stream-ordered pool keeps
// them (the CUDA device sets its pool's release threshold to the maximum):
// a device that makes arrays of the same sizes every step stops paying for
// the allocator's trimming and regrowing, which on every 36 KiB result of a
// small matmul chain cost a page fault per page touched.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

namespace lazydag::engine::detail {

class BlockCache {
 public:
  /// Free bytes a device keeps at most; beyond it a freed block goes back
  /// at once. None under AddressSanitizer, so that it still catches a use
  /// of device memory after its free.
#if defined(__SANITIZE_ADDRESS__)
  static constexpr std::size_t kDefaultLimit = 0;
#else
  static constexpr std::size_t kDefaultLimit = std::size_t{256} << 20;
#endif

  explicit BlockCache(std::size_t limit = kDefaultLimit) : limit_(limit) {}
  ~BlockCache() { trim(); }
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  /// The bytes a request of `n` takes: 64-byte granules up to 4 KiB, then
  /// four classes per power of two (at most 25% slack).
  static std::size_t size_class(std::size_t n) noexcept {
    n = n == 0 ? 64 : n;
    if (n <= 4096) return (n + 63) / 64 * 64;
    std::size_t p = 4096;
    while (p * 2 < n) p *= 2;
    const std::size_t step = p / 4;
    return (n + step - 1) / step * step;
  }

  /// A 64-byte aligned block of size_class(n) bytes, or null when the
  /// system has none. Thread-safe.
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
    }
    return p;
  }

  /// Returns a block of allocate(n). Thread-safe.
  void deallocate(void* p, std::size_t n) noexcept {
    if (p == nullptr) return;
    const std::size_t c = size_class(n);
    {
      std::lock_guard lk(mu_);
      if (cached_ + c <= limit_) {
        try {
          free_[c].push_back(p);
          cached_ += c;
          return;
        } catch (...) {  // no memory to remember it: it goes back instead
        }
      }
    }
    std::free(p);
  }

  /// Frees every cached block. Thread-safe.
  void trim() noexcept {
    std::map<std::size_t, std::vector<void*>> all;
    {
      std::lock_guard lk(mu_);
      all.swap(free_);
      cached_ = 0;
    }
    for (auto& [c, blocks] : all) {
      for (void* p : blocks) std::free(p);
    }
  }

  [[nodiscard]] std::size_t limit() const noexcept { return limit_; }
  /// Free bytes kept now.
  [[nodiscard]] std::size_t cached() const {
    std::lock_guard lk(mu_);
    return cached_;
  }

 private:
  const std::size_t limit_;
  mutable std::mutex mu_;
  std::map<std::size_t, std::vector<void*>> free_;
  std::size_t cached_ = 0;
};

}  // namespace lazydag::engine::detail
