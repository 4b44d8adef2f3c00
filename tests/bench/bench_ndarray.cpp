// NDArray throughput beside direct OpenBLAS and plain loops, in one run:
// sgemm, elementwise add and a full sum, plus the per-op cost of tiny ops
// and the heap allocations each one makes on the recording thread.
// Prints one key=value line per figure (medians of repeats).
#include <lazydag/lazydag.hpp>

#include <cblas.h>
#include <sys/resource.h>
#if defined(LAZYDAG_ONEDNN)
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#endif

#include "../counting_new.hpp"
#include "bench_util.hpp"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

using namespace lazydag;

using bench::median_seconds;

namespace {

// Median milliseconds per expression of the NumPy peer script, or empty.
std::map<std::string, double> numpy_peer(int argc, char** argv) {
  std::map<std::string, double> ms;
  if (argc < 3) return ms;
  const std::string cmd = "'" + std::string(argv[2]) + "' '" + argv[1] + "' 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  if (!p) return ms;
  char line[512];
  while (std::fgets(line, sizeof line, p.get()) != nullptr) {
    const std::string l(line);
    const auto e = l.find("expr=");
    const auto m = l.find(" ms=");
    if (e == 0 && m != std::string::npos) ms[l.substr(5, m - 5)] = std::stod(l.substr(m + 4));
    if (l.rfind("skipped=", 0) == 0) std::printf("bench=ndarray peer=numpy %s", line);
  }
  return ms;
}

#if defined(__x86_64__) && defined(__GNUC__)
// SLEEF's AVX-512 exp, the one the kernels call on such a CPU; declared as
// ops/cpu/vmath.cpp does (sleef.h declares it only when compiling for
// AVX-512).
extern "C" __attribute__((target("avx512f"))) __m512 Sleef_expf16_u10avx512f(__m512);

// sigmoid(x * w + b) over len elements as one loop, 16 lanes at a time with
// the kernels' vector exp: the fused sigmoid's ceiling on this CPU (the
// plain loop's std::exp is scalar libm).
__attribute__((target("avx512f"))) void sigmoid_affine_avx512(const float* x, const float* w, const float* b, float* y,
                                                             std::int64_t len) {
  const __m512 one = _mm512_set1_ps(1.0F);
  std::int64_t i = 0;
  for (; i + 16 <= len; i += 16) {
    const __m512 v =
        _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), _mm512_loadu_ps(w + i)), _mm512_loadu_ps(b + i));
    const __m512 e = Sleef_expf16_u10avx512f(_mm512_sub_ps(_mm512_setzero_ps(), v));
    _mm512_storeu_ps(y + i, _mm512_div_ps(one, _mm512_add_ps(one, e)));
  }
  for (; i < len; ++i) y[i] = 1.0F / (1.0F + std::exp(-(x[i] * w[i] + b[i])));
}
#endif

volatile float g_sink = 0;  // keeps the plain loops' results alive

// The two_devices chain written as a plain loop: 200 times, a 96 x 96
// product with itself (OpenBLAS, one thread), scaled by 0.01 and tanh'd.
void plain_chain(std::vector<float> x) {
  constexpr int n = 96;
  std::vector<float> p(x.size());
  for (int i = 0; i < 200; ++i) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0F, x.data(), n, x.data(), n, 0.0F,
                p.data(), n);
    for (std::size_t k = 0; k < x.size(); ++k) x[k] = std::tanh(p[k] * 0.01F);
  }
  g_sink = x[0];
}

// The tour's lesson 4b: two chains of 200 tanh(matmul(x, x) * 0.01) on
// sim(0) and sim(1), recorded together and waited for once, against a
// waitall between them (medians of 31 alternated repeats), and the
// process's CPU time for each (median): what the frontend, the workers and
// the devices' threads spend beyond the ops themselves shows there. Beside
// them, the same chains as plain loops on one thread and on two.
void two_devices() {
  NDArray x0 = nd::random_uniform({96, 96}, sim(0), 5);
  NDArray x1 = nd::random_uniform({96, 96}, sim(1), 6);
  nd::waitall();
  auto chain = [](NDArray x) {
    for (int i = 0; i < 200; ++i) x = nd::tanh(nd::matmul(x, x) * 0.01);
    return x;
  };
  auto cpu_seconds = [] {
    rusage u{};
    getrusage(RUSAGE_SELF, &u);
    return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
           static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
  };
  std::vector<double> cpu_together;
  std::vector<double> cpu_apart;
  auto timed = [&](std::vector<double>& cpu, bool barrier) {
    return [&, barrier] {
      const double c0 = cpu_seconds();
      const auto t0 = bench::Clock::now();
      {
        NDArray a = chain(x0);
        if (barrier) nd::waitall();
        NDArray b = chain(x1);
        nd::waitall();
      }
      nd::waitall();
      const double t = bench::since(t0);
      cpu.push_back(cpu_seconds() - c0);
      return t;
    };
  };
  const auto [together, apart] = bench::interleaved_median_of(timed(cpu_together, false), timed(cpu_apart, true), 31);
  // The peer, after the engine's runs: the same two chains as plain loops,
  // one after the other on one thread, then on two threads at once. Its
  // speedup is what two cores give this work here, the ceiling of the
  // ratio above.
  const std::vector<float> h0 = x0.to_vector<float>();
  const std::vector<float> h1 = x1.to_vector<float>();
  const auto [serial, parallel] = bench::interleaved_median_of(
      [&] {
        const auto t0 = bench::Clock::now();
        plain_chain(h0);
        plain_chain(h1);
        return bench::since(t0);
      },
      [&] {
        const auto t0 = bench::Clock::now();
        std::thread other([&] { plain_chain(h1); });
        plain_chain(h0);
        other.join();
        return bench::since(t0);
      },
      31);
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  const double speedup = serial / parallel;
  std::printf("bench=ndarray workload=two_devices together_ms=%.2f apart_ms=%.2f ratio_apart_vs_together=%.3f "
              "cpu_ms_together=%.2f cpu_ms_apart=%.2f\n",
              together * 1e3, apart * 1e3, apart / together, median(cpu_together) * 1e3, median(cpu_apart) * 1e3);
  std::printf("bench=ndarray workload=two_devices peer=plain_threads serial_ms=%.2f parallel_ms=%.2f "
              "parallel_speedup=%.3f\n",
              serial * 1e3, parallel * 1e3, speedup);
  std::printf("bench=ndarray workload=two_devices ratio_vs_parallel_speedup=%.3f\n", apart / together / speedup);
}

}  // namespace

int main(int argc, char** argv) {
  const int threads = nd::engine().num_threads();
  std::printf("bench=ndarray policy=%s threads=%d\n",
              std::string(engine::to_string(nd::engine().policy())).c_str(), threads);
  // The tiny-op figures are the engine's per-op cost: fusion off (fused,
  // 10,000 x + 1 whose results are dropped compute nothing at all).
  const bool fusion = nd::fusion_enabled();
  nd::set_fusion(false);

  // tiny ops first (before OpenBLAS has started threads of its own): the per-op cost of the frontend + engine.
  {
    NDArray x = nd::ones({1});
    const int ops = 10000;
    constexpr int kTinyRepeats = 9;  // tiny ops are noisy; each repeat is short
    const double sync = median_seconds(
        [&] {
          for (int i = 0; i < ops; ++i) (x + 1.0).wait_to_read();
        },
        kTinyRepeats);
    const double async = median_seconds(
        [&] {
          for (int i = 0; i < ops; ++i) (void)(x + 1.0);
          nd::waitall();
        },
        kTinyRepeats);
    std::printf("bench=ndarray workload=tiny_add_sync ns_per_op=%.0f\n", sync / ops * 1e9);
    std::printf("bench=ndarray workload=tiny_add_async ns_per_op=%.0f\n", async / ops * 1e9);
    std::printf("bench=ndarray workload=tiny_add ratio_async_vs_sync=%.2f\n", async / sync);
    // Allocations on the recording thread: recording the ops, and whatever
    // of them the waitall has this thread run (after the warm runs above).
    // (Counted by tests/counting_new.cpp: the program's, the engine's and
    // oneTBB's allocations through the global operator new alike.)
    const long allocations = test::allocations_in([&] {
      for (int i = 0; i < ops; ++i) (void)(x + 1.0);
      nd::waitall();
    });
    std::printf("bench=ndarray workload=tiny_add allocs_per_op=%.2f\n",
                static_cast<double>(allocations) / ops);
    // The waited op with fusion on (the default): a group of one op, which
    // the wait records. What fusion costs an op it finds nothing to fuse with.
    nd::set_fusion(true);
    const double sync_fused = median_seconds(
        [&] {
          for (int i = 0; i < ops; ++i) (x + 1.0).wait_to_read();
        },
        kTinyRepeats);
    nd::set_fusion(false);
    std::printf("bench=ndarray workload=tiny_add_sync fusion=on ns_per_op=%.0f ratio_vs_fusion_off=%.2f\n",
                sync_fused / ops * 1e9, sync_fused / sync);
    // y = x + 1 with y dropped at once, waited for after each op or once,
    // and the chain y = y + 1 read once, over sizes around
    // EngineOptions::inline_bytes and the byte window (run it again with
    // LAZYDAG_INLINE_BYTES=0 to see every node handed to a worker, with
    // LAZYDAG_MAX_PENDING_BYTES to move the window).
    for (const std::int64_t len : {1, 1024, 4096, 8192, 16384, 32768, 65536, 262144}) {
      NDArray v = nd::ones({len});
      const int n = len >= 65536 ? 1500 : 5000;
      const double s = median_seconds(
          [&] {
            for (int i = 0; i < n; ++i) (v + 1.0).wait_to_read();
          },
          kTinyRepeats);
      const double a = median_seconds(
          [&] {
            for (int i = 0; i < n; ++i) (void)(v + 1.0);
            nd::waitall();
          },
          kTinyRepeats);
      const double c = median_seconds(
          [&] {
            NDArray y = v;
            for (int i = 0; i < n; ++i) y = y + 1.0;
            y.wait_to_read();
          },
          kTinyRepeats);
      std::printf("bench=ndarray workload=add_sweep elements=%lld inline_bytes=%zu max_pending_bytes=%zu "
                  "sync_ns_per_op=%.0f async_ns_per_op=%.0f chain_ns_per_op=%.0f\n",
                  static_cast<long long>(len), nd::engine().inline_bytes(), nd::engine().max_pending_bytes(),
                  s / n * 1e9, a / n * 1e9, c / n * 1e9);
    }
    // The 10,000 x = x + 1 chain, read once: fused into nodes of 32 ops.
    auto chain = [&] {
      NDArray y = x;
      for (int i = 0; i < ops; ++i) y = y + 1.0;
      y.wait_to_read();
    };
    const double unfused = median_seconds(chain, kTinyRepeats);
    nd::set_fusion(true);
    const double fused = median_seconds(chain, kTinyRepeats);
    nd::set_fusion(false);
    std::printf("bench=ndarray workload=tiny_chain fusion=off ns_per_op=%.0f\n", unfused / ops * 1e9);
    std::printf("bench=ndarray workload=tiny_chain fusion=on ns_per_op=%.0f\n", fused / ops * 1e9);
    std::printf("bench=ndarray workload=tiny_chain speedup_vs_unfused=%.2f\n", unfused / fused);
    // A two-op expression on 256 elements, read after each: one fused node
    // against two nodes. What a fused node costs beyond the ops it runs.
    NDArray p = nd::random_normal({256}, cpu(), 7);
    NDArray q = nd::random_normal({256}, cpu(), 8);
    const int exprs = 5000;
    auto expr = [&] {
      for (int i = 0; i < exprs; ++i) ((p - q) * 0.5).wait_to_read();
    };
    const double two_nodes = median_seconds(expr, kTinyRepeats);
    nd::set_fusion(true);
    const double one_node = median_seconds(expr, kTinyRepeats);
    const long expr_allocations = test::allocations_in(expr);
    nd::set_fusion(false);
    std::printf("bench=ndarray workload=tiny_expr fusion=off ns_per_expr=%.0f\n", two_nodes / exprs * 1e9);
    std::printf("bench=ndarray workload=tiny_expr fusion=on ns_per_expr=%.0f allocs_per_expr=%.2f\n",
                one_node / exprs * 1e9, static_cast<double>(expr_allocations) / exprs);
    std::printf("bench=ndarray workload=tiny_expr speedup_vs_unfused=%.2f\n", two_nodes / one_node);
  }
  nd::set_fusion(fusion);
  two_devices();
  // sgemm: lazydag (64-row blocks of a single-threaded BLAS over the
  // engine's workers: oneDNN when built with it) vs OpenBLAS called directly
  // with 1 and with all threads (as the environment configures it, e.g.
  // OPENBLAS_CORETYPE), and vs oneDNN called directly with 1 and with all
  // threads (OpenMP), the library lazydag calls.
  for (int n : {256, 1024, 2048}) {
    NDArray a = nd::random_uniform({n, n}, cpu(), 1);
    NDArray b = nd::random_uniform({n, n}, cpu(), 2);
    const auto va = a.to_vector<float>();
    const auto vb = b.to_vector<float>();
    std::vector<float> vc(va.size());
    const double flops = 2.0 * n * n * n;
    const double ours = median_seconds([&] { nd::matmul(a, b).wait_to_read(); });
    auto direct = [&](int blas_threads) {
      openblas_set_num_threads(blas_threads);
      double t = median_seconds([&] {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0F, va.data(), n,
                    vb.data(), n, 0.0F, vc.data(), n);
      });
      openblas_set_num_threads(1);  // what lazydag's kernels expect
      return t;
    };
    const double one = direct(1);
    const double all = direct(threads);
#if defined(LAZYDAG_ONEDNN)
    auto onednn = [&](int omp_threads) {
      const int before = omp_get_max_threads();
      omp_set_num_threads(omp_threads);
      double t = median_seconds([&] {
        (void)dnnl_sgemm('N', 'N', n, n, n, 1.0F, va.data(), n, vb.data(), n, 0.0F, vc.data(), n);
      });
      omp_set_num_threads(before);
      return t;
    };
    const double dnnl_one = onednn(1);
    const double dnnl_all = onednn(threads);
    std::printf("bench=ndarray workload=sgemm n=%d peer=onednn_1thread gflops=%.1f\n", n, flops / dnnl_one * 1e-9);
    std::printf("bench=ndarray workload=sgemm n=%d peer=onednn_%dthreads gflops=%.1f\n", n, threads,
                flops / dnnl_all * 1e-9);
    std::printf("bench=ndarray workload=sgemm n=%d ratio_vs_onednn_%dthreads=%.2f\n", n, threads, dnnl_all / ours);
#endif
    std::printf("bench=ndarray workload=sgemm n=%d lazydag_gflops=%.1f\n", n, flops / ours * 1e-9);
    std::printf("bench=ndarray workload=sgemm n=%d peer=openblas_1thread gflops=%.1f\n", n, flops / one * 1e-9);
    std::printf("bench=ndarray workload=sgemm n=%d peer=openblas_%dthreads gflops=%.1f\n", n, threads,
                flops / all * 1e-9);
    std::printf("bench=ndarray workload=sgemm n=%d ratio_vs_openblas_%dthreads=%.2f\n", n, threads,
                all / ours);
  }

  // elementwise ops and sum of 16M float32: GB/s against plain loops over
  // the same buffers, on one thread and split over two (the memory limit).
  {
    const std::int64_t n = 1 << 24;
    NDArray a = nd::random_uniform({n}, cpu(), 3);
    NDArray b = nd::random_uniform({n}, cpu(), 4);
    const auto va = a.to_vector<float>();
    const auto vb = b.to_vector<float>();
    std::vector<float> vc(va.size());
    auto split2 = [&](auto body) {  // body(lo, hi) on two threads
      std::thread t([&] { body(n / 2, n); });
      body(0, n / 2);
      t.join();
    };
    auto report = [&](const char* workload, double bytes, double ours, double one, double two) {
      std::printf("bench=ndarray workload=%s n=%lld lazydag_gbps=%.2f\n", workload, static_cast<long long>(n),
                  bytes / ours * 1e-9);
      std::printf("bench=ndarray workload=%s n=%lld peer=loop_1thread gbps=%.2f\n", workload,
                  static_cast<long long>(n), bytes / one * 1e-9);
      std::printf("bench=ndarray workload=%s n=%lld peer=loop_2threads gbps=%.2f\n", workload,
                  static_cast<long long>(n), bytes / two * 1e-9);
      std::printf("bench=ndarray workload=%s ratio_vs_loop_2threads=%.2f\n", workload, two / ours);
    };
    // lazydag's op beside the same per-element work as a plain loop over
    // the buffers, on one thread and split over two.
    auto beside_loops = [&](const char* workload, double bytes, const std::function<void()>& ours,
                            auto element) {
      const double t = median_seconds(ours);
      auto body = [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t i = lo; i < hi; ++i) vc[i] = element(i);
      };
      const double one = median_seconds([&] { body(0, n); });
      const double two = median_seconds([&] { split2(body); });
      report(workload, bytes, t, one, two);
    };
    beside_loops("add", 3.0 * n * 4, [&] { (a + b).wait_to_read(); },
                 [&](std::int64_t i) { return va[i] + vb[i]; });
    beside_loops("exp", 2.0 * n * 4, [&] { nd::exp(a).wait_to_read(); },
                 [&](std::int64_t i) { return std::exp(va[i]); });
    beside_loops("tanh", 2.0 * n * 4, [&] { nd::tanh(a).wait_to_read(); },
                 [&](std::int64_t i) { return std::tanh(va[i]); });
    beside_loops("log1p", 2.0 * n * 4, [&] { nd::log1p(a).wait_to_read(); },
                 [&](std::int64_t i) { return std::log1p(va[i]); });
    // pow(a, 2): the square, as a plain loop writes it.
    beside_loops("pow2", 2.0 * n * 4, [&] { nd::pow(a, 2.0).wait_to_read(); },
                 [&](std::int64_t i) { return va[i] * va[i]; });
    // pow(a, b) with an array exponent: SLEEF's vector pow beside libm's powf.
    beside_loops("pow", 3.0 * n * 4, [&] { nd::pow(a, b).wait_to_read(); },
                 [&](std::int64_t i) { return std::pow(va[i], vb[i]); });
    {
      // where(a > 0.5, a, b): a random mask, read with both operands
      // (1 + 4 + 4 bytes in, 4 out per element).
      NDArray mask = a > 0.5;
      const auto bits = mask.to_vector<bool>();
      const std::vector<unsigned char> vm(bits.begin(), bits.end());  // a byte per element, as lazydag's
      beside_loops("where", 13.0 * n, [&] { nd::where(mask, a, b).wait_to_read(); },
                   [&](std::int64_t i) { return vm[i] ? va[i] : vb[i]; });
    }
    // The fused sigmoid(x * w + b) below makes the same two passes and
    // this work besides: its floor.
    beside_loops("sigmoid", 2.0 * n * 4, [&] { nd::sigmoid(a).wait_to_read(); },
                 [&](std::int64_t i) { return 1.0F / (1.0F + std::exp(-va[i])); });
    // Fused expressions on 16M float32 (nd::set_fusion(false) for the unfused
    // figure, in the same run), beside NumPy on the same expressions. Two
    // operand forms: `rows`, a [16384, 1024] batch with per-feature
    // parameters of shape [1024] broadcast over it (a layer's case), and
    // `arrays`, every operand a full 16M array. `traffic_bound` is the
    // unfused ops' memory traffic over the fused node's (in and out, full
    // arrays only): the speedup a memory-bound pass can reach at most.
    {
      const std::map<std::string, double> numpy = numpy_peer(argc, argv);
      constexpr std::int64_t kFeatures = 1024;
      const NDArray x2 = a.reshape({n / kFeatures, kFeatures});
      struct Form {
        const char* suffix;
        Shape shape;
      };
      for (const Form& form : {Form{"_rows", Shape{kFeatures}}, Form{"", Shape{n}}}) {
        const bool rows = form.shape.size() == 1 && form.shape[0] == kFeatures;
        const NDArray& xx = rows ? x2 : a;
        NDArray w = nd::random_uniform(form.shape, cpu(), 3, 0.5, 1.5);
        NDArray bb = nd::random_uniform(form.shape, cpu(), 4, 0.5, 1.5);
        NDArray m = nd::random_uniform(form.shape, cpu(), 5, 0.5, 1.5);
        NDArray sd = nd::random_uniform(form.shape, cpu(), 6, 0.5, 1.5);
        NDArray g = nd::random_uniform(form.shape, cpu(), 7, 0.5, 1.5);
        nd::waitall();
        struct Expr {
          const char* name;
          std::function<NDArray()> fn;
          // Full-array passes (reads and writes) of the unfused ops and of
          // the fused node, with row operands and with array operands.
          double unfused_rows, fused_rows, unfused_arrays, fused_arrays;
        };
        const Expr exprs[] = {
            // x*w (2 passes with rows, 3 with arrays), +b, sigmoid (2) vs one pass (2 or 4)
            {"sigmoid", [&] { return nd::sigmoid(xx * w + bb); }, 6, 2, 8, 4},
            // four binary ops and relu (10 or 14 passes) vs one pass (2 or 6)
            {"chain6", [&] { return nd::relu((xx - m) / sd * g + bb); }, 10, 2, 14, 6},
        };
        // The ceiling of a fused pass: the same expression written as one
        // loop per element over plain buffers, split over two threads (a
        // compiler's fusion, vectorised as the kernels are; std::exp is
        // libm's, so sigmoid's loop pays scalar exp where the kernels use
        // vector math). Its speedup over the unfused ops is the most a
        // fused pass of that expression can reach on this machine.
        const std::int64_t period = rows ? kFeatures : n;
        const auto vx = xx.to_vector<float>();
        const auto vw = w.to_vector<float>();
        const auto vbb = bb.to_vector<float>();
        const auto vm = m.to_vector<float>();
        const auto vsd = sd.to_vector<float>();
        const auto vg = g.to_vector<float>();
        std::vector<float> vy(static_cast<std::size_t>(n));
        // body(x, j): the result for input x and parameter index j, over
        // the two halves (each a whole number of rows) on two threads.
        auto by_rows = [&](auto body) {
          split2([&](std::int64_t lo, std::int64_t hi) {
            for (std::int64_t r0 = lo; r0 < hi; r0 += period) {
              float* __restrict y = vy.data() + r0;
              const float* __restrict x = vx.data() + r0;
              const std::int64_t len = std::min(period, hi - r0);
              const std::int64_t j0 = rows ? 0 : r0;
              for (std::int64_t i = 0; i < len; ++i) y[i] = body(x[i], j0 + i);
            }
          });
        };
        const float* pw = vw.data();
        const float* pbb = vbb.data();
        const float* pm = vm.data();
        const float* psd = vsd.data();
        const float* pg = vg.data();
        const std::map<std::string, std::function<void()>> handfused = {
            {"sigmoid", [&] {
               by_rows([=](float x, std::int64_t j) { return 1.0F / (1.0F + std::exp(-(x * pw[j] + pbb[j]))); });
             }},
            {"chain6", [&] {
               by_rows([=](float x, std::int64_t j) {
                 const float v = (x - pm[j]) / psd[j] * pg[j] + pbb[j];
                 return v > 0 ? v : 0.0F;
               });
             }},
        };
        for (const Expr& e : exprs) {
          const std::string name = std::string(e.name) + form.suffix;
          // Off and on alternated, so that the ratio holds on a machine
          // whose speed drifts.
          const auto [off, on] = bench::interleaved_median_seconds(
              [&] {
                nd::set_fusion(false);
                e.fn().wait_to_read();
              },
              [&] {
                nd::set_fusion(true);
                e.fn().wait_to_read();
              },
              15);
          nd::set_fusion(fusion);
          const char* w_name = name.c_str();
          const double fused_passes = rows ? e.fused_rows : e.fused_arrays;
          const double bound = (rows ? e.unfused_rows : e.unfused_arrays) / fused_passes;
          const long long ln = static_cast<long long>(n);
          std::printf("bench=ndarray workload=fused_%s n=%lld fusion=on ms=%.2f gbps=%.2f\n", w_name, ln, on * 1e3,
                      fused_passes * static_cast<double>(n) * 4 / on * 1e-9);
          std::printf("bench=ndarray workload=fused_%s n=%lld fusion=off ms=%.2f\n", w_name, ln, off * 1e3);
          std::printf("bench=ndarray workload=fused_%s speedup_vs_unfused=%.2f traffic_bound=%.2f\n", w_name,
                      off / on, bound);
          const double hand = median_seconds(handfused.at(e.name));
          std::printf("bench=ndarray workload=fused_%s n=%lld peer=handfused_loop_2threads ms=%.2f\n", w_name, ln,
                      hand * 1e3);
          std::printf("bench=ndarray workload=fused_%s ratio_vs_handfused=%.2f handfused_speedup_vs_unfused=%.2f\n",
                      w_name, on / hand, off / hand);
#if defined(__x86_64__) && defined(__GNUC__)
          if (std::string(e.name) == "sigmoid" && __builtin_cpu_supports("avx512f")) {
            // The same loop with the kernels' vector exp: what one pass of
            // this expression costs at best here, exp's arithmetic included.
            const double vec = median_seconds([&] {
              split2([&](std::int64_t lo, std::int64_t hi) {
                for (std::int64_t r0 = lo; r0 < hi; r0 += period) {
                  const std::int64_t j0 = rows ? 0 : r0;
                  sigmoid_affine_avx512(vx.data() + r0, pw + j0, pbb + j0, vy.data() + r0,
                                        std::min(period, hi - r0));
                }
              });
            });
            std::printf("bench=ndarray workload=fused_%s n=%lld peer=handfused_sleef_avx512_2threads ms=%.2f\n",
                        w_name, ln, vec * 1e3);
            std::printf("bench=ndarray workload=fused_%s ratio_vs_handfused_sleef=%.2f "
                        "handfused_sleef_speedup_vs_unfused=%.2f\n",
                        w_name, on / vec, off / vec);
          }
#endif
          if (auto it = numpy.find(name); it != numpy.end()) {
            std::printf("bench=ndarray workload=fused_%s n=%lld peer=numpy ms=%.2f\n", w_name, ln, it->second);
            std::printf("bench=ndarray workload=fused_%s ratio_vs_numpy=%.2f\n", w_name, on * 1e3 / it->second);
          }
        }
        if (rows) {
          // The chain read inside its own full expression, as C++ code
          // often does: its four temporaries are still held by the read
          // (docs/architecture.md, "What is materialised").
          const double in_expr = median_seconds([&] { nd::relu((xx - m) / sd * g + bb).wait_to_read(); });
          std::printf("bench=ndarray workload=fused_chain6_rows_read_in_expression fusion=on ms=%.2f\n",
                      in_expr * 1e3);
        }
      }
    }
    // Reductions of the same 16M float32, beside plain loops over its
    // values (each thread its half, then the halves combined): a sum in
    // double as lazydag's, and the first index of the largest value.
    {
      double sums[2] = {};
      const double ours = median_seconds([&] { (void)a.sum().item<float>(); });
      auto body = [&](std::int64_t lo, std::int64_t hi) {
        double acc = 0;
        for (std::int64_t i = lo; i < hi; ++i) acc += va[i];
        sums[lo == 0 ? 0 : 1] = acc;
      };
      const double one = median_seconds([&] { body(0, n); });
      const double two = median_seconds([&] { split2(body); });
      report("sum", n * 4.0, ours, one, two);
    }
    for (const bool arg : {false, true}) {
      std::int64_t best[2] = {};
      const double ours = median_seconds([&] {
        if (arg) {
          (void)a.argmax().item<std::int64_t>();
        } else {
          (void)a.max().item<float>();
        }
      });
      auto body = [&](std::int64_t lo, std::int64_t hi) {
        std::int64_t k = lo;
        for (std::int64_t i = lo + 1; i < hi; ++i) {
          if (va[i] > va[k]) k = i;
        }
        best[lo == 0 ? 0 : 1] = k;
      };
      const double one = median_seconds([&] { body(0, n); });
      const double two = median_seconds([&] {
        split2(body);
        if (va[best[1]] > va[best[0]]) best[0] = best[1];
      });
      report(arg ? "argmax" : "max", n * 4.0, ours, one, two);
    }
  }

  return 0;
}
