// Shared by the CUDA kernels: strided-view indexing (../src/indexer.hpp),
// launch shapes and the dtype dispatch.
#pragma once

#include <cuda_runtime.h>

#include <lazydag/ops/kernels.hpp>

#include "check.hpp"
#include "../src/element.hpp"
#include "../src/indexer.hpp"

#include <array>
#include <cstdint>
#include <type_traits>

namespace lazydag::ops::cuda::detail {

using ops::detail::Indexer;
using ops::detail::make_indexer;

inline int blocks_for(std::int64_t n, int threads = 256) {
  const std::int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 1 ? 1 : (b > 65535 * 16 ? 65535 * 16 : b));
}

inline cudaStream_t as_stream(void* s) { return static_cast<cudaStream_t>(s); }

/// Clears the thread's last runtime error before a launch: cudaGetLastError
/// after the launch must report that launch, not an earlier call's error
/// that was already handled (an out-of-memory of cudaMallocAsync, say). A
/// sticky error (a fault of the context) is not cleared by this and is
/// still reported.
inline void clear_last_error() { (void)cudaGetLastError(); }

/// Checks the launch just made (configuration errors are reported at once;
/// faults during execution are reported by the device's completion). Call
/// clear_last_error() right before the launch.
inline void check_launch(const char* kernel) {
  LAZYDAG_CUDA_CHECK(cudaGetLastError(), kernel);
}

using ops::detail::convert_value;  // the CPU's rules (../src/element.hpp)

}  // namespace lazydag::ops::cuda::detail
