// LAZYDAG_CUDA_CHECK: every CUDA runtime call is checked; a failure becomes a
// CudaError naming the call, the error and what it was for. For .cu files
// (and C++ files built against the CUDA runtime) only.
#pragma once

#include <cuda_runtime.h>

#include <lazydag/engine/error.hpp>

#include <string>
#include <string_view>

namespace lazydag::cuda {

[[noreturn]] inline void throw_cuda_error(cudaError_t e, const char* call, std::string_view what) {
  std::string msg = std::string(call) + " failed: " + cudaGetErrorName(e) + " (" +
                    cudaGetErrorString(e) + ")";
  if (!what.empty()) msg += " [" + std::string(what) + "]";
  throw CudaError(static_cast<int>(e), msg);
}

inline void check(cudaError_t e, const char* call, std::string_view what) {
  if (e != cudaSuccess) throw_cuda_error(e, call, what);
}

}  // namespace lazydag::cuda

/// Checks a cudaError_t-returning call; `what` names the op or purpose.
#define LAZYDAG_CUDA_CHECK(call, what) ::lazydag::cuda::check((call), #call, (what))
