// The element functions of the CUDA elementwise kernels, shared by the
// per-op kernels (elementwise.cu) and the fused interpreter (fused.cu), so
// a fused program computes each element exactly as the separate ops would.
#pragma once

#include "common.cuh"

#include <type_traits>

namespace lazydag::ops::cuda::detail {

template <class T>
__device__ T apply_unary(UnaryOp op, T x) {
  if constexpr (std::is_same_v<T, bool>) {
    return x;  // refused at record time
  } else {
    switch (op) {
      case UnaryOp::kNeg:
        if constexpr (std::is_integral_v<T>) return ops::detail::wrap_sub<T>(T(0), x);
        else return -x;
      case UnaryOp::kAbs:
        if constexpr (std::is_integral_v<T>) return x < 0 ? ops::detail::wrap_sub<T>(T(0), x) : x;
        else return x < 0 ? -x : x;
      case UnaryOp::kRelu: return x > 0 ? x : T(0);
      default: break;
    }
    if constexpr (std::is_floating_point_v<T>) {
      switch (op) {
        case UnaryOp::kExp: return exp(x);
        case UnaryOp::kLog: return log(x);
        case UnaryOp::kSqrt: return sqrt(x);
        case UnaryOp::kTanh: return tanh(x);
        case UnaryOp::kSigmoid: return T(1) / (T(1) + exp(-x));
        case UnaryOp::kLog1p: return log1p(x);
        default: break;
      }
    }
    return x;
  }
}

// Integer division by zero gives 0 here (a kernel cannot throw; the CPU
// kernels report it as an error).
template <class T>
__device__ T apply_binary(BinaryOp op, T a, T b) {
  if constexpr (std::is_same_v<T, bool>) {
    return a;  // refused at record time
  } else {
    switch (op) {
      case BinaryOp::kAdd:
        if constexpr (std::is_integral_v<T>) return ops::detail::wrap_add(a, b);
        else return a + b;
      case BinaryOp::kSub:
        if constexpr (std::is_integral_v<T>) return ops::detail::wrap_sub(a, b);
        else return a - b;
      case BinaryOp::kMul:
        if constexpr (std::is_integral_v<T>) return ops::detail::wrap_mul(a, b);
        else return a * b;
      case BinaryOp::kDiv:
        if constexpr (std::is_integral_v<T>) {
          if (b == 0) return T(0);
          if (b == -1) return ops::detail::wrap_sub<T>(T(0), a);
        }
        return a / b;
      case BinaryOp::kPow:
        if constexpr (std::is_floating_point_v<T>) return pow(a, b);
        else return a;
      case BinaryOp::kMax: return a < b ? b : a;
      case BinaryOp::kMin: return b < a ? b : a;
    }
    return a;
  }
}

}  // namespace lazydag::ops::cuda::detail
