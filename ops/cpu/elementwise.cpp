// CPU elementwise kernels: unary and binary math with broadcasting,
// comparisons, where, dtype conversion, fills and counter-based random numbers.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <type_traits>

#include "../src/element.hpp"
#include "iterate.hpp"
#include "runs.hpp"
#include "vmath.hpp"

namespace lazydag::ops::cpu {

using ops::detail::apply_compare;
using detail::broadcast_dims;
using detail::dims;
using Dims = detail::Dims;
using ops::detail::convert_value;
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
        case UnaryOp::kLog1p: return std::log1p(x);
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
        // One element through the kernels' vector routine (vmath::pow:
        // SLEEF's pow, and a correctly rounded square for an exponent of
        // 2, as NumPy's x ** 2), so every path gives the same bits.
        if constexpr (std::is_floating_point_v<T>) {
          T y;
          vmath::pow(&a, 0, &b, 0, &y, 1);
          return y;
        }
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

// pow(x, 2) with the exponent a scalar: the square loop, which vectorises,
// instead of a libm call per element (the same values: apply_binary
// squares for an exponent of 2 too).
template <class T>
bool squares(BinaryOp op, T s, bool scalar_first) {
  if constexpr (std::is_floating_point_v<T>) {
    return op == BinaryOp::kPow && !scalar_first && s == T(2);
  } else {
    return false;
  }
}

// Calls g(std::integral_constant<E, op>{}): the op becomes a compile-time
// constant of the kernel, so its switch folds away and the row loops below
// are plain loops the compiler vectorises.
template <class G>
void with_op(UnaryOp op, G&& g) {
  using U = UnaryOp;
  switch (op) {
    case U::kNeg: return g(std::integral_constant<U, U::kNeg>{});
    case U::kAbs: return g(std::integral_constant<U, U::kAbs>{});
    case U::kExp: return g(std::integral_constant<U, U::kExp>{});
    case U::kLog: return g(std::integral_constant<U, U::kLog>{});
    case U::kSqrt: return g(std::integral_constant<U, U::kSqrt>{});
    case U::kTanh: return g(std::integral_constant<U, U::kTanh>{});
    case U::kSigmoid: return g(std::integral_constant<U, U::kSigmoid>{});
    case U::kRelu: return g(std::integral_constant<U, U::kRelu>{});
    case U::kLog1p: return g(std::integral_constant<U, U::kLog1p>{});
  }
  throw std::logic_error("unknown unary op");
}
template <class G>
void with_op(BinaryOp op, G&& g) {
  using B = BinaryOp;
  switch (op) {
    case B::kAdd: return g(std::integral_constant<B, B::kAdd>{});
    case B::kSub: return g(std::integral_constant<B, B::kSub>{});
    case B::kMul: return g(std::integral_constant<B, B::kMul>{});
    case B::kDiv: return g(std::integral_constant<B, B::kDiv>{});
    case B::kPow: return g(std::integral_constant<B, B::kPow>{});
    case B::kMax: return g(std::integral_constant<B, B::kMax>{});
    case B::kMin: return g(std::integral_constant<B, B::kMin>{});
  }
  throw std::logic_error("unknown binary op");
}
template <class G>
void with_op(CompareOp op, G&& g) {
  using C = CompareOp;
  switch (op) {
    case C::kEq: return g(std::integral_constant<C, C::kEq>{});
    case C::kNe: return g(std::integral_constant<C, C::kNe>{});
    case C::kLt: return g(std::integral_constant<C, C::kLt>{});
    case C::kLe: return g(std::integral_constant<C, C::kLe>{});
    case C::kGt: return g(std::integral_constant<C, C::kGt>{});
    case C::kGe: return g(std::integral_constant<C, C::kGe>{});
  }
  throw std::logic_error("unknown comparison");
}

// One run of a kernel: y[i*sy] = f(x[i*sx]) for i < n. Unit and zero steps
// (dense and broadcast operands) get loops of their own, which vectorise.
template <class X, class Y, class F>
inline void map_row(const X* x, std::int64_t sx, Y* y, std::int64_t sy, std::int64_t n, F f) {
  if (sy == 1 && sx == 1) {
    for (std::int64_t i = 0; i < n; ++i) y[i] = f(x[i]);
  } else if (sy == 1 && sx == 0) {
    const Y v = f(*x);
    for (std::int64_t i = 0; i < n; ++i) y[i] = v;
  } else {
    for (std::int64_t i = 0; i < n; ++i) y[i * sy] = f(x[i * sx]);
  }
}

// y[i*sy] = f(x[i*sx], z[i*sz]) for i < n.
template <class X, class Z, class Y, class F>
inline void zip_row(const X* x, std::int64_t sx, const Z* z, std::int64_t sz, Y* y, std::int64_t sy,
                    std::int64_t n, F f) {
  if (sy == 1 && sx == 1 && sz == 1) {
    for (std::int64_t i = 0; i < n; ++i) y[i] = f(x[i], z[i]);
  } else if (sy == 1 && sx == 1 && sz == 0) {
    const Z b = *z;
    for (std::int64_t i = 0; i < n; ++i) y[i] = f(x[i], b);
  } else if (sy == 1 && sx == 0 && sz == 1) {
    const X a = *x;
    for (std::int64_t i = 0; i < n; ++i) y[i] = f(a, z[i]);
  } else {
    for (std::int64_t i = 0; i < n; ++i) y[i * sy] = f(x[i * sx], z[i * sz]);
  }
}

using Off2 = std::array<std::int64_t, 2>;
using Off3 = std::array<std::int64_t, 3>;

// run(x, sx, y, sy, n) over the runs of the merged loop nest of out = f(a),
// a broadcast to out's shape.
template <class X, class Y, class Run>
void map_runs(const TensorView& a, const TensorView& out, Run run) {
  const X* x = typed<X>(a);
  Y* y = typed<Y>(out);
  const std::array<Dims, 2> strides{broadcast_dims(a, out.shape), dims(out.strides)};
  detail::for_each_row<2>(out.shape, strides, {a.offset, out.offset},
                          [&](const Off2& o, const Off2& st, std::int64_t n) {
                            run(x + o[0], st[0], y + o[1], st[1], n);
                          });
}

// out = f(a) elementwise, a broadcast to out's shape.
template <class X, class Y, class F>
void map(const TensorView& a, const TensorView& out, F f) {
  map_runs<X, Y>(a, out, [&](const X* x, std::int64_t sx, Y* y, std::int64_t sy, std::int64_t n) {
    map_row(x, sx, y, sy, n, f);
  });
}

// run(x, sx, z, sz, y, sy, n) over the runs of out = f(a, b), both
// broadcast to out's shape.
template <class X, class Y, class Run>
void zip_runs(const TensorView& a, const TensorView& b, const TensorView& out, Run run) {
  const X* x = typed<X>(a);
  const X* z = typed<X>(b);
  Y* y = typed<Y>(out);
  detail::for_each_row<3>(
      out.shape,
      std::array<Dims, 3>{broadcast_dims(a, out.shape), broadcast_dims(b, out.shape), dims(out.strides)},
      {a.offset, b.offset, out.offset}, [&](const Off3& o, const Off3& st, std::int64_t n) {
        run(x + o[0], st[0], z + o[1], st[1], y + o[2], st[2], n);
      });
}

// out = f(a, b) elementwise, both broadcast to out's shape.
template <class X, class Y, class F>
void zip(const TensorView& a, const TensorView& b, const TensorView& out, F f) {
  zip_runs<X, Y>(a, b, out,
                 [&](const X* x, std::int64_t sx, const X* z, std::int64_t sz, Y* y, std::int64_t sy,
                     std::int64_t n) { zip_row(x, sx, z, sz, y, sy, n, f); });
}

// The vector math routine of `op`, where it has one (float dtypes).
std::optional<vmath::Fn> vector_fn(UnaryOp op) {
  switch (op) {
    case UnaryOp::kExp: return vmath::Fn::kExp;
    case UnaryOp::kLog: return vmath::Fn::kLog;
    case UnaryOp::kTanh: return vmath::Fn::kTanh;
    case UnaryOp::kSigmoid: return vmath::Fn::kSigmoid;
    case UnaryOp::kLog1p: return vmath::Fn::kLog1p;
    default: return std::nullopt;
  }
}

bool is_vector_op(UnaryOp op) { return vector_fn(op).has_value(); }

// One run of the vector math: y[i*sy] = op(x[i*sx]) (is_vector_op(op)).
template <class T>
void vector_unary_row(UnaryOp op, const T* x, std::int64_t sx, T* y, std::int64_t sy, std::int64_t n) {
  const vmath::Fn fn = *vector_fn(op);
  auto dense = [&](const T* xs, T* ys, std::int64_t m) { vmath::apply(fn, xs, ys, m); };
  if (sx == 1 && sy == 1) {
    dense(x, y, n);
    return;
  }
  constexpr std::int64_t kBlock = 256;
  T buf[kBlock];
  for (std::int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const std::int64_t m = std::min(kBlock, n - i0);
    for (std::int64_t k = 0; k < m; ++k) buf[k] = x[(i0 + k) * sx];
    dense(buf, buf, m);
    for (std::int64_t k = 0; k < m; ++k) y[(i0 + k) * sy] = buf[k];
  }
}

// One run of pow (float dtypes): y[i*sy] = pow(x[i*sx], z[i*sz]) through
// vmath::pow, directly for unit and zero steps, else through stack blocks.
template <class T>
void vector_pow_row(const T* x, std::int64_t sx, const T* z, std::int64_t sz, T* y, std::int64_t sy,
                    std::int64_t n) {
  if (sy == 1 && (sx == 0 || sx == 1) && (sz == 0 || sz == 1)) {
    vmath::pow(x, sx, z, sz, y, n);
    return;
  }
  constexpr std::int64_t kBlock = 256;
  T bx[kBlock];
  T bz[kBlock];
  for (std::int64_t i0 = 0; i0 < n; i0 += kBlock) {
    const std::int64_t m = std::min(kBlock, n - i0);
    for (std::int64_t k = 0; k < m; ++k) {
      bx[k] = x[(i0 + k) * sx];
      bz[k] = z[(i0 + k) * sz];
    }
    vmath::pow(bx, 1, bz, 1, bx, m);
    for (std::int64_t k = 0; k < m; ++k) y[(i0 + k) * sy] = bx[k];
  }
}

// pow with one scalar operand: s ** x[i*sx] when scalar_first, else x[i*sx] ** s.
template <class T>
void scalar_pow_row(const T& s, bool scalar_first, const T* x, std::int64_t sx, T* y, std::int64_t sy,
                    std::int64_t n) {
  if (scalar_first) {
    vector_pow_row(&s, 0, x, sx, y, sy, n);
  } else {
    vector_pow_row(x, sx, &s, 0, y, sy, n);
  }
}

// exp, log, tanh, sigmoid and log1p of float32/float64 through SLEEF's vector
// routines: unit-step runs directly, strided runs through a stack block.
// sigmoid keeps its definition, 1 / (1 + exp(-x)), with the vector exp,
// in one pass per vector (three passes over a run cost 1.3 ms of 5.1 on a
// fused sigmoid(x * w + b) of 16M float32).
template <class T>
void vector_unary(UnaryOp op, const TensorView& a, const TensorView& out) {
  map_runs<T, T>(a, out, [op](const T* x, std::int64_t sx, T* y, std::int64_t sy, std::int64_t n) {
    vector_unary_row<T>(op, x, sx, y, sy, n);
  });
}

}  // namespace

const char* vector_math_isa() noexcept { return vmath::isa(); }

void unary(UnaryOp op, const TensorView& a, const TensorView& out) {
  dispatch(out.dtype, [&]<class T>() {
    if constexpr (std::is_floating_point_v<T>) {
      if (is_vector_op(op)) {
        vector_unary<T>(op, a, out);
        return;
      }
    }
    with_op(op, [&](auto c) {
      map<T, T>(a, out, [](T v) { return apply_unary<T>(decltype(c)::value, v); });
    });
  });
}

void binary(BinaryOp op, const TensorView& a, const TensorView& b, const TensorView& out) {
  dispatch(out.dtype, [&]<class T>() {
    if constexpr (std::is_floating_point_v<T>) {
      if (op == BinaryOp::kPow) {
        zip_runs<T, T>(a, b, out, vector_pow_row<T>);
        return;
      }
    }
    with_op(op, [&](auto c) {
      zip<T, T>(a, b, out, [](T u, T v) { return apply_binary<T>(decltype(c)::value, u, v); });
    });
  });
}

void binary_scalar(BinaryOp op, const TensorView& a, double scalar, bool scalar_first,
                   const TensorView& out) {
  dispatch(out.dtype, [&]<class T>() {
    const T s = from_double<T>(scalar);
    if (squares(op, s, scalar_first)) {
      map<T, T>(a, out, [](T v) { return static_cast<T>(v * v); });
      return;
    }
    if constexpr (std::is_floating_point_v<T>) {
      if (op == BinaryOp::kPow) {
        map_runs<T, T>(a, out, [&](const T* x, std::int64_t sx, T* y, std::int64_t sy, std::int64_t n) {
          scalar_pow_row(s, scalar_first, x, sx, y, sy, n);
        });
        return;
      }
    }
    with_op(op, [&](auto c) {
      constexpr BinaryOp o = decltype(c)::value;
      if (scalar_first) {
        map<T, T>(a, out, [s](T v) { return apply_binary<T>(o, s, v); });
      } else {
        map<T, T>(a, out, [s](T v) { return apply_binary<T>(o, v, s); });
      }
    });
  });
}

void compare(CompareOp op, const TensorView& a, const TensorView& b, const TensorView& out) {
  dispatch(a.dtype, [&]<class T>() {
    with_op(op, [&](auto c) {
      zip<T, bool>(a, b, out, [](T u, T v) { return apply_compare<T>(decltype(c)::value, u, v); });
    });
  });
}

void compare_scalar(CompareOp op, const TensorView& a, double scalar, const TensorView& out) {
  dispatch(a.dtype, [&]<class T>() {
    with_op(op, [&](auto c) {
      // compare in double so that x < 0.5 means what it says for ints
      map<T, bool>(a, out, [scalar](T v) {
        return apply_compare<double>(decltype(c)::value, static_cast<double>(v), scalar);
      });
    });
  });
}

namespace {

// where over a run whose operands each step by 0 or 1 (one element
// broadcast, or dense) into a dense result, with the steps as constants.
// Both values are loaded whatever the condition and the choice is made on
// their bits with a mask (all ones where the condition holds), a loop the
// compiler vectorises. `c[i] ? x[i] : z[i]` stayed a scalar loop with a
// branch per element, mispredicted half the time on a random mask
// (bench_ndarray's `workload=where`: 4.6 GB/s, now 29-32). The bits are
// copied, never converted, so NaN payloads and the sign of zero pass through.
template <class T>
void where_steps(const bool* c, std::int64_t sc, const T* x, std::int64_t sx, const T* z, std::int64_t sz, T* y,
                 std::int64_t n) {
  auto run = [&]<int C, int X, int Z>() {
    using Bits = std::conditional_t<sizeof(T) == 8, std::uint64_t,
                                    std::conditional_t<sizeof(T) == 4, std::uint32_t, std::uint8_t>>;
    for (std::int64_t i = 0; i < n; ++i) {
      const Bits a = std::bit_cast<Bits>(x[i * X]);
      const Bits b = std::bit_cast<Bits>(z[i * Z]);
      const Bits m = Bits{0} - static_cast<Bits>(c[i * C]);  // all ones where true
      y[i] = std::bit_cast<T>(static_cast<Bits>((a & m) | (b & ~m)));
    }
  };
  switch ((sc == 1 ? 4 : 0) + (sx == 1 ? 2 : 0) + (sz == 1 ? 1 : 0)) {
    case 0: run.template operator()<0, 0, 0>(); return;
    case 1: run.template operator()<0, 0, 1>(); return;
    case 2: run.template operator()<0, 1, 0>(); return;
    case 3: run.template operator()<0, 1, 1>(); return;
    case 4: run.template operator()<1, 0, 0>(); return;
    case 5: run.template operator()<1, 0, 1>(); return;
    case 6: run.template operator()<1, 1, 0>(); return;
    default: run.template operator()<1, 1, 1>(); return;
  }
}

bool unit_or_zero(std::int64_t step) { return step == 0 || step == 1; }

}  // namespace

void where(const TensorView& cond, const TensorView& a, const TensorView& b,
           const TensorView& out) {
  const bool* c = typed<bool>(cond);
  dispatch(out.dtype, [&]<class T>() {
    const T* x = typed<T>(a);
    const T* z = typed<T>(b);
    T* y = typed<T>(out);
    using Off4 = std::array<std::int64_t, 4>;
    detail::for_each_row<4>(
        out.shape,
        std::array<Dims, 4>{broadcast_dims(cond, out.shape), broadcast_dims(a, out.shape),
                            broadcast_dims(b, out.shape), dims(out.strides)},
        {cond.offset, a.offset, b.offset, out.offset}, [&](const Off4& o, const Off4& st, std::int64_t n) {
          const bool* cc = c + o[0];
          const T* xx = x + o[1];
          const T* zz = z + o[2];
          T* yy = y + o[3];
          if (st[3] == 1 && unit_or_zero(st[0]) && unit_or_zero(st[1]) && unit_or_zero(st[2])) {
            where_steps(cc, st[0], xx, st[1], zz, st[2], yy, n);
          } else {
            for (std::int64_t i = 0; i < n; ++i) {
              const T u = xx[i * st[1]];
              const T v = zz[i * st[2]];
              yy[i * st[3]] = cc[i * st[0]] ? u : v;
            }
          }
        });
  });
}

void copy_cast(const TensorView& a, const TensorView& out) {
  dispatch(a.dtype, [&]<class S>() {
    dispatch(out.dtype, [&]<class D>() { map<S, D>(a, out, [](S v) { return convert_value<D>(v); }); });
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
      for (std::int64_t i = i0; i < i1; ++i) y[i] = from_double<T>(ops::detail::arange_value(start, step, i));
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

// The flat runs of runs.hpp: the kernels' own row functions on one run.
// They are the fused interpreter's inner loops, where a step's operands are
// in cache and the arithmetic is the cost, so each is compiled for the
// baseline ISA and for AVX2 (LAZYDAG_RUN_CLONES, iterate.hpp). Both clones
// compute the same bits as the kernels: IEEE operations element by element,
// no contraction (AVX2 brings no FMA), the same SLEEF routines (vmath
// dispatches by itself).
namespace detail {

LAZYDAG_RUN_CLONES void unary_run(UnaryOp op, DType t, const void* x, std::int64_t sx, void* y, std::int64_t n) {
  dispatch(t, [&]<class T>() {
    const T* xs = static_cast<const T*>(x);
    T* ys = static_cast<T*>(y);
    if constexpr (std::is_floating_point_v<T>) {
      if (is_vector_op(op)) {
        vector_unary_row<T>(op, xs, sx, ys, 1, n);
        return;
      }
    }
    with_op(op, [&](auto c) { map_row(xs, sx, ys, 1, n, [](T v) { return apply_unary<T>(decltype(c)::value, v); }); });
  });
}

LAZYDAG_RUN_CLONES void binary_run(BinaryOp op, DType t, const void* x, std::int64_t sx, const void* z, std::int64_t sz, void* y,
                std::int64_t n) {
  dispatch(t, [&]<class T>() {
    if constexpr (std::is_floating_point_v<T>) {
      if (op == BinaryOp::kPow) {
        vector_pow_row(static_cast<const T*>(x), sx, static_cast<const T*>(z), sz, static_cast<T*>(y), 1, n);
        return;
      }
    }
    with_op(op, [&](auto c) {
      zip_row(static_cast<const T*>(x), sx, static_cast<const T*>(z), sz, static_cast<T*>(y), 1, n,
              [](T u, T v) { return apply_binary<T>(decltype(c)::value, u, v); });
    });
  });
}

LAZYDAG_RUN_CLONES void scalar_run(BinaryOp op, DType t, const void* x, std::int64_t sx, double scalar, bool scalar_first, void* y,
                std::int64_t n) {
  dispatch(t, [&]<class T>() {
    const T s = from_double<T>(scalar);
    const T* xs = static_cast<const T*>(x);
    T* ys = static_cast<T*>(y);
    if (squares(op, s, scalar_first)) {
      map_row(xs, sx, ys, 1, n, [](T v) { return static_cast<T>(v * v); });
      return;
    }
    if constexpr (std::is_floating_point_v<T>) {
      if (op == BinaryOp::kPow) {
        scalar_pow_row(s, scalar_first, xs, sx, ys, 1, n);
        return;
      }
    }
    with_op(op, [&](auto c) {
      constexpr BinaryOp o = decltype(c)::value;
      if (scalar_first) {
        map_row(xs, sx, ys, 1, n, [s](T v) { return apply_binary<T>(o, s, v); });
      } else {
        map_row(xs, sx, ys, 1, n, [s](T v) { return apply_binary<T>(o, v, s); });
      }
    });
  });
}

LAZYDAG_RUN_CLONES void compare_run(CompareOp op, DType t, const void* x, std::int64_t sx, const void* z, std::int64_t sz, void* y,
                 std::int64_t n) {
  dispatch(t, [&]<class T>() {
    with_op(op, [&](auto c) {
      zip_row(static_cast<const T*>(x), sx, static_cast<const T*>(z), sz, static_cast<bool*>(y), 1, n,
              [](T u, T v) { return apply_compare<T>(decltype(c)::value, u, v); });
    });
  });
}

LAZYDAG_RUN_CLONES void compare_scalar_run(CompareOp op, DType t, const void* x, std::int64_t sx, double scalar, void* y,
                        std::int64_t n) {
  dispatch(t, [&]<class T>() {
    with_op(op, [&](auto c) {
      map_row(static_cast<const T*>(x), sx, static_cast<bool*>(y), 1, n, [scalar](T v) {
        return apply_compare<double>(decltype(c)::value, static_cast<double>(v), scalar);
      });
    });
  });
}

LAZYDAG_RUN_CLONES void where_run(DType t, const void* c, std::int64_t sc, const void* x, std::int64_t sx, const void* z,
               std::int64_t sz, void* y, std::int64_t n) {
  dispatch(t, [&]<class T>() {
    const bool* cc = static_cast<const bool*>(c);
    const T* xx = static_cast<const T*>(x);
    const T* zz = static_cast<const T*>(z);
    T* yy = static_cast<T*>(y);
    where_steps(cc, sc, xx, sx, zz, sz, yy, n);  // steps are 0 or 1 here
  });
}

LAZYDAG_RUN_CLONES void cast_run(DType from, DType to, const void* x, std::int64_t sx, void* y, std::int64_t n) {
  dispatch(from, [&]<class S>() {
    dispatch(to, [&]<class D>() {
      map_row(static_cast<const S*>(x), sx, static_cast<D*>(y), 1, n, [](S v) { return convert_value<D>(v); });
    });
  });
}

bool chainable(ChainOp::Kind kind, std::uint8_t op, DType t) noexcept {
  if (t != DType::kFloat32 && t != DType::kFloat64) return false;
  if (kind == ChainOp::Kind::kUnary) {
    const auto u = static_cast<UnaryOp>(op);
    return u == UnaryOp::kNeg || u == UnaryOp::kAbs || u == UnaryOp::kRelu;
  }
  switch (static_cast<BinaryOp>(op)) {
    case BinaryOp::kAdd:
    case BinaryOp::kSub:
    case BinaryOp::kMul:
    case BinaryOp::kDiv:
    case BinaryOp::kMax:
    case BinaryOp::kMin: return true;
    default: return false;
  }
}

namespace {

// 32-byte vectors in the baseline clone too (GCC splits them in two there).
using ChainF32 = float __attribute__((vector_size(32)));
using ChainF64 = double __attribute__((vector_size(32)));

}  // namespace

// Blocks of four 32-byte vectors: the running value stays in registers
// across the ops (the op is chosen once per block, not per element), so a
// chain of k ops stores its result once instead of k times. Four named
// vectors, each op spelled out for each (LAZYDAG_CHAIN4), no vector passed
// to a function: an array of vectors, or a reference chosen at run time,
// put the value on the stack, and a vector passed by value has another ABI
// without AVX than with it.
#define LAZYDAG_CHAIN1(A, B, expr) \
  {                                \
    V& a = A;                      \
    [[maybe_unused]] const V& b = B; \
    expr;                          \
  }
#define LAZYDAG_CHAIN4(expr)                                                                          \
  do {                                                                                                \
    LAZYDAG_CHAIN1(a0, b0, expr) LAZYDAG_CHAIN1(a1, b1, expr) LAZYDAG_CHAIN1(a2, b2, expr)            \
        LAZYDAG_CHAIN1(a3, b3, expr)                                                                  \
  } while (false)
LAZYDAG_RUN_CLONES void chain_run(DType t, const ChainOp* ops, int k, const void* x, std::int64_t sx, void* y,
                                  std::int64_t n) {
  dispatch(t, [&]<class T>() {
    if constexpr (std::is_floating_point_v<T>) {
      using V = std::conditional_t<std::is_same_v<T, float>, ChainF32, ChainF64>;
      constexpr std::int64_t kLanes = 32 / sizeof(T);
      constexpr std::int64_t kBlock = 4 * kLanes;
      const T* xs = static_cast<const T*>(x);
      T* ys = static_cast<T*>(y);
      const V zero{};
      // Every lane set to s: not zero + s, which makes -0.0 +0.0 and
      // quiets a signalling NaN.
      auto fill = [](V& v, T s) {
        for (std::int64_t l = 0; l < kLanes; ++l) v[l] = s;
      };
      std::int64_t i = 0;
      for (; i + kBlock <= n; i += kBlock) {
        V a0, a1, a2, a3;
        V b0{}, b1{}, b2{}, b3{};
        if (sx != 0) {
          std::memcpy(&a0, xs + i, sizeof(V));
          std::memcpy(&a1, xs + i + kLanes, sizeof(V));
          std::memcpy(&a2, xs + i + 2 * kLanes, sizeof(V));
          std::memcpy(&a3, xs + i + 3 * kLanes, sizeof(V));
        } else {
          fill(a0, xs[0]);
          a1 = a2 = a3 = a0;
        }
        for (int j = 0; j < k; ++j) {
          const ChainOp& o = ops[j];
          if (o.kind == ChainOp::Kind::kUnary) {
            switch (static_cast<UnaryOp>(o.op)) {
              case UnaryOp::kNeg: LAZYDAG_CHAIN4(a = -a); break;
              case UnaryOp::kAbs: LAZYDAG_CHAIN4(a = a < zero ? -a : a); break;
              case UnaryOp::kRelu: LAZYDAG_CHAIN4(a = a > zero ? a : zero); break;
              default: break;  // not chainable
            }
            continue;
          }
          if (o.kind == ChainOp::Kind::kScalar) {
            fill(b0, from_double<T>(o.scalar));
            b1 = b2 = b3 = b0;
          } else if (o.step != 0) {
            const T* bs = static_cast<const T*>(o.operand) + i;
            std::memcpy(&b0, bs, sizeof(V));
            std::memcpy(&b1, bs + kLanes, sizeof(V));
            std::memcpy(&b2, bs + 2 * kLanes, sizeof(V));
            std::memcpy(&b3, bs + 3 * kLanes, sizeof(V));
          } else {
            fill(b0, static_cast<const T*>(o.operand)[0]);
            b1 = b2 = b3 = b0;
          }
          // As apply_binary(op, l, r), with (l, r) = (b, a) when the
          // operand comes first, else (a, b).
          const bool f = o.operand_first;
          switch (static_cast<BinaryOp>(o.op)) {
            case BinaryOp::kAdd:
              if (f) LAZYDAG_CHAIN4(a = b + a); else LAZYDAG_CHAIN4(a = a + b);
              break;
            case BinaryOp::kSub:
              if (f) LAZYDAG_CHAIN4(a = b - a); else LAZYDAG_CHAIN4(a = a - b);
              break;
            case BinaryOp::kMul:
              if (f) LAZYDAG_CHAIN4(a = b * a); else LAZYDAG_CHAIN4(a = a * b);
              break;
            case BinaryOp::kDiv:
              if (f) LAZYDAG_CHAIN4(a = b / a); else LAZYDAG_CHAIN4(a = a / b);
              break;
            case BinaryOp::kMax:  // l < r ? r : l
              if (f) LAZYDAG_CHAIN4(a = b < a ? a : b); else LAZYDAG_CHAIN4(a = a < b ? b : a);
              break;
            case BinaryOp::kMin:  // r < l ? r : l
              if (f) LAZYDAG_CHAIN4(a = a < b ? a : b); else LAZYDAG_CHAIN4(a = b < a ? b : a);
              break;
            default: break;  // not chainable
          }
        }
        std::memcpy(ys + i, &a0, sizeof(V));
        std::memcpy(ys + i + kLanes, &a1, sizeof(V));
        std::memcpy(ys + i + 2 * kLanes, &a2, sizeof(V));
        std::memcpy(ys + i + 3 * kLanes, &a3, sizeof(V));
      }
      for (; i < n; ++i) {
        T v = xs[sx * i];
        for (int j = 0; j < k; ++j) {
          const ChainOp& o = ops[j];
          if (o.kind == ChainOp::Kind::kUnary) {
            v = apply_unary<T>(static_cast<UnaryOp>(o.op), v);
            continue;
          }
          const T b = o.kind == ChainOp::Kind::kScalar ? from_double<T>(o.scalar)
                                                       : static_cast<const T*>(o.operand)[o.step * i];
          const auto op = static_cast<BinaryOp>(o.op);
          v = o.operand_first ? apply_binary<T>(op, b, v) : apply_binary<T>(op, v, b);
        }
        ys[i] = v;
      }
    } else {
      throw std::logic_error("chain_run: not a floating dtype");  // chainable() refuses it
    }
  });
}
#undef LAZYDAG_CHAIN4
#undef LAZYDAG_CHAIN1

}  // namespace detail

}  // namespace lazydag::ops::cpu
