// Per-thread free lists for the two objects every NDArray op makes: its
// result's ArrayState and Storage (each with its shared_ptr control block,
// made by std::allocate_shared with PoolAllocator). A tiny op otherwise
// paid two mallocs and two frees, a tenth of its cost, and the frees often
// went through glibc's arena lock of another thread.
//
// A block freed on a thread goes to that thread's list (up to kMaxCached per
// size, then to the system); memory never moves back, which is harmless
// because blocks are freed mostly where they are made (the engine destroys
// an op's captures on a frontend thread). A block freed after its thread's
// list was destroyed (at thread exit) goes to the system. Under
// AddressSanitizer every block comes from and goes to the system, so a use
// after free is still reported.
#pragma once

#include <cstddef>
#include <memory>
#include <new>
#include <utility>

namespace lazydag::detail {

#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kPoolObjects = false;
#else
inline constexpr bool kPoolObjects = true;
#endif

namespace object_pool {

inline constexpr std::size_t kMaxCached = 4096;

// Trivially destructible: still readable while other thread_local objects
// of the exiting thread are destroyed.
inline thread_local bool t_lists_gone = false;

template <std::size_t Size>
class FreeList {
 public:
  ~FreeList() {
    t_lists_gone = true;
    while (head_ != nullptr) {
      Link* l = head_;
      head_ = l->next;
      ::operator delete(l, Size);
    }
  }
  void* take() noexcept {
    Link* l = head_;
    if (l == nullptr) return nullptr;
    head_ = l->next;
    --count_;
    return l;
  }
  bool give(void* p) noexcept {
    if (count_ >= kMaxCached) return false;
    auto* l = static_cast<Link*>(p);
    l->next = head_;
    head_ = l;
    ++count_;
    return true;
  }

 private:
  struct Link {
    Link* next;
  };
  Link* head_ = nullptr;
  std::size_t count_ = 0;
};

template <std::size_t Size>
FreeList<Size>& list() noexcept {
  thread_local FreeList<Size> l;
  return l;
}

}  // namespace object_pool

/// An allocator for std::allocate_shared: single objects come from the
/// calling thread's free list of their size.
template <class T>
struct PoolAllocator {
  using value_type = T;
  PoolAllocator() noexcept = default;
  template <class U>
  PoolAllocator(const PoolAllocator<U>&) noexcept {}  // NOLINT: rebinding is implicit

  T* allocate(std::size_t n) {
    if constexpr (kPoolObjects && alignof(T) <= alignof(std::max_align_t)) {
      if (n == 1 && !object_pool::t_lists_gone) {
        if (void* p = object_pool::list<sizeof(T)>().take()) return static_cast<T*>(p);
      }
    }
    return static_cast<T*>(::operator new(n * sizeof(T)));
  }
  void deallocate(T* p, std::size_t n) noexcept {
    if constexpr (kPoolObjects && alignof(T) <= alignof(std::max_align_t)) {
      if (n == 1 && !object_pool::t_lists_gone && object_pool::list<sizeof(T)>().give(p)) return;
    }
    ::operator delete(p, n * sizeof(T));
  }
  template <class U>
  bool operator==(const PoolAllocator<U>&) const noexcept {
    return true;
  }
};

/// std::make_shared through the pool.
template <class T, class... Args>
std::shared_ptr<T> make_pooled(Args&&... args) {
  return std::allocate_shared<T>(PoolAllocator<T>(), std::forward<Args>(args)...);
}

}  // namespace lazydag::detail
