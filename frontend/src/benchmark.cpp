// Benchmark: an RAII timer that waits for all recorded work before it stops.
#include <lazydag/benchmark.hpp>
#include <lazydag/ndarray.hpp>

#include <cstdio>

namespace lazydag {

Benchmark::Benchmark(std::string name, std::ostream& out)
    : name_(std::move(name)), out_(out), start_(std::chrono::steady_clock::now()) {}

double Benchmark::elapsed() const {
  nd::waitall();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
}

Benchmark::~Benchmark() {
  try {
    const double t = elapsed();
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.4f", t);
    out_ << name_ << ": " << buf << " sec\n";
  } catch (const std::exception& e) {
    out_ << name_ << ": failed: " << e.what() << '\n';
  }
}

}  // namespace lazydag
