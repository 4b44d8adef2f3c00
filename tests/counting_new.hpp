// Allocations through the global operator new, counted per thread: a test
// executable that compiles tests/counting_new.cpp replaces operator new with
// malloc plus a count of the calling thread's allocations while it counts.
#pragma once

namespace lazydag::test {

namespace counting_new {
void start();  // this thread's count from 0
long stop();   // this thread's count since start()
}  // namespace counting_new

/// Allocations made by this thread while fn runs.
template <class Fn>
long allocations_in(Fn fn) {
  counting_new::start();
  fn();
  return counting_new::stop();
}

}  // namespace lazydag::test
