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

}  // namespace lazydag::ops::cpu::detail
