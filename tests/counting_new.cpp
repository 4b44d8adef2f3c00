// The replacement operator new and delete of tests/counting_new.hpp.
#include "counting_new.hpp"

#include <cstdlib>
#include <new>

// The replacement pair below is malloc/free underneath, which GCC's
// -Wmismatched-new-delete cannot see through once it inlines them.
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"

namespace {
// This file's alone: other files reach them through start() and stop().
thread_local bool t_counting = false;
thread_local long t_allocations = 0;
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

void* operator new(std::size_t n) {
  if (t_counting) ++t_allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
