// A vector of trivially copyable values with N inline slots: node edge and
// var lists stay off the heap in the common case.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <new>
#include <type_traits>

namespace lazydag::engine::detail {

template <class T, std::uint32_t N>
class SmallVector {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  SmallVector() noexcept = default;
  SmallVector(const SmallVector&) = delete;
  SmallVector& operator=(const SmallVector&) = delete;
  ~SmallVector() { release_heap(); }

  void push_back(T v) {
    if (size_ == cap_) grow();
    data_[size_++] = v;
  }
  void clear() noexcept { size_ = 0; }
  T& back() noexcept { return data_[size_ - 1]; }
  void pop_back() noexcept { --size_; }
  /// Drops a large heap buffer so a recycled owner does not keep it.
  void shrink_if_large(std::uint32_t limit) noexcept {
    if (cap_ > limit) {
      release_heap();
      data_ = inline_;
      cap_ = N;
    }
    size_ = 0;
  }
  void resize_down(std::uint32_t n) noexcept { size_ = n; }
  [[nodiscard]] std::uint32_t size() const noexcept { return size_; }
  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  T& operator[](std::uint32_t i) noexcept { return data_[i]; }
  const T& operator[](std::uint32_t i) const noexcept { return data_[i]; }
  T* begin() noexcept { return data_; }
  T* end() noexcept { return data_ + size_; }
  const T* begin() const noexcept { return data_; }
  const T* end() const noexcept { return data_ + size_; }
  [[nodiscard]] bool contains(T v) const noexcept {
    for (std::uint32_t i = 0; i < size_; ++i) {
      if (data_[i] == v) return true;
    }
    return false;
  }

 private:
  void grow() {
    std::uint32_t cap = cap_ * 2;
    T* p = static_cast<T*>(std::malloc(sizeof(T) * cap));
    if (p == nullptr) throw std::bad_alloc();
    std::memcpy(p, data_, sizeof(T) * size_);
    release_heap();
    data_ = p;
    cap_ = cap;
  }
  void release_heap() noexcept {
    if (data_ != inline_) std::free(data_);
  }

  T inline_[N];
  T* data_ = inline_;
  std::uint32_t size_ = 0;
  std::uint32_t cap_ = N;
};

}  // namespace lazydag::engine::detail
