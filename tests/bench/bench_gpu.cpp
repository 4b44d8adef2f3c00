// GPU figures beside the CUDA libraries called directly, in one run: the
// per-op cost of recording + launching, 10,000 dependent small kernels with
// and without a host sync per op, two-stream overlap, 4096^2 sgemm against
// cublasSgemm (same data, its own stream), elementwise add against cudaMemcpy device-to-device. Prints
// key=value lines and a summary table last. Exits 77 without a GPU.
#include <lazydag/engine/stream.hpp>
#include <lazydag/lazydag.hpp>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "bench_util.hpp"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

using namespace lazydag;

namespace {

using bench::Clock;

// Five repeats: each GPU figure is itself many launches.
double median_seconds(const std::function<void()>& fn) { return bench::median_seconds(fn, 5); }

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

struct Row {
  std::string what;
  std::string ours;
  std::string peer;
  std::string ratio;
};

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

}  // namespace

int main() {
  try {
    (void)nd::engine().stream_device(gpu(0));
  } catch (const BackendUnavailable& e) {
    std::printf("bench=gpu skipped=\"%s\"\n", e.what());
    return 77;
  }
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "properties");
  std::printf("bench=gpu device=\"%s\" streams=%d policy=%s\n", prop.name,
              nd::engine().stream_device(gpu(0)).num_compute_streams(),
              std::string(engine::to_string(nd::engine().policy())).c_str());
  std::vector<Row> rows;

  // 1. launch cost and dependent chains: x += 1 on a small array.
  {
    constexpr int kOps = 10000;
    NDArray x = nd::zeros({256}, DType::kFloat32, gpu(0));
    const double async = median_seconds([&] {
      for (int i = 0; i < kOps; ++i) x += 1.0;
      x.wait_to_read();
    });
    const double sync = median_seconds([&] {
      for (int i = 0; i < kOps; ++i) {
        x += 1.0;
        x.wait_to_read();
      }
    });
    // the enqueue alone (what a benchmark that does not wait measures)
    auto t0 = Clock::now();
    for (int i = 0; i < kOps; ++i) x += 1.0;
    const double enqueue = std::chrono::duration<double>(Clock::now() - t0).count();
    x.wait_to_read();
    std::printf("bench=gpu workload=enqueue_only us_per_op=%.2f\n", enqueue / kOps * 1e6);
    rows.push_back({"record x+=1, no wait (us/op)", fmt("%.2f", enqueue / kOps * 1e6), "-", "-"});
    // the same chain as raw CUDA calls: 1 KiB device-to-device copies on one
    // stream (a runtime call per op, no engine).
    void* a = nullptr;
    void* b = nullptr;
    check(cudaMalloc(&a, 1024), "malloc");
    check(cudaMalloc(&b, 1024), "malloc");
    cudaStream_t s = nullptr;
    check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream");
    const double raw = median_seconds([&] {
      for (int i = 0; i < kOps; ++i) check(cudaMemcpyAsync(i % 2 ? a : b, i % 2 ? b : a, 1024, cudaMemcpyDeviceToDevice, s), "copy");
      check(cudaStreamSynchronize(s), "sync");
    });
    std::printf("bench=gpu workload=chain10k_async us_per_op=%.2f\n", async / kOps * 1e6);
    std::printf("bench=gpu workload=chain10k_sync_each us_per_op=%.2f\n", sync / kOps * 1e6);
    std::printf("bench=gpu workload=chain10k_raw_cuda us_per_op=%.2f\n", raw / kOps * 1e6);
    rows.push_back({"10k dependent x+=1, no sync (us/op)", fmt("%.2f", async / kOps * 1e6),
                    fmt("%.2f", raw / kOps * 1e6) + " raw memcpyAsync", fmt("%.2f", async / raw)});
    rows.push_back({"10k dependent x+=1, sync each (us/op)", fmt("%.2f", sync / kOps * 1e6), "-",
                    fmt("%.2f", sync / async) + "x async"});
    check(cudaStreamDestroy(s), "stream");
    check(cudaFree(a), "free");
    check(cudaFree(b), "free");
  }

  // 2. two-stream overlap: two independent chains (spread over two streams)
  // against the same chains with a barrier between them.
  {
    NDArray p = nd::random_uniform({2048, 2048}, gpu(0), 1);
    NDArray q = nd::random_uniform({2048, 2048}, gpu(0), 2);
    nd::waitall();
    auto chain = [](NDArray x) {
      for (int i = 0; i < 8; ++i) x = nd::tanh(nd::matmul(x, x) * 1e-3);
      return x;
    };
    const double together = median_seconds([&] {
      NDArray a = chain(p);
      NDArray b = chain(q);
      nd::waitall();
    });
    const double apart = median_seconds([&] {
      NDArray a = chain(p);
      nd::waitall();
      NDArray b = chain(q);
      nd::waitall();
    });
    std::printf("bench=gpu workload=two_streams overlapped_ms=%.2f serialised_ms=%.2f speedup=%.2f\n",
                together * 1e3, apart * 1e3, apart / together);
    rows.push_back({"two chains, streams vs barrier (ms)", fmt("%.2f", together * 1e3),
                    fmt("%.2f", apart * 1e3) + " serialised", fmt("%.2f", apart / together) + "x"});
  }

  // 3. sgemm 4096^2 against cublasSgemm on a non-blocking stream of its own,
  // on the same random data; handles, streams and buffers made outside the
  // timed loops, one untimed call each first.
  {
    constexpr int kN = 4096;
    NDArray a = nd::random_uniform({kN, kN}, gpu(0), 3);
    NDArray b = nd::random_uniform({kN, kN}, gpu(0), 4);
    nd::waitall();
    nd::matmul(a, b).wait_to_read();
    const double ours = median_seconds([&] { nd::matmul(a, b).wait_to_read(); });
    float* da = nullptr;
    float* db = nullptr;
    float* dc = nullptr;
    const std::size_t bytes = std::size_t{kN} * kN * sizeof(float);
    check(cudaMalloc(reinterpret_cast<void**>(&da), bytes), "malloc");
    check(cudaMalloc(reinterpret_cast<void**>(&db), bytes), "malloc");
    check(cudaMalloc(reinterpret_cast<void**>(&dc), bytes), "malloc");
    const std::vector<float> ha = a.to_vector<float>();
    const std::vector<float> hb = b.to_vector<float>();
    check(cudaMemcpy(da, ha.data(), bytes, cudaMemcpyHostToDevice), "copy a");
    check(cudaMemcpy(db, hb.data(), bytes, cudaMemcpyHostToDevice), "copy b");
    cudaStream_t stream = nullptr;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "stream");
    cublasHandle_t h = nullptr;
    auto blas = [](cublasStatus_t st, const char* what) {
      if (st != CUBLAS_STATUS_SUCCESS) {
        std::fprintf(stderr, "%s: cuBLAS status %d\n", what, static_cast<int>(st));
        std::exit(1);
      }
    };
    blas(cublasCreate(&h), "cublasCreate");
    blas(cublasSetStream(h, stream), "cublasSetStream");
    const float one = 1.0F;
    const float zero = 0.0F;
    // Row-major C = A B is column-major C^T = B^T A^T: the same call as ours.
    auto gemm = [&] {
      blas(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, kN, kN, kN, &one, db, kN, da, kN, &zero, dc, kN),
           "cublasSgemm");
      check(cudaStreamSynchronize(stream), "sync");
    };
    gemm();
    const double peer = median_seconds(gemm);
    const double flop = 2.0 * kN * kN * kN;
    std::printf("bench=gpu workload=sgemm4096 tflops=%.2f cublas_tflops=%.2f ratio=%.3f\n", flop / ours / 1e12,
                flop / peer / 1e12, peer / ours);
    rows.push_back({"sgemm 4096^2 (TFLOP/s)", fmt("%.1f", flop / ours / 1e12), fmt("%.1f", flop / peer / 1e12) + " cuBLAS",
                    fmt("%.2f", peer / ours)});
    blas(cublasDestroy(h), "cublasDestroy");
    check(cudaStreamDestroy(stream), "stream destroy");
    check(cudaFree(da), "free");
    check(cudaFree(db), "free");
    check(cudaFree(dc), "free");
  }

  // 4. elementwise add, 64M float32, against cudaMemcpy device-to-device.
  {
    constexpr std::int64_t kN = std::int64_t{1} << 26;
    NDArray x = nd::random_uniform({kN}, gpu(0), 5);
    NDArray y = nd::random_uniform({kN}, gpu(0), 6);
    nd::waitall();
    const double ours = median_seconds([&] { (x + y).wait_to_read(); });
    void* a = nullptr;
    void* b = nullptr;
    const std::size_t bytes = kN * sizeof(float);
    check(cudaMalloc(&a, bytes), "malloc");
    check(cudaMalloc(&b, bytes), "malloc");
    const double copy = median_seconds([&] {
      check(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice), "copy");
      check(cudaDeviceSynchronize(), "sync");
    });
    const double gbs = 3.0 * static_cast<double>(bytes) / ours / 1e9;
    const double copy_gbs = 2.0 * static_cast<double>(bytes) / copy / 1e9;
    std::printf("bench=gpu workload=add64M gbs=%.0f memcpy_d2d_gbs=%.0f ratio=%.3f\n", gbs, copy_gbs, gbs / copy_gbs);
    rows.push_back({"add 64M f32 (GB/s)", fmt("%.0f", gbs), fmt("%.0f", copy_gbs) + " memcpy D2D", fmt("%.2f", gbs / copy_gbs)});
    check(cudaFree(a), "free");
    check(cudaFree(b), "free");
  }

  std::printf("\n%-40s %-12s %-28s %s\n", "figure", "lazydag", "peer", "ratio");
  for (const Row& r : rows) std::printf("%-40s %-12s %-28s %s\n", r.what.c_str(), r.ours.c_str(), r.peer.c_str(), r.ratio.c_str());
  return 0;
}
