// InlineVector: std::vector's interface for trivially copyable elements,
// with the first N held inside the object. Shapes and strides are
// InlineVectors: an array of rank <= kMaxRank carries them without a heap
// allocation, so recording an op and viewing its operands allocate nothing
// for them. Written here rather than taken from Boost.Container because its
// iterators must be plain pointers: std::span<const T> (what every shape
// function takes) is constructible only from contiguous ranges, which
// Boost 1.74's small_vector iterators do not declare themselves to be.
#pragma once

#include <algorithm>
#include <compare>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <new>
#include <stdexcept>
#include <type_traits>
#include <vector>

namespace lazydag {

template <class T, std::size_t N>
class InlineVector {
  static_assert(std::is_trivially_copyable_v<T> && std::is_trivially_destructible_v<T>,
                "InlineVector holds trivially copyable elements");

 public:
  using value_type = T;
  using size_type = std::size_t;
  using difference_type = std::ptrdiff_t;
  using reference = T&;
  using const_reference = const T&;
  using pointer = T*;
  using const_pointer = const T*;
  using iterator = T*;
  using const_iterator = const T*;
  using reverse_iterator = std::reverse_iterator<iterator>;
  using const_reverse_iterator = std::reverse_iterator<const_iterator>;

  InlineVector() noexcept = default;
  explicit InlineVector(size_type n) { resize(n); }
  InlineVector(size_type n, const T& v) { assign(n, v); }
  template <class It, class = std::enable_if_t<!std::is_integral_v<It>>>
  InlineVector(It first, It last) {
    assign(first, last);
  }
  InlineVector(std::initializer_list<T> l) { assign(l.begin(), l.end()); }
  InlineVector(const std::vector<T>& v) { assign(v.begin(), v.end()); }  // NOLINT: a drop-in for std::vector
  InlineVector(const InlineVector& o) { assign(o.begin(), o.end()); }
  InlineVector(InlineVector&& o) noexcept { take(o); }
  InlineVector& operator=(const InlineVector& o) {
    if (this != &o) assign(o.begin(), o.end());
    return *this;
  }
  InlineVector& operator=(InlineVector&& o) noexcept {
    if (this != &o) {
      release();
      take(o);
    }
    return *this;
  }
  InlineVector& operator=(std::initializer_list<T> l) {
    assign(l.begin(), l.end());
    return *this;
  }
  ~InlineVector() { release(); }

  /// A std::vector with the same elements.
  [[nodiscard]] std::vector<T> to_vector() const { return std::vector<T>(begin(), end()); }
  explicit operator std::vector<T>() const { return to_vector(); }

  void assign(size_type n, const T& v) {
    const T copy = v;  // v may live here
    size_ = 0;
    reserve(n);
    std::fill_n(data_, n, copy);
    size_ = n;
  }
  template <class It, class = std::enable_if_t<!std::is_integral_v<It>>>
  void assign(It first, It last) {
    if constexpr (std::is_base_of_v<std::forward_iterator_tag, typename std::iterator_traits<It>::iterator_category>) {
      const auto n = static_cast<size_type>(std::distance(first, last));
      if (n > cap_) {
        InlineVector fresh;  // the source may be this vector's own elements
        fresh.reserve(n);
        std::copy(first, last, fresh.data_);
        fresh.size_ = n;
        *this = std::move(fresh);
        return;
      }
      // n fits: copy forward (a source inside this vector starts at or after data_)
      T* out = data_;
      for (; first != last; ++first) *out++ = *first;
      size_ = n;
    } else {
      clear();
      for (; first != last; ++first) push_back(*first);
    }
  }
  void assign(std::initializer_list<T> l) { assign(l.begin(), l.end()); }

  [[nodiscard]] reference operator[](size_type i) noexcept { return data_[i]; }
  [[nodiscard]] const_reference operator[](size_type i) const noexcept { return data_[i]; }
  [[nodiscard]] reference at(size_type i) {
    if (i >= size_) throw std::out_of_range("InlineVector::at");
    return data_[i];
  }
  [[nodiscard]] const_reference at(size_type i) const {
    if (i >= size_) throw std::out_of_range("InlineVector::at");
    return data_[i];
  }
  [[nodiscard]] reference front() noexcept { return data_[0]; }
  [[nodiscard]] const_reference front() const noexcept { return data_[0]; }
  [[nodiscard]] reference back() noexcept { return data_[size_ - 1]; }
  [[nodiscard]] const_reference back() const noexcept { return data_[size_ - 1]; }
  [[nodiscard]] T* data() noexcept { return data_; }
  [[nodiscard]] const T* data() const noexcept { return data_; }

  [[nodiscard]] iterator begin() noexcept { return data_; }
  [[nodiscard]] const_iterator begin() const noexcept { return data_; }
  [[nodiscard]] const_iterator cbegin() const noexcept { return data_; }
  [[nodiscard]] iterator end() noexcept { return data_ + size_; }
  [[nodiscard]] const_iterator end() const noexcept { return data_ + size_; }
  [[nodiscard]] const_iterator cend() const noexcept { return data_ + size_; }
  [[nodiscard]] reverse_iterator rbegin() noexcept { return reverse_iterator(end()); }
  [[nodiscard]] const_reverse_iterator rbegin() const noexcept { return const_reverse_iterator(end()); }
  [[nodiscard]] reverse_iterator rend() noexcept { return reverse_iterator(begin()); }
  [[nodiscard]] const_reverse_iterator rend() const noexcept { return const_reverse_iterator(begin()); }

  [[nodiscard]] bool empty() const noexcept { return size_ == 0; }
  [[nodiscard]] size_type size() const noexcept { return size_; }
  [[nodiscard]] size_type capacity() const noexcept { return cap_; }
  void reserve(size_type n) {
    if (n <= cap_) return;
    const size_type cap = std::max(n, cap_ * 2);
    T* fresh = static_cast<T*>(::operator new(cap * sizeof(T)));
    if (size_ != 0) std::memcpy(fresh, data_, size_ * sizeof(T));
    release();
    data_ = fresh;
    cap_ = cap;
  }
  void shrink_to_fit() noexcept {}
  void clear() noexcept { size_ = 0; }

  void push_back(const T& v) {
    const T copy = v;  // v may live here
    reserve(size_ + 1);
    data_[size_++] = copy;
  }
  template <class... A>
  reference emplace_back(A&&... a) {
    push_back(T(std::forward<A>(a)...));
    return back();
  }
  void pop_back() noexcept { --size_; }
  void resize(size_type n) { resize(n, T{}); }
  void resize(size_type n, const T& v) {
    const T copy = v;
    reserve(n);
    if (n > size_) std::fill(data_ + size_, data_ + n, copy);
    size_ = n;
  }

  iterator insert(const_iterator pos, const T& v) { return insert(pos, size_type{1}, v); }
  iterator insert(const_iterator pos, size_type n, const T& v) {
    const T copy = v;
    const size_type at = static_cast<size_type>(pos - data_);
    reserve(size_ + n);
    std::memmove(data_ + at + n, data_ + at, (size_ - at) * sizeof(T));
    std::fill_n(data_ + at, n, copy);
    size_ += n;
    return data_ + at;
  }
  template <class It, class = std::enable_if_t<!std::is_integral_v<It>>>
  iterator insert(const_iterator pos, It first, It last) {
    const size_type at = static_cast<size_type>(pos - data_);
    const InlineVector add(first, last);  // the source may be this vector's own elements
    reserve(size_ + add.size_);
    std::memmove(data_ + at + add.size_, data_ + at, (size_ - at) * sizeof(T));
    if (add.size_ != 0) std::memcpy(data_ + at, add.data_, add.size_ * sizeof(T));
    size_ += add.size_;
    return data_ + at;
  }
  iterator insert(const_iterator pos, std::initializer_list<T> l) { return insert(pos, l.begin(), l.end()); }
  iterator erase(const_iterator pos) { return erase(pos, pos + 1); }
  iterator erase(const_iterator first, const_iterator last) {
    const size_type at = static_cast<size_type>(first - data_);
    const size_type n = static_cast<size_type>(last - first);
    std::memmove(data_ + at, data_ + at + n, (size_ - at - n) * sizeof(T));
    size_ -= n;
    return data_ + at;
  }
  void swap(InlineVector& o) noexcept {
    InlineVector t(std::move(o));
    o = std::move(*this);
    *this = std::move(t);
  }

  friend bool operator==(const InlineVector& a, const InlineVector& b) noexcept {
    return a.size_ == b.size_ && std::equal(a.begin(), a.end(), b.begin());
  }
  friend auto operator<=>(const InlineVector& a, const InlineVector& b) noexcept {
    return std::lexicographical_compare_three_way(a.begin(), a.end(), b.begin(), b.end());
  }

 private:
  bool on_heap() const noexcept { return data_ != inline_; }
  void release() noexcept {
    if (on_heap()) {
      ::operator delete(data_);
      data_ = inline_;
      cap_ = N;
    }
  }
  // Takes o's elements; o is left empty and inline. This vector is inline.
  void take(InlineVector& o) noexcept {
    if (o.on_heap()) {
      data_ = o.data_;
      cap_ = o.cap_;
      o.data_ = o.inline_;
      o.cap_ = N;
    } else {
      data_ = inline_;
      cap_ = N;
      if (o.size_ != 0) std::memcpy(inline_, o.inline_, o.size_ * sizeof(T));
    }
    size_ = o.size_;
    o.size_ = 0;
  }

  T* data_ = inline_;
  size_type size_ = 0;
  size_type cap_ = N;
  T inline_[N];
};

/// std::erase and std::erase_if for InlineVector (found by ADL).
template <class T, std::size_t N, class U>
std::size_t erase(InlineVector<T, N>& c, const U& value) {
  auto it = std::remove(c.begin(), c.end(), value);
  const auto n = static_cast<std::size_t>(c.end() - it);
  c.erase(it, c.end());
  return n;
}
template <class T, std::size_t N, class P>
std::size_t erase_if(InlineVector<T, N>& c, P pred) {
  auto it = std::remove_if(c.begin(), c.end(), pred);
  const auto n = static_cast<std::size_t>(c.end() - it);
  c.erase(it, c.end());
  return n;
}

}  // namespace lazydag
