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
#include <lazydag/ops/inline_vector.hpp>

namespace lazydag {

inline constexpr int kMaxRank = 8;

/// Dims and strides (in elements) of arrays, up to kMaxRank inline: the
/// interface of std::vector<std::int64_t>, constructible from one, and
/// convertible to std::span<const std::int64_t>.
using Shape = InlineVector<std::int64_t, kMaxRank>;
using Strides = InlineVector<std::int64_t, kMaxRank>;  // in elements

/// The most elements an array may have, counting a zero dim as one (so that
/// strides fit too): a byte count of any dtype then fits in an int64.
inline constexpr std::int64_t kMaxElements = (std::int64_t{1} << 60) - 1;

/// "(2, 3)", "()" for a scalar.
[[nodiscard]] std::string to_string(std::span<const std::int64_t> shape);
/// Product of the dims (1 for a scalar, 0 when a dim is 0). Of a shape that
/// passed check_shape: it does not check for overflow.
[[nodiscard]] std::int64_t numel(std::span<const std::int64_t> shape) noexcept;
/// Row-major strides of a contiguous array of this shape.
[[nodiscard]] Strides contiguous_strides(std::span<const std::int64_t> shape);
/// Refuses negative dims, ranks above kMaxRank and shapes whose product of
/// dims (zero dims counted as one) exceeds kMaxElements, with
/// InvalidArgument naming `op` and the shape. Every shape an array is given
/// passes here, so element, stride and byte counts of arrays never overflow.
void check_shape(std::span<const std::int64_t> shape, std::string_view op);
/// a + b of two dims, or InvalidArgument naming `op` when the sum exceeds
/// kMaxElements.
[[nodiscard]] std::int64_t checked_dim_sum(std::int64_t a, std::int64_t b, std::string_view op);

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

/// How BLAS reads one matmul operand in place: its last two dims (rows x
/// cols) are row-major with leading dimension `ld` (trans false), or the
/// transpose of a row-major cols x rows matrix with leading dimension `ld`
/// (trans true, as a transpose() view is), and `batch_stride` elements lie
/// between the matrices of a batched (3-D) operand. usable false: the view
/// must be copied to contiguous first (a broadcast inside the matrix, or a
/// leading dimension beyond BLAS's int). Sliced rows or columns are usable.
struct GemmLayout {
  bool usable = false;
  bool trans = false;
  std::int64_t ld = 0;
  std::int64_t batch_stride = 0;
};
[[nodiscard]] GemmLayout gemm_layout(std::span<const std::int64_t> shape, std::span<const std::int64_t> strides);
/// Resolves one -1 in `wanted` and checks the element count.
[[nodiscard]] Shape reshape_shape(std::span<const std::int64_t> from,
                                  std::span<const std::int64_t> wanted);
/// Checks `perm` is a permutation of 0..rank-1.
void check_permutation(std::span<const int> perm, int rank);

}  // namespace lazydag::ops
