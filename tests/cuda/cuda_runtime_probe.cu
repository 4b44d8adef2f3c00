// Settles runtime facts the CUDA backend relies on, on a real GPU (runs in < 5 s;
// tests/gpu/check.sh runs it first and keeps its output in the summary):
//  1. does cudaErrorNotReady from cudaEventQuery linger for cudaGetLastError?
//  2. does a failed cudaMallocAsync linger for the next cudaGetLastError (stale launch check)?
//  3. uniform_value / arange on the GPU vs the host formula (FMA contraction)
//  4. after a faulting kernel: does a later cudaLaunchHostFunc run? what do cudaGetDevice
//     and cudaSetDevice return?  (last: the fault kills the context)
// The generator of ops/src/element.hpp (copied so that this file stands alone).
#include <cstdint>
__host__ __device__ inline std::uint64_t mix64(std::uint64_t seed, std::uint64_t counter) {
  std::uint64_t z = seed * 0x9e3779b97f4a7c15ULL + counter * 0xd1b54a32d192ed03ULL + 0x632be59bd9b4e019ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
__host__ __device__ inline double unit(std::uint64_t seed, std::uint64_t counter) {
  return static_cast<double>(mix64(seed, counter) >> 11) * 0x1.0p-53;
}
__host__ __device__ inline double uniform_value(std::uint64_t seed, std::int64_t i, double low, double high) {
  return low + (high - low) * unit(seed, static_cast<std::uint64_t>(i));
}
#include <cuda_runtime.h>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <thread>
__global__ void spin(long long cycles) { long long t = clock64(); while (clock64() - t < cycles) {} }
__global__ void uni(double* y, int n, double lo, double hi) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { y[i] = uniform_value(42, i, lo, hi); y[n + i] = 1.0 + static_cast<double>(i) * 0.1; }
}
__global__ void fault(int* p) { *p = 1; }
static std::atomic<int> hostfn_calls{0};
static void CUDART_CB hf(void*) { hostfn_calls++; }
int main() {
  cudaStream_t s; cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaEvent_t e; cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  spin<<<1, 1, 0, s>>>(2000000000LL); cudaEventRecord(e, s);
  cudaError_t q = cudaEventQuery(e);
  cudaError_t last = cudaGetLastError();
  std::printf("1. cudaEventQuery=%s then cudaGetLastError=%s\n", cudaGetErrorName(q), cudaGetErrorName(last));
  cudaStreamSynchronize(s);
  void* big = nullptr;
  cudaError_t m = cudaMallocAsync(&big, (size_t)1 << 50, s);
  spin<<<1, 1, 0, s>>>(10);
  std::printf("2. cudaMallocAsync(1 PiB)=%s, next launch's cudaGetLastError=%s\n", cudaGetErrorName(m),
              cudaGetErrorName(cudaGetLastError()));
  const int n = 100000; double* d; cudaMalloc(&d, 2 * n * sizeof(double));
  uni<<<(n + 255) / 256, 256, 0, s>>>(d, n, -2.0, 3.0);
  static double h[2 * n]; cudaMemcpy(h, d, sizeof h, cudaMemcpyDeviceToHost);
  int du = 0, da = 0;
  for (int i = 0; i < n; ++i) {
    volatile double u = unit(42, i); volatile double span = 5.0; volatile double step = 0.1;
    double host_u = -2.0 + span * u; double host_a = 1.0 + static_cast<double>(i) * step;
    du += h[i] != host_u; da += h[n + i] != host_a;
  }
  std::printf("3. uniform(-2,3) f64 GPU!=host: %d/%d, arange(1,0.1) f64 GPU!=host: %d/%d\n", du, n, da, n);
  fault<<<1, 1, 0, s>>>(reinterpret_cast<int*>(16));
  cudaError_t lh = cudaLaunchHostFunc(s, hf, nullptr);
  cudaError_t sy = cudaStreamSynchronize(s);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  int dev = -1; cudaError_t gd = cudaGetDevice(&dev); cudaError_t sd = cudaSetDevice(0);
  std::printf("4. after fault: LaunchHostFunc=%s sync=%s hostfn_calls=%d cudaGetDevice=%s cudaSetDevice=%s\n",
              cudaGetErrorName(lh), cudaGetErrorName(sy), hostfn_calls.load(), cudaGetErrorName(gd),
              cudaGetErrorName(sd));
  return 0;
}
