// Allocations through the global operator new, counted per thread: a test
// executable that compiles tests/counting_new.cpp replaces operator new with
// malloc plus a count of the calling thread's allocations while it counts.
#pragma once

namespace lazydag::test {

namespace counting_new {
extern thread_local bool counting;
extern thread_local long allocations;
}  // namespace counting_new

/// Allocations made by this thread while fn runs.
template <class Fn>
long allocations_in(Fn fn) {
  counting_new::allocations = 0;
  counting_new::counting = true;
  fn();
  counting_new::counting = false;
  return counting_new::allocations;
}

}  // namespace lazydag::test
