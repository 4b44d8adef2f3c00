// The element offsets of a strided elementwise kernel on the GPU: for the
// row-major linear index i over an output shape, where each operand's
// element is. Shared by the CUDA kernels (ops/cuda/common.cuh, fused.cu)
// and compiled by the host compiler too, so the CPU tests check the exact
// arithmetic the GPU runs (tests/frontend/test_indexer.cpp).
//
// A merged rank of 1 (dense operands, scalars, row-contiguous views) needs
// no division. Otherwise each dim but the outermost costs a division of the
// remaining index; on a GPU a 64-bit `/` or `%` is a software routine of
// dozens of instructions, so domains below 2^31 elements (every domain in
// practice) divide by multiplication with a precomputed magic number, as
// PyTorch's IntDivider and CUTLASS's FastDivmod do.
#pragma once

#include <lazydag/ops/kernels.hpp>

#include <array>
#include <cstdint>

#include "nest.hpp"

#if defined(__CUDACC__)
#define LAZYDAG_HOST_DEVICE __host__ __device__
#else
#define LAZYDAG_HOST_DEVICE
#endif

namespace lazydag::ops::detail {

/// Unsigned 32-bit division by a divisor fixed in advance, for dividends
/// and divisors below 2^31: q = (umulhi(n, magic) + n) >> shift, where
/// shift = ceil(log2(d)) and magic = floor(2^32 (2^shift - d) / d) + 1
/// (Granlund and Montgomery, "Division by invariant integers using
/// multiplication", 1994). umulhi(n, magic) <= n, so the sum stays below
/// 2^32.
class IntDivider {
 public:
  static constexpr std::uint32_t kLimit = std::uint32_t{1} << 31;  // dividends and divisors below it

  IntDivider() = default;
  /// d in [1, 2^31).
  explicit IntDivider(std::uint32_t d) : divisor_(d) {
    while ((std::uint64_t{1} << shift_) < d) ++shift_;
    const std::uint64_t one = 1;
    magic_ = static_cast<std::uint32_t>(((one << 32) * ((one << shift_) - d)) / d + 1);
  }

  [[nodiscard]] LAZYDAG_HOST_DEVICE std::uint32_t divisor() const { return divisor_; }

  /// n / divisor for n < 2^31.
  [[nodiscard]] LAZYDAG_HOST_DEVICE std::uint32_t div(std::uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const std::uint32_t t = __umulhi(n, magic_);
#else
    const auto t = static_cast<std::uint32_t>((static_cast<std::uint64_t>(n) * magic_) >> 32);
#endif
    return (t + n) >> shift_;
  }

 private:
  std::uint32_t divisor_ = 1;
  std::uint32_t magic_ = 1;
  std::uint32_t shift_ = 0;
};

/// An output shape and, per operand, its element strides broadcast to it
/// and its offset: passed by value to a kernel.
template <int N>
struct Indexer {
  int rank = 0;
  bool narrow = false;  // fewer than 2^31 elements: 32-bit index arithmetic
  std::int64_t shape[kMaxRank] = {};
  IntDivider div[kMaxRank];  // div[d] divides by shape[d] (narrow only)
  std::int64_t strides[N][kMaxRank] = {};
  std::int64_t offset[N] = {};

  /// Element offsets of the first `count` operands for the row-major linear
  /// index i (i below the shape's element count).
  LAZYDAG_HOST_DEVICE void offsets(std::int64_t i, std::int64_t (&o)[N], int count = N) const {
    if (rank == 1) {
      for (int k = 0; k < count; ++k) o[k] = offset[k] + i * strides[k][0];
      return;
    }
    for (int k = 0; k < count; ++k) o[k] = offset[k];
    // The outermost dim's index is what remains after the others: no
    // division for it.
    if (narrow) {
      auto rest = static_cast<std::uint32_t>(i);
      for (int d = rank - 1; d > 0; --d) {
        const std::uint32_t q = div[d].div(rest);
        const std::int64_t idx = rest - q * div[d].divisor();
        rest = q;
        for (int k = 0; k < count; ++k) o[k] += idx * strides[k][d];
      }
      for (int k = 0; k < count; ++k) o[k] += static_cast<std::int64_t>(rest) * strides[k][0];
      return;
    }
    for (int d = rank - 1; d > 0; --d) {
      const std::int64_t q = i / shape[d];
      const std::int64_t idx = i - q * shape[d];
      i = q;
      for (int k = 0; k < count; ++k) o[k] += idx * strides[k][d];
    }
    for (int k = 0; k < count; ++k) o[k] += i * strides[k][0];
  }
};

/// Indexer for `out` and operands broadcast to out.shape (out is the last),
/// over the merged loop nest the CPU kernels use (nest.hpp): size-1 dims
/// dropped and adjacent dims merged where every operand allows, so a dense
/// op is rank 1 and each element costs no division. Host code.
template <int N>
Indexer<N> make_indexer(const TensorView* const (&views)[N], const Shape& out_shape) {
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
  const auto nest = make_nest<static_cast<std::size_t>(N)>(out_shape, strides);
  Indexer<N> ix;
  ix.rank = nest.rank;
  ix.narrow = numel(out_shape) < static_cast<std::int64_t>(IntDivider::kLimit);
  for (int d = 0; d < nest.rank; ++d) {
    const std::int64_t extent = nest.shape[static_cast<std::size_t>(d)];
    ix.shape[d] = extent;
    if (ix.narrow) ix.div[d] = IntDivider(static_cast<std::uint32_t>(extent > 0 ? extent : 1));
    for (int k = 0; k < N; ++k) ix.strides[k][d] = nest.strides[static_cast<std::size_t>(k)][static_cast<std::size_t>(d)];
  }
  for (int k = 0; k < N; ++k) ix.offset[k] = views[k]->offset;
  return ix;
}

}  // namespace lazydag::ops::detail
