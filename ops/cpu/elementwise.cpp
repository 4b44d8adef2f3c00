// CPU elementwise kernels: unary and binary math with broadcasting,
// comparisons, where, dtype conversion, fills and counter-based random numbers.
#include <cmath>
#include <stdexcept>
#include <type_traits>

#include "../src/element.hpp"
#include "iterate.hpp"

namespace lazydag::ops::cpu {

using ops::detail::apply_compare;
using detail::broadcast_strides;
using ops::detail::convert_value;
using detail::for_each;
using detail::typed;
using ops::detail::wrap_add;
using ops::detail::wrap_mul;
using ops::detail::wrap_sub;

namespace {

template <class T>
T apply_unary(UnaryOp op, T x) {
  if constexpr (std::is_same_v<T, bool>) {
    throw std::logic_error("unary op on bool");  // refused at record time
  } else {
    switch (op) {
      case UnaryOp::kNeg:
        if constexpr (std::is_integral_v<T>) return wrap_sub<T>(T(0), x);
        return static_cast<T>(-x);
      case UnaryOp::kAbs:
        if constexpr (std::is_integral_v<T>) return x < 0 ? wrap_sub<T>(T(0), x) : x;
        return x < 0 ? static_cast<T>(-x) : x;
      case UnaryOp::kRelu: return x > 0 ? x : T(0);
      default: break;
    }
    if constexpr (std::is_floating_point_v<T>) {
      switch (op) {
        case UnaryOp::kExp: return std::exp(x);
        case UnaryOp::kLog: return std::log(x);
        case UnaryOp::kSqrt: return std::sqrt(x);
        case UnaryOp::kTanh: return std::tanh(x);
        case UnaryOp::kSigmoid: return T(1) / (T(1) + std::exp(-x));
        default: break;
      }
    }
    throw std::logic_error("unary op not defined for this dtype");  // refused at record time
  }
}

template <class T>
T apply_binary(BinaryOp op, T a, T b) {
  if constexpr (std::is_same_v<T, bool>) {
    throw std::logic_error("arithmetic on bool");  // refused at record time
  } else {
    switch (op) {
      case BinaryOp::kAdd:
        if constexpr (std::is_integral_v<T>) return wrap_add(a, b);
        return static_cast<T>(a + b);
      case BinaryOp::kSub:
        if constexpr (std::is_integral_v<T>) return wrap_sub(a, b);
        return static_cast<T>(a - b);
      case BinaryOp::kMul:
        if constexpr (std::is_integral_v<T>) return wrap_mul(a, b);
        return static_cast<T>(a * b);
      case BinaryOp::kDiv:
        if constexpr (std::is_integral_v<T>) {
          if (b == 0) throw std::domain_error("integer division by zero");
          if (b == -1) return wrap_sub<T>(T(0), a);  // avoids the INT_MIN / -1 trap
        }
        return static_cast<T>(a / b);
      case BinaryOp::kPow:
        if constexpr (std::is_floating_point_v<T>) return std::pow(a, b);
        break;
      case BinaryOp::kMax: return a < b ? b : a;
      case BinaryOp::kMin: return b < a ? b : a;
    }
    throw std::logic_error("binary op not defined for this dtype");
  }
}

template <class T>
T from_double(double v) {
  return convert_value<T>(v);
}

}  // namespace

void unary(UnaryOp op, const TensorView& a, const TensorView& out) {
  dispatch(out.dtype, [&]<class T>() {
    const T* x = typed<T>(a);
    T* y = typed<T>(out);
    if (detail::all_dense(out.shape, a, out)) {
      x += a.offset;
      y += out.offset;
      detail::parallel_range(numel(out.shape), [&](std::int64_t i0, std::int64_t i1) {
        for (std::int64_t i = i0; i < i1; ++i) y[i] = apply_unary<T>(op, x[i]);
      });
      return;
    }
    for_each<2>(out.shape, {broadcast_strides(a, out.shape), out.strides}, {a.offset, out.offset},
                [&](const std::array<std::int64_t, 2>& o) { y[o[1]] = apply_unary<T>(op, x[o[0]]); });
  });
}

void binary(BinaryOp op, const TensorView& a, const TensorView& b, const TensorView& out) {
  dispatch(out.dtype, [&]<class T>() {
    const T* x = typed<T>(a);
    const T* z = typed<T>(b);
    T* y = typed<T>(out);
    if (detail::all_dense(out.shape, a, b, out)) {
      x += a.offset;
      z += b.offset;
      y += out.offset;
      detail::parallel_range(numel(out.shape), [&](std::int64_t i0, std::int64_t i1) {
        for (std::int64_t i = i0; i < i1; ++i) y[i] = apply_binary<T>(op, x[i], z[i]);
      });
      return;
    }
    for_each<3>(out.shape,
                {broadcast_strides(a, out.shape), broadcast_strides(b, out.shape), out.strides},
                {a.offset, b.offset, out.offset}, [&](const std::array<std::int64_t, 3>& o) {
                  y[o[2]] = apply_binary<T>(op, x[o[0]], z[o[1]]);
                });
  });
}

void binary_scalar(BinaryOp op, const TensorView& a, double scalar, bool scalar_first,
                   const TensorView& out) {
  dispatch(out.dtype, [&]<class T>() {
    const T* x = typed<T>(a);
    T* y = typed<T>(out);
    const T s = from_double<T>(scalar);
    for_each<2>(out.shape, {broadcast_strides(a, out.shape), out.strides}, {a.offset, out.offset},
                [&](const std::array<std::int64_t, 2>& o) {
                  y[o[1]] = scalar_first ? apply_binary<T>(op, s, x[o[0]])
                                         : apply_binary<T>(op, x[o[0]], s);
                });
  });
}

void compare(CompareOp op, const TensorView& a, const TensorView& b, const TensorView& out) {
  bool* y = typed<bool>(out);
  dispatch(a.dtype, [&]<class T>() {
    const T* x = typed<T>(a);
    const T* z = typed<T>(b);
    for_each<3>(out.shape,
                {broadcast_strides(a, out.shape), broadcast_strides(b, out.shape), out.strides},
                {a.offset, b.offset, out.offset}, [&](const std::array<std::int64_t, 3>& o) {
                  y[o[2]] = apply_compare<T>(op, x[o[0]], z[o[1]]);
                });
  });
}

void compare_scalar(CompareOp op, const TensorView& a, double scalar, const TensorView& out) {
  bool* y = typed<bool>(out);
  dispatch(a.dtype, [&]<class T>() {
    const T* x = typed<T>(a);
    for_each<2>(out.shape, {broadcast_strides(a, out.shape), out.strides}, {a.offset, out.offset},
                [&](const std::array<std::int64_t, 2>& o) {
                  // compare in double so that x < 0.5 means what it says for ints
                  y[o[1]] = apply_compare<double>(op, static_cast<double>(x[o[0]]), scalar);
                });
  });
}

void where(const TensorView& cond, const TensorView& a, const TensorView& b,
           const TensorView& out) {
  const bool* c = typed<bool>(cond);
  dispatch(out.dtype, [&]<class T>() {
    const T* x = typed<T>(a);
    const T* z = typed<T>(b);
    T* y = typed<T>(out);
    for_each<4>(out.shape,
                {broadcast_strides(cond, out.shape), broadcast_strides(a, out.shape),
                 broadcast_strides(b, out.shape), out.strides},
                {cond.offset, a.offset, b.offset, out.offset},
                [&](const std::array<std::int64_t, 4>& o) {
                  y[o[3]] = c[o[0]] ? x[o[1]] : z[o[2]];
                });
  });
}

void copy_cast(const TensorView& a, const TensorView& out) {
  dispatch(a.dtype, [&]<class S>() {
    dispatch(out.dtype, [&]<class D>() {
      const S* x = typed<S>(a);
      D* y = typed<D>(out);
      auto convert = [](S v) -> D { return convert_value<D>(v); };
      if (detail::all_dense(out.shape, a, out)) {
        x += a.offset;
        y += out.offset;
        detail::parallel_range(numel(out.shape), [&](std::int64_t i0, std::int64_t i1) {
          for (std::int64_t i = i0; i < i1; ++i) y[i] = convert(x[i]);
        });
        return;
      }
      for_each<2>(out.shape, {broadcast_strides(a, out.shape), out.strides},
                  {a.offset, out.offset},
                  [&](const std::array<std::int64_t, 2>& o) { y[o[1]] = convert(x[o[0]]); });
    });
  });
}

void fill(const TensorView& out, double value) {
  dispatch(out.dtype, [&]<class T>() {
    T* y = typed<T>(out) + out.offset;
    const T v = from_double<T>(value);
    detail::parallel_range(numel(out.shape), [&](std::int64_t i0, std::int64_t i1) {
      for (std::int64_t i = i0; i < i1; ++i) y[i] = v;
    });
  });
}

void arange(const TensorView& out, double start, double step) {
  dispatch(out.dtype, [&]<class T>() {
    T* y = typed<T>(out) + out.offset;
    detail::parallel_range(numel(out.shape), [&](std::int64_t i0, std::int64_t i1) {
      for (std::int64_t i = i0; i < i1; ++i) y[i] = from_double<T>(start + static_cast<double>(i) * step);
    });
  });
}

void random_uniform(const TensorView& out, std::uint64_t seed, double low, double high) {
  dispatch(out.dtype, [&]<class T>() {
    T* y = typed<T>(out) + out.offset;
    detail::parallel_range(numel(out.shape), [&](std::int64_t i0, std::int64_t i1) {
      for (std::int64_t i = i0; i < i1; ++i) {
        y[i] = from_double<T>(ops::detail::uniform_value(seed, i, low, high));
      }
    });
  });
}

void random_normal(const TensorView& out, std::uint64_t seed, double mean, double stddev) {
  dispatch(out.dtype, [&]<class T>() {
    T* y = typed<T>(out) + out.offset;
    detail::parallel_range(numel(out.shape), [&](std::int64_t i0, std::int64_t i1) {
      for (std::int64_t i = i0; i < i1; ++i) {
        y[i] = from_double<T>(ops::detail::normal_value(seed, i, mean, stddev));
      }
    });
  });
}

}  // namespace lazydag::ops::cpu
