// The CPU kernels: each works on strided views of typed buffers and is
// called from inside a recorded node. Kernels do not check shapes (the
// frontend did at record time) but do report runtime faults (integer
// division by zero) by throwing.
#pragma once

#include <cstdint>
#include <span>

#include <lazydag/ops/dtype.hpp>
#include <lazydag/ops/shape.hpp>

namespace lazydag::ops {

/// A strided view of a buffer: element (i0..in) is at
/// data + (offset + sum(ik * strides[k])) * size_of(dtype).
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  Shape shape;
  Strides strides;
  std::int64_t offset = 0;
};

enum class UnaryOp : std::uint8_t { kNeg, kAbs, kExp, kLog, kSqrt, kTanh, kSigmoid, kRelu };
enum class BinaryOp : std::uint8_t { kAdd, kSub, kMul, kDiv, kPow, kMax, kMin };
enum class CompareOp : std::uint8_t { kEq, kNe, kLt, kLe, kGt, kGe };
enum class ReduceOp : std::uint8_t { kSum, kMean, kMax, kMin, kArgmax };

[[nodiscard]] std::string_view to_string(UnaryOp op) noexcept;
[[nodiscard]] std::string_view to_string(BinaryOp op) noexcept;
[[nodiscard]] std::string_view to_string(CompareOp op) noexcept;
[[nodiscard]] std::string_view to_string(ReduceOp op) noexcept;

namespace cpu {

/// out = op(a); same dtype, same shape (a broadcast to out.shape).
void unary(UnaryOp op, const TensorView& a, const TensorView& out);
/// out = op(a, b) with a and b broadcast to out.shape; one dtype throughout.
void binary(BinaryOp op, const TensorView& a, const TensorView& b, const TensorView& out);
/// out = op(a, scalar) (or op(scalar, a) when scalar_first).
void binary_scalar(BinaryOp op, const TensorView& a, double scalar, bool scalar_first,
                   const TensorView& out);
/// out (bool) = a op b, broadcast.
void compare(CompareOp op, const TensorView& a, const TensorView& b, const TensorView& out);
void compare_scalar(CompareOp op, const TensorView& a, double scalar, const TensorView& out);
/// out = cond ? a : b, broadcast.
void where(const TensorView& cond, const TensorView& a, const TensorView& b,
           const TensorView& out);
/// out = a converted to out.dtype (also a strided-to-contiguous copy).
void copy_cast(const TensorView& a, const TensorView& out);
/// Reduction over everything (all) or one axis; out is contiguous.
void reduce(ReduceOp op, const TensorView& a, bool all, int axis, const TensorView& out);
/// C = A x B, contiguous float32/float64, 2-D or batched 3-D, through CBLAS.
void matmul(const TensorView& a, const TensorView& b, const TensorView& out);
/// Fills a contiguous buffer.
void fill(const TensorView& out, double value);
void arange(const TensorView& out, double start, double step);
/// Counter-based: element i depends only on (seed, i), never on threads.
void random_uniform(const TensorView& out, std::uint64_t seed, double low, double high);
void random_normal(const TensorView& out, std::uint64_t seed, double mean, double stddev);

}  // namespace cpu
}  // namespace lazydag::ops
