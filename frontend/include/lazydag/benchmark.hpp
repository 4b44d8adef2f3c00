// Benchmark: an RAII timer that waits for all recorded work before it
// stops, so it measures the computation and not just the enqueue.
#pragma once

#include <chrono>
#include <iostream>
#include <string>

namespace lazydag {

/// `{ Benchmark b("matmul"); ... }` prints "matmul: 0.0123 sec" when the
/// scope ends, after nd::waitall(). The destructor blocks; an OpError from
/// the wait is printed instead of thrown.
class Benchmark {
 public:
  explicit Benchmark(std::string name, std::ostream& out = std::cout);
  ~Benchmark();
  Benchmark(const Benchmark&) = delete;
  Benchmark& operator=(const Benchmark&) = delete;

  /// Blocks: waits for all recorded work, then returns the seconds so far.
  [[nodiscard]] double elapsed() const;

 private:
  std::string name_;
  std::ostream& out_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace lazydag
