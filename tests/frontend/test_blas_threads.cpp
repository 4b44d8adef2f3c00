// OpenBLAS's pthread build starts idle server threads when it is loaded,
// which poll for work before they sleep; the frontend stops them when it
// first uses the engine, and a threaded BLAS call still gets them back.
#include <doctest/doctest.h>

#include <lazydag/lazydag.hpp>
#include <lazydag/ops/kernels.hpp>

#include <cblas.h>

#include <filesystem>
#include <random>
#include <vector>

using namespace lazydag;

namespace {

std::ptrdiff_t threads_of_this_process() {
  return std::distance(std::filesystem::directory_iterator("/proc/self/task"), std::filesystem::directory_iterator{});
}

}  // namespace

TEST_CASE("Blas.IdleServerThreadsAreStoppedAndComeBackWhenNeeded") {
  // Nothing of the engine has run yet in this program: the threads now are
  // the main thread and OpenBLAS's servers (one per core but one).
  const int blas_threads = openblas_get_num_threads();
  const std::ptrdiff_t before = threads_of_this_process();
  (void)nd::engine();  // its first use stops them
  CHECK(threads_of_this_process() == before - (blas_threads - 1));
  ops::cpu::stop_idle_blas_threads();  // once only: nothing more happens
  CHECK(threads_of_this_process() == before - (blas_threads - 1));

  // A product through OpenBLAS on every core still computes, against a
  // plain loop on random data.
  const int n = 96;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> a(n * n), b(n * n), c(n * n), ref(n * n, 0.0F);
  for (float& v : a) v = u(rng);
  for (float& v : b) v = u(rng);
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < n; ++k) {
      for (int j = 0; j < n; ++j) ref[i * n + j] += a[i * n + k] * b[k * n + j];
    }
  }
  // Not under ThreadSanitizer: OpenBLAS (not instrumented) hands the blocks
  // to its threads by flags TSan cannot see, and a suppression of OpenBLAS
  // would also hide races around the engine's own products.
#if defined(__SANITIZE_THREAD__)
  openblas_set_num_threads(1);
#else
  openblas_set_num_threads(blas_threads);
#endif
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0F, a.data(), n, b.data(), n, 0.0F, c.data(), n);
  for (int i = 0; i < n * n; ++i) CHECK(c[i] == doctest::Approx(ref[i]).epsilon(1e-4));
  // And the engine's own products, which set BLAS to one thread again.
  const NDArray x = nd::random_uniform({64, 64}, cpu(), 1);
  const auto m = nd::matmul(x, x).to_vector<float>();
  const auto xv = x.to_vector<float>();
  double want = 0;
  for (int k = 0; k < 64; ++k) want += static_cast<double>(xv[k]) * xv[k * 64];
  CHECK(m[0] == doctest::Approx(want).epsilon(1e-5));
}
