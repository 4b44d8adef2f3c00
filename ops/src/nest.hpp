// The merged loop nest of an elementwise op, shared by the CPU kernels
// (ops/cpu/iterate.hpp) and the CUDA indexer (ops/cuda/common.cuh): host
// code, no oneTBB or CUDA.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include <lazydag/ops/kernels.hpp>

namespace lazydag::ops::detail {

/// The loop nest of an elementwise kernel: `shape` with its size-1 dims
/// dropped and adjacent dims merged wherever every operand's strides allow
/// it, so that a dense array is one row, a row broadcast (m, n) + (n,) has
/// rows of n, and a column broadcast (m, n) + (m, 1) rows of n whose second
/// operand has step 0. Rank >= 1 (a scalar is one row of one element).
template <std::size_t N>
struct Nest {
  int rank = 1;
  std::array<std::int64_t, kMaxRank> shape{};
  std::array<std::array<std::int64_t, kMaxRank>, N> strides{};
};

/// `strides[k][d]`: operand k's stride along dim d of `shape` (a Strides
/// vector or a fixed array of kMaxRank).
template <std::size_t N, class S>
Nest<N> make_nest(const Shape& shape, const std::array<S, N>& strides) {
  Nest<N> n;
  int r = 0;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = r > 0;
    for (std::size_t k = 0; merge && k < N; ++k) {
      merge = n.strides[k][r - 1] == strides[k][d] * shape[d];
    }
    if (merge) {
      n.shape[r - 1] *= shape[d];
      for (std::size_t k = 0; k < N; ++k) n.strides[k][r - 1] = strides[k][d];
    } else {
      n.shape[r] = shape[d];
      for (std::size_t k = 0; k < N; ++k) n.strides[k][r] = strides[k][d];
      ++r;
    }
  }
  if (r == 0) {
    n.shape[0] = 1;
    r = 1;
  }
  n.rank = r;
  return n;
}

}  // namespace lazydag::ops::detail
