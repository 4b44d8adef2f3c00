// The replacement global allocation functions of tests/counting_new.hpp:
// malloc (aligned_alloc for over-aligned types) plus a count of the calling
// thread's allocations while it counts. The array and nothrow forms of the
// standard library forward to these.
#include "counting_new.hpp"

#include <algorithm>
#include <cstdlib>
#include <new>

// The replacement pair below is malloc/free underneath, which GCC's
// -Wmismatched-new-delete cannot see through once it inlines them.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace {
// This file's alone: other files reach them through start() and stop().
// Thread local: threads allocating at the same time are not counted, and
// the counter needs no synchronisation.
thread_local bool t_counting = false;
thread_local long t_allocations = 0;

void* allocate(std::size_t n, std::size_t align) {
  if (t_counting) ++t_allocations;
  n = std::max<std::size_t>(n, 1);
  // aligned_alloc wants a size that is a multiple of the alignment
  void* p = align <= __STDCPP_DEFAULT_NEW_ALIGNMENT__ ? std::malloc(n)
                                                      : std::aligned_alloc(align, (n + align - 1) / align * align);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
}  // namespace

namespace lazydag::test::counting_new {
void start() {
  t_allocations = 0;
  t_counting = true;
}
long stop() {
  t_counting = false;
  return t_allocations;
}
}  // namespace lazydag::test::counting_new

void* operator new(std::size_t n) { return allocate(n, 0); }
void* operator new(std::size_t n, std::align_val_t a) { return allocate(n, static_cast<std::size_t>(a)); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
