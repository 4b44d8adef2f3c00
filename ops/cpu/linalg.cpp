// CPU matmul through oneDNN's sgemm (float32, when built with it) or CBLAS
// (OpenBLAS), reading transposed and sliced operands in place (trans flags
// and leading dimensions).
//
// Why oneDNN for float32: it picks its kernels by the CPU's features at
// run time, on any x86-64 CPU. OpenBLAS picks by CPU model, or as the
// environment's OPENBLAS_CORETYPE says; the development machine (an AMD
// CPU with AVX-512) sets Haswell there, i.e. AVX2 kernels. Single-threaded
// on that machine, a 64x256 by 256x512 product took 181 us through OpenBLAS
// as configured, 102-117 us through oneDNN, and 111-120 us through OpenBLAS
// left to detect the CPU itself (its AVX-512 kernels): oneDNN is as fast as
// OpenBLAS at its best, whatever OpenBLAS was told. float64 stays on
// OpenBLAS: oneDNN has no dgemm.
//
// The BLAS runs single-threaded here and a large product is split into
// fixed blocks of 64 rows run as oneTBB tasks: the engine's workers are the
// only threads, so BLAS never oversubscribes the cores, and the split does
// not depend on the thread count (deterministic).
#include <cblas.h>
#if defined(LAZYDAG_ONEDNN)
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#endif

#include <lazydag/ops/shape.hpp>

#include <atomic>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <type_traits>

#include "iterate.hpp"

namespace lazydag::ops::cpu {

namespace {

constexpr std::int64_t kRowBlock = 64;
// Below this many multiply-adds a product runs as one BLAS call.
constexpr std::int64_t kParallelFlops = 1 << 21;

void single_threaded_blas() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

}  // namespace
}  // namespace lazydag::ops::cpu

// OpenBLAS's own (common_thread.h), exported by its pthread build, whose
// fork handler calls it: stops its server threads, which its next threaded
// call starts again. Weak: the serial and OpenMP builds have none.
extern "C" __attribute__((weak)) int blas_thread_shutdown_(void);

namespace lazydag::ops::cpu {

// OpenBLAS's pthread build starts a server thread per core but one when it
// is loaded, and each polls for work (sched_yield in a loop) for about
// 0.1 s of CPU before it sleeps: in every process linked against lazydag,
// a core taken from the engine at start, where a benchmark's first
// figures are measured. The engine never needs them (BLAS runs
// single-threaded here, see above).
void stop_idle_blas_threads() noexcept {
  static std::atomic<bool> done{false};
  if (done.exchange(true, std::memory_order_relaxed)) return;
  if (blas_thread_shutdown_ != nullptr) (void)blas_thread_shutdown_();
}

namespace {

#if defined(LAZYDAG_ONEDNN)
// oneDNN generates its sgemm kernels at its first call (about 50 ms) and
// keeps them in function-local statics. Static objects made after the
// engine's exit handler was registered are destroyed before it runs, so a
// product still recorded at exit would run freed kernels, and a first call
// still under way when the process exits has its statics destroyed under
// it; a first call made during exit faulted too. So:
//  - the first call is made by prepare_matmul, on the thread that records a
//    product, before that product is pushed, never inside a running node
//    or during exit, over the operand layouts and the small shapes oneDNN
//    has paths of its own for;
//  - then a handler that turns oneDNN off is registered, and the engine's
//    exit handler again: at exit the engine runs what is recorded, oneDNN
//    is turned off, its statics are destroyed, and products recorded after
//    that (by later exit handlers, say) go through CBLAS.
// Until prepare_matmul has run, CBLAS computes.
std::atomic<bool> g_onednn_ready{false};
#endif

// C (m x n, row-major, leading dimension n) = op(A) op(B), each operand as
// gemm_layout describes it (trans: stored transposed, ld its leading dim).
template <class T>
void gemm(std::int64_t m, std::int64_t n, std::int64_t k, const T* a, const GemmLayout& la, const T* b,
          const GemmLayout& lb, T* c) {
  const auto M = static_cast<blasint>(m);
  const auto N = static_cast<blasint>(n);
  const auto K = static_cast<blasint>(k);
  const CBLAS_TRANSPOSE ta = la.trans ? CblasTrans : CblasNoTrans;
  const CBLAS_TRANSPOSE tb = lb.trans ? CblasTrans : CblasNoTrans;
  const auto lda = static_cast<blasint>(la.ld);
  const auto ldb = static_cast<blasint>(lb.ld);
  if constexpr (std::is_same_v<T, float>) {
#if defined(LAZYDAG_ONEDNN)
    // oneDNN sizes its team by the calling thread's OpenMP thread count (a
    // per-thread setting): one here, the caller's restored after.
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    const bool ok = g_onednn_ready.load(std::memory_order_acquire) &&
                    dnnl_sgemm(la.trans ? 'T' : 'N', lb.trans ? 'T' : 'N', m, n, k, 1.0F, a, la.ld, b, lb.ld, 0.0F,
                               c, n) == dnnl_success;
    omp_set_num_threads(threads);
    if (ok) return;
    // Not prepared (no product recorded through the frontend yet, or the
    // first one recorded during exit), or refused (only what CBLAS would
    // refuse; the frontend checks the sizes first): CBLAS.
#endif
    cblas_sgemm(CblasRowMajor, ta, tb, M, N, K, 1.0F, a, lda, b, ldb, 0.0F, c, N);
  } else {
    cblas_dgemm(CblasRowMajor, ta, tb, M, N, K, 1.0, a, lda, b, ldb, 0.0, c, N);
  }
}

}  // namespace

void prepare_matmul(DType t) {
#if defined(LAZYDAG_ONEDNN)
  if (t != DType::kFloat32 || g_onednn_ready.load(std::memory_order_acquire) || engine::Engine::exiting() ||
      engine::Engine::in_node()) {
    return;
  }
  static std::once_flag once;
  std::call_once(once, [] {
    const int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    float a[64 * 64] = {}, b[64 * 64] = {}, c[64 * 64];
    for (const char ta : {'N', 'T'}) {
      for (const char tb : {'N', 'T'}) {
        for (const int m : {64, 3, 2, 1}) {
          for (const int n : {64, 3, 2, 1}) {
            for (const int k : {64, 1}) {
              (void)dnnl_sgemm(ta, tb, m, n, k, 1.0F, a, ta == 'N' ? k : m, b, tb == 'N' ? n : k, 0.0F, c, n);
            }
          }
        }
      }
    }
    omp_set_num_threads(threads);
    std::atexit([] { g_onednn_ready.store(false, std::memory_order_release); });
    engine::Engine::rearm_exit_handler();
    g_onednn_ready.store(true, std::memory_order_release);
  });
#else
  (void)t;
#endif
}

// Operands are read in place when gemm_layout says BLAS can (transposed
// views, sliced rows or columns); the frontend copies the others first.
void matmul(const TensorView& a, const TensorView& b, const TensorView& out) {
  single_threaded_blas();
  const bool batched = a.shape.size() == 3;
  const std::int64_t batch = batched ? a.shape[0] : 1;
  const std::int64_t m = a.shape[batched ? 1 : 0];
  const std::int64_t k = a.shape[batched ? 2 : 1];
  const std::int64_t n = b.shape[batched ? 2 : 1];
  if (m == 0 || n == 0) return;
  const GemmLayout la = gemm_layout(a.shape, a.strides);
  const GemmLayout lb = gemm_layout(b.shape, b.strides);
  if (!la.usable || !lb.usable) throw std::logic_error("matmul: an operand BLAS cannot read in place");
  auto run = [&]<class T>() {
    const T* pa = detail::typed<T>(a) + a.offset;
    const T* pb = detail::typed<T>(b) + b.offset;
    T* pc = detail::typed<T>(out) + out.offset;
    if (k == 0) {
      for (std::int64_t i = 0; i < batch * m * n; ++i) pc[i] = T(0);
      return;
    }
    // Rows r0.. of A start r0 rows in (row-major) or r0 columns in
    // (stored transposed).
    auto rows_of_a = [&](std::int64_t bi, std::int64_t r0) {
      return pa + bi * la.batch_stride + (la.trans ? r0 : r0 * la.ld);
    };
    const std::int64_t blocks = (m + kRowBlock - 1) / kRowBlock;
    auto block = [&](std::int64_t t) {
      const std::int64_t bi = t / blocks;
      const std::int64_t r0 = (t % blocks) * kRowBlock;
      const std::int64_t rows = std::min(kRowBlock, m - r0);
      gemm<T>(rows, n, k, rows_of_a(bi, r0), la, pb + bi * lb.batch_stride, lb, pc + bi * m * n + r0 * n);
    };
    if (batch * m * n * k < kParallelFlops) {
      for (std::int64_t bi = 0; bi < batch; ++bi) {
        gemm<T>(m, n, k, rows_of_a(bi, 0), la, pb + bi * lb.batch_stride, lb, pc + bi * m * n);
      }
      return;
    }
    detail::parallel_chunks(0, batch * blocks, 1, [&](std::int64_t t0, std::int64_t t1) {
      for (std::int64_t t = t0; t < t1; ++t) block(t);
    });
  };
  if (a.dtype == DType::kFloat32) {
    run.template operator()<float>();
  } else {
    run.template operator()<double>();
  }
}

}  // namespace lazydag::ops::cpu
