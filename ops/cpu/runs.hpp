// Flat runs of the elementwise kernels, for the fused interpreter: n
// elements of each operand at a pointer with a step of 1 (dense) or 0 (one
// value broadcast), written to a dense run. Each computes every element
// with the very code of the kernel it stands for (same per-element
// function, same vector math), so a fused program's results are the
// unfused ops' results bit for bit.
#pragma once

#include <cstdint>

#include <lazydag/ops/kernels.hpp>

namespace lazydag::ops::cpu::detail {

void unary_run(UnaryOp op, DType t, const void* x, std::int64_t sx, void* y, std::int64_t n);
void binary_run(BinaryOp op, DType t, const void* x, std::int64_t sx, const void* z, std::int64_t sz, void* y,
                std::int64_t n);
void scalar_run(BinaryOp op, DType t, const void* x, std::int64_t sx, double scalar, bool scalar_first, void* y,
                std::int64_t n);
/// t: the operands' dtype; y holds bool.
void compare_run(CompareOp op, DType t, const void* x, std::int64_t sx, const void* z, std::int64_t sz, void* y,
                 std::int64_t n);
void compare_scalar_run(CompareOp op, DType t, const void* x, std::int64_t sx, double scalar, void* y,
                        std::int64_t n);
/// t: the dtype of x, z and y; c holds bool.
void where_run(DType t, const void* c, std::int64_t sc, const void* x, std::int64_t sx, const void* z,
               std::int64_t sz, void* y, std::int64_t n);
void cast_run(DType from, DType to, const void* x, std::int64_t sx, void* y, std::int64_t n);

/// One op of a chain_run, applied to the chain's running value v: a binary
/// op with an array operand (`operand`, step 0 or 1), a binary op with a
/// scalar, or a unary op; `operand_first`: op(operand, v), as a scalar op
/// with the scalar first computes.
struct ChainOp {
  enum class Kind : std::uint8_t { kArray, kScalar, kUnary };
  Kind kind = Kind::kUnary;
  std::uint8_t op = 0;  // BinaryOp, or UnaryOp for kUnary
  bool operand_first = false;
  const void* operand = nullptr;
  std::int64_t step = 0;
  double scalar = 0;
};
/// Whether chain_run computes op `op` of `kind` on dtype t: add, sub, mul,
/// div, max and min (array or scalar operand), neg, abs and relu, on
/// float32 and float64.
bool chainable(ChainOp::Kind kind, std::uint8_t op, DType t) noexcept;
/// y = ops[k-1](...ops[0](x)) over n elements, the running value kept in
/// vector registers from the first op to the last: each op computes every
/// element as the unfused op's kernel does (the same IEEE operation, the
/// same rounding), so the result is that of the ops run one by one.
void chain_run(DType t, const ChainOp* ops, int k, const void* x, std::int64_t sx, void* y, std::int64_t n);

}  // namespace lazydag::ops::cpu::detail
