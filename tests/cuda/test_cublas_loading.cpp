// cuBLAS is loaded by the first GPU matmul, not at process start: a process
// that never multiplies on a GPU never maps it. Linked, its initialisers
// made every program linked against lazydag take about 0.4 s to start.
// Needs the CUDA toolkit's libraries, not a GPU.
#include <doctest/doctest.h>

#include <lazydag/lazydag.hpp>
#include <lazydag/ops/kernels.hpp>

#include <fstream>
#include <string>

using namespace lazydag;

namespace {

// Whether a file whose name contains `name` is mapped into this process.
bool mapped(const std::string& name) {
  std::ifstream maps("/proc/self/maps");
  REQUIRE(maps.good());
  std::string line;
  while (std::getline(maps, line)) {
    if (line.find(name) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("Cuda.CublasIsLoadedByItsFirstUse") {
  // The whole stack at work on the CPU first, a matmul included.
  const NDArray a = nd::random_uniform({64, 64}, cpu(), 1);
  const float s = nd::matmul(a, a).sum().item<float>();
  CHECK(s > 0);
  CHECK_FALSE(mapped("libcublas.so"));
  CHECK_FALSE(mapped("libcublasLt.so"));

  const std::string path = ops::cuda::load_blas();
  INFO("loaded: " << path);
  CHECK(path.find("libcublas.so.") != std::string::npos);
  CHECK(mapped("libcublas.so"));
  CHECK(ops::cuda::load_blas() == path);  // loaded once
}
