// Shapes, strides and the shape rules of the operators (broadcasting,
// axes, matmul, reshape, transpose, slice, concat). Every check throws
// InvalidArgument naming the shapes involved.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <lazydag/engine/error.hpp>

namespace lazydag {

using Shape = std::vector<std::int64_t>;
using Strides = std::vector<std::int64_t>;  // in elements

inline constexpr int kMaxRank = 8;

/// "(2, 3)", "()" for a scalar.
[[nodiscard]] std::string to_string(std::span<const std::int64_t> shape);
/// Product of the dims (1 for a scalar, 0 when a dim is 0).
[[nodiscard]] std::int64_t numel(std::span<const std::int64_t> shape) noexcept;
/// Row-major strides of a contiguous array of this shape.
[[nodiscard]] Strides contiguous_strides(std::span<const std::int64_t> shape);
/// Refuses negative dims and ranks above kMaxRank.
void check_shape(std::span<const std::int64_t> shape, std::string_view op);

}  // namespace lazydag

namespace lazydag::ops {

/// NumPy broadcasting of two shapes; throws InvalidArgument with both shapes.
[[nodiscard]] Shape broadcast_shapes(std::span<const std::int64_t> a,
                                     std::span<const std::int64_t> b, std::string_view op);
/// Normalises a possibly negative axis against `rank`; throws on a bad axis.
[[nodiscard]] int normalize_axis(int axis, int rank, std::string_view op);
/// The result shape of a reduction over `axis` (nullopt-like: axis < 0 after
/// normalisation never happens; pass all=true to reduce everything).
[[nodiscard]] Shape reduced_shape(std::span<const std::int64_t> shape, bool all, int axis,
                                  bool keepdims);
/// matmul: (m,k)x(k,n) -> (m,n); (b,m,k)x(b,k,n) -> (b,m,n).
[[nodiscard]] Shape matmul_shape(std::span<const std::int64_t> a,
                                 std::span<const std::int64_t> b);
/// Resolves one -1 in `wanted` and checks the element count.
[[nodiscard]] Shape reshape_shape(std::span<const std::int64_t> from,
                                  std::span<const std::int64_t> wanted);
/// Checks `perm` is a permutation of 0..rank-1.
void check_permutation(std::span<const int> perm, int rank);

}  // namespace lazydag::ops
