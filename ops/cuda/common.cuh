// Shared by the CUDA kernels: strided-view indexing for up to four operands
// (broadcasting by zero strides), launch shapes and the dtype dispatch.
#pragma once

#include <cuda_runtime.h>

#include <lazydag/ops/kernels.hpp>

#include "check.hpp"
#include "../src/element.hpp"
#include "../src/nest.hpp"

#include <array>
#include <cstdint>
#include <type_traits>

namespace lazydag::ops::cuda::detail {

inline constexpr int kMaxRank = 8;

/// An output shape and, per operand, its element strides broadcast to it
/// and its offset: passed by value to a kernel.
template <int N>
struct Indexer {
  int rank = 0;
  std::int64_t shape[kMaxRank] = {};
  std::int64_t strides[N][kMaxRank] = {};
  std::int64_t offset[N] = {};

  /// Element offsets of every operand for the row-major linear index i.
  /// A merged rank of 1 (dense operands, scalars, row-contiguous views)
  /// needs no division at all.
  __device__ void offsets(std::int64_t i, std::int64_t (&o)[N]) const {
    if (rank == 1) {
      for (int k = 0; k < N; ++k) o[k] = offset[k] + i * strides[k][0];
      return;
    }
    for (int k = 0; k < N; ++k) o[k] = offset[k];
    for (int d = rank - 1; d >= 0; --d) {
      const std::int64_t idx = i % shape[d];
      i /= shape[d];
      for (int k = 0; k < N; ++k) o[k] += idx * strides[k][d];
    }
  }
};

/// Indexer for `out` and operands broadcast to out.shape (out is the last),
/// over the merged loop nest the CPU kernels use (ops/src/nest.hpp): size-1
/// dims dropped and adjacent dims merged where every operand allows, so a
/// dense op is rank 1 and each element costs no 64-bit division.
template <int N>
Indexer<N> make_indexer(const TensorView* const (&views)[N], const Shape& out_shape) {
  if (out_shape.size() > static_cast<std::size_t>(kMaxRank)) throw InvalidArgument("CUDA kernels support rank <= 8");
  const std::size_t rank = out_shape.size();
  std::array<Strides, N> strides;
  for (int k = 0; k < N; ++k) {
    const TensorView& v = *views[k];
    const std::size_t r = v.shape.size();
    strides[static_cast<std::size_t>(k)].assign(rank, 0);
    for (std::size_t d = 0; d < r; ++d) {
      strides[static_cast<std::size_t>(k)][rank - r + d] = v.shape[d] == 1 ? 0 : v.strides[d];
    }
  }
  const auto nest = ops::detail::make_nest<static_cast<std::size_t>(N)>(out_shape, strides);
  Indexer<N> ix;
  ix.rank = nest.rank;
  for (int d = 0; d < nest.rank; ++d) {
    ix.shape[d] = nest.shape[static_cast<std::size_t>(d)];
    for (int k = 0; k < N; ++k) ix.strides[k][d] = nest.strides[static_cast<std::size_t>(k)][static_cast<std::size_t>(d)];
  }
  for (int k = 0; k < N; ++k) ix.offset[k] = views[k]->offset;
  return ix;
}

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
