// CUDA elementwise kernels: unary and binary math with broadcasting,
// comparisons, where, dtype conversion, fills, counter-based random numbers
// (the CPU's generator), and the copies. One grid-stride kernel template over
// strided views; each op is a small functor.
#include "common.cuh"
#include "element_ops.cuh"

#include <algorithm>
#include <cmath>
#include <string>

namespace lazydag::ops::cuda {

using detail::blocks_for;
using detail::check_launch;
using detail::convert_value;
using detail::Indexer;
using detail::make_indexer;
using detail::apply_binary;
using detail::apply_unary;
using ops::detail::apply_compare;

namespace {

template <int N, class F>
__global__ void map_kernel(Indexer<N> ix, std::int64_t n, F f) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(blockDim.x) * gridDim.x) {
    std::int64_t o[N];
    ix.offsets(i, o);
    f(i, o);
  }
}

template <int N, class F>
void launch_map(void* stream, const TensorView* const (&views)[N], const Shape& shape, F f,
                const char* name) {
  const std::int64_t n = numel(shape);
  if (n == 0) return;
  const Indexer<N> ix = make_indexer<N>(views, shape);
  detail::clear_last_error();
  map_kernel<N, F><<<blocks_for(n), 256, 0, detail::as_stream(stream)>>>(ix, n, f);
  check_launch(name);
}

// The dense fast path: the output and every array operand contiguous with
// one shape and aligned to its pack, or a single element broadcast. Each
// thread moves V elements per operand per access, V = 16 bytes over the
// widest element type (one 128-bit load or store of the widest operand: 4
// float32 or int32, 2 float64 or int64; the narrower operands, a compare's
// bool result or where's mask, in one narrower access), and applies the
// same element function as the general kernel, so results are identical.
template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

// An operand of the dense kernel: contiguous over the output, or one
// element (`one`).
template <class T>
struct Dense {
  const T* p;
  bool one;
  template <int V>
  __device__ Pack<T, V> pack(std::int64_t i) const {  // elements i*V .. i*V + V - 1
    if (!one) return reinterpret_cast<const Pack<T, V>*>(p)[i];
    Pack<T, V> x;
    for (int k = 0; k < V; ++k) x.v[k] = p[0];
    return x;
  }
  __device__ T at(std::int64_t i) const { return p[one ? 0 : i]; }
};

// Element functions of three operands (the ops of fewer ignore the rest).
template <class T>
struct UnaryV {
  UnaryOp op;
  __device__ T operator()(T x, T, T) const { return apply_unary(op, x); }
};
template <class T>
struct BinaryV {
  BinaryOp op;
  __device__ T operator()(T x, T z, T) const { return apply_binary(op, x, z); }
};
template <class T>
struct ScalarV {
  BinaryOp op;
  T s;
  bool first;
  __device__ T operator()(T x, T, T) const { return first ? apply_binary(op, s, x) : apply_binary(op, x, s); }
};
template <class T>
struct CompareV {
  CompareOp op;
  __device__ bool operator()(T x, T z, T) const { return apply_compare(op, x, z); }
};
template <class T>
struct CompareScalarV {
  CompareOp op;
  T s;
  __device__ bool operator()(T x, T, T) const { return apply_compare(op, x, s); }
};
template <class T>
struct WhereV {
  __device__ T operator()(bool c, T x, T z) const { return c ? x : z; }
};
template <class S, class D>
struct CastV {
  __device__ D operator()(S x, S, S) const { return convert_value<D>(x); }
};

template <int V, class Y, class A, class B, class C, class F>
__global__ void dense_kernel(Y* y, std::int64_t n, F f, Dense<A> a, Dense<B> b, Dense<C> c) {
  const std::int64_t step = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  const std::int64_t first = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  const std::int64_t packs = n / V;
  for (std::int64_t p = first; p < packs; p += step) {
    const Pack<A, V> xa = a.template pack<V>(p);
    const Pack<B, V> xb = b.template pack<V>(p);
    const Pack<C, V> xc = c.template pack<V>(p);
    Pack<Y, V> r;
    for (int k = 0; k < V; ++k) r.v[k] = f(xa.v[k], xb.v[k], xc.v[k]);
    reinterpret_cast<Pack<Y, V>*>(y)[p] = r;
  }
  for (std::int64_t i = packs * V + first; i < n; i += step) y[i] = f(a.at(i), b.at(i), c.at(i));
}

// Launches the dense kernel for out = f(a, b, c) when the operands allow it
// (b and c may be null: an op of fewer operands; they then repeat a's first
// element, unread by f); false otherwise, launching nothing.
template <class Y, class A, class B = A, class C = A, class F>
bool try_dense(void* stream, const TensorView& out, F f, const char* name, const TensorView& a,
               const TensorView* b = nullptr, const TensorView* c = nullptr) {
  constexpr std::size_t widest = std::max({sizeof(Y), sizeof(A), sizeof(B), sizeof(C)});
  constexpr int V = static_cast<int>(16 / widest);
  const std::int64_t n = numel(out.shape);
  auto at = [](const TensorView& v, std::size_t size) {
    return static_cast<char*>(v.data) + v.offset * static_cast<std::int64_t>(size);
  };
  auto dense = [&](const TensorView& v, std::size_t size) {
    return v.shape == out.shape && v.strides == contiguous_strides(v.shape) &&
           reinterpret_cast<std::uintptr_t>(at(v, size)) % (size * V) == 0;
  };
  if (n < V || !dense(out, sizeof(Y))) return false;
  auto operand = [&]<class T>(const TensorView* v, Dense<T>& d) {
    if (v == nullptr) {
      d = Dense<T>{reinterpret_cast<const T*>(at(a, sizeof(A))), true};
      return true;
    }
    d = Dense<T>{reinterpret_cast<const T*>(at(*v, sizeof(T))), numel(v->shape) == 1};
    return d.one || dense(*v, sizeof(T));
  };
  Dense<A> da{};
  Dense<B> db{};
  Dense<C> dc{};
  if (!operand(&a, da) || !operand(b, db) || !operand(c, dc)) return false;
  detail::clear_last_error();
  dense_kernel<V, Y, A, B, C, F><<<blocks_for((n + V - 1) / V), 256, 0, detail::as_stream(stream)>>>(
      reinterpret_cast<Y*>(at(out, sizeof(Y))), n, f, da, db, dc);
  check_launch(name);
  return true;
}

template <class T>
struct UnaryF {
  const T* x;
  T* y;
  UnaryOp op;
  __device__ void operator()(std::int64_t, const std::int64_t (&o)[2]) const { y[o[1]] = apply_unary(op, x[o[0]]); }
};
template <class T>
struct BinaryF {
  const T* x;
  const T* z;
  T* y;
  BinaryOp op;
  __device__ void operator()(std::int64_t, const std::int64_t (&o)[3]) const {
    y[o[2]] = apply_binary(op, x[o[0]], z[o[1]]);
  }
};
template <class T>
struct ScalarF {
  const T* x;
  T s;
  bool first;
  T* y;
  BinaryOp op;
  __device__ void operator()(std::int64_t, const std::int64_t (&o)[2]) const {
    y[o[1]] = first ? apply_binary(op, s, x[o[0]]) : apply_binary(op, x[o[0]], s);
  }
};
template <class T>
struct CompareF {
  const T* x;
  const T* z;
  bool* y;
  CompareOp op;
  __device__ void operator()(std::int64_t, const std::int64_t (&o)[3]) const {
    y[o[2]] = apply_compare(op, x[o[0]], z[o[1]]);
  }
};
template <class T>
struct CompareScalarF {
  const T* x;
  T s;
  bool* y;
  CompareOp op;
  __device__ void operator()(std::int64_t, const std::int64_t (&o)[2]) const {
    y[o[1]] = apply_compare(op, x[o[0]], s);
  }
};
template <class T>
struct WhereF {
  const bool* c;
  const T* x;
  const T* z;
  T* y;
  __device__ void operator()(std::int64_t, const std::int64_t (&o)[4]) const {
    y[o[3]] = c[o[0]] ? x[o[1]] : z[o[2]];
  }
};
template <class S, class D>
struct CastF {
  const S* x;
  D* y;
  __device__ void operator()(std::int64_t, const std::int64_t (&o)[2]) const {
    y[o[1]] = convert_value<D>(x[o[0]]);
  }
};
template <class T>
struct FillF {
  T* y;
  T v;
  __device__ void operator()(std::int64_t, const std::int64_t (&o)[1]) const { y[o[0]] = v; }
};
template <class T>
struct ArangeF {
  T* y;
  double start;
  double step;
  __device__ void operator()(std::int64_t i, const std::int64_t (&o)[1]) const {
    y[o[0]] = convert_value<T>(ops::detail::arange_value(start, step, i));
  }
};

// The CPU's counter-based generator (../src/element.hpp): the same numbers
// for the same seed.
template <class T>
struct UniformF {
  T* y;
  std::uint64_t seed;
  double low;
  double high;
  __device__ void operator()(std::int64_t i, const std::int64_t (&o)[1]) const {
    y[o[0]] = convert_value<T>(ops::detail::uniform_value(seed, i, low, high));
  }
};
template <class T>
struct NormalF {
  T* y;
  std::uint64_t seed;
  double mean;
  double stddev;
  __device__ void operator()(std::int64_t i, const std::int64_t (&o)[1]) const {
    y[o[0]] = convert_value<T>(ops::detail::normal_value(seed, i, mean, stddev));
  }
};

template <class T>
T* ptr(const TensorView& v) {
  return static_cast<T*>(v.data);
}

}  // namespace

void unary(void* stream, UnaryOp op, const TensorView& a, const TensorView& out) {
  dispatch(out.dtype, [&]<class T>() {
    if (try_dense<T, T>(stream, out, UnaryV<T>{op}, "unary kernel", a)) return;
    launch_map<2>(stream, {&a, &out}, out.shape, UnaryF<T>{ptr<T>(a), ptr<T>(out), op}, "unary kernel");
  });
}

void binary(void* stream, BinaryOp op, const TensorView& a, const TensorView& b, const TensorView& out) {
  dispatch(out.dtype, [&]<class T>() {
    if (try_dense<T, T>(stream, out, BinaryV<T>{op}, "binary kernel", a, &b)) return;
    launch_map<3>(stream, {&a, &b, &out}, out.shape, BinaryF<T>{ptr<T>(a), ptr<T>(b), ptr<T>(out), op},
                  "binary kernel");
  });
}

void binary_scalar(void* stream, BinaryOp op, const TensorView& a, double scalar, bool scalar_first,
                   const TensorView& out) {
  dispatch(out.dtype, [&]<class T>() {
    if (try_dense<T, T>(stream, out, ScalarV<T>{op, convert_value<T>(scalar), scalar_first}, "scalar kernel", a)) {
      return;
    }
    launch_map<2>(stream, {&a, &out}, out.shape,
                  ScalarF<T>{ptr<T>(a), convert_value<T>(scalar), scalar_first, ptr<T>(out), op},
                  "scalar kernel");
  });
}

void compare(void* stream, CompareOp op, const TensorView& a, const TensorView& b, const TensorView& out) {
  dispatch(a.dtype, [&]<class T>() {
    if (try_dense<bool, T>(stream, out, CompareV<T>{op}, "compare kernel", a, &b)) return;
    launch_map<3>(stream, {&a, &b, &out}, out.shape, CompareF<T>{ptr<T>(a), ptr<T>(b), ptr<bool>(out), op},
                  "compare kernel");
  });
}

void compare_scalar(void* stream, CompareOp op, const TensorView& a, double scalar, const TensorView& out) {
  dispatch(a.dtype, [&]<class T>() {
    if (try_dense<bool, T>(stream, out, CompareScalarV<T>{op, convert_value<T>(scalar)}, "compare kernel", a)) return;
    launch_map<2>(stream, {&a, &out}, out.shape,
                  CompareScalarF<T>{ptr<T>(a), convert_value<T>(scalar), ptr<bool>(out), op},
                  "compare kernel");
  });
}

void where(void* stream, const TensorView& cond, const TensorView& a, const TensorView& b,
           const TensorView& out) {
  dispatch(out.dtype, [&]<class T>() {
    if (try_dense<T, bool, T, T>(stream, out, WhereV<T>{}, "where kernel", cond, &a, &b)) return;
    launch_map<4>(stream, {&cond, &a, &b, &out}, out.shape,
                  WhereF<T>{ptr<bool>(cond), ptr<T>(a), ptr<T>(b), ptr<T>(out)}, "where kernel");
  });
}

void copy_cast(void* stream, const TensorView& a, const TensorView& out) {
  dispatch(a.dtype, [&]<class S>() {
    dispatch(out.dtype, [&]<class D>() {
      if (try_dense<D, S>(stream, out, CastV<S, D>{}, "copy kernel", a)) return;
      launch_map<2>(stream, {&a, &out}, out.shape, CastF<S, D>{ptr<S>(a), ptr<D>(out)}, "copy kernel");
    });
  });
}

void fill(void* stream, const TensorView& out, double value) {
  dispatch(out.dtype, [&]<class T>() {
    launch_map<1>(stream, {&out}, out.shape, FillF<T>{ptr<T>(out), convert_value<T>(value)}, "fill kernel");
  });
}

void arange(void* stream, const TensorView& out, double start, double step) {
  dispatch(out.dtype, [&]<class T>() {
    launch_map<1>(stream, {&out}, out.shape, ArangeF<T>{ptr<T>(out), start, step}, "arange kernel");
  });
}

void random_uniform(void* stream, const TensorView& out, std::uint64_t seed, double low, double high) {
  dispatch(out.dtype, [&]<class T>() {
    launch_map<1>(stream, {&out}, out.shape, UniformF<T>{ptr<T>(out), seed, low, high}, "random kernel");
  });
}

void random_normal(void* stream, const TensorView& out, std::uint64_t seed, double mean, double stddev) {
  dispatch(out.dtype, [&]<class T>() {
    launch_map<1>(stream, {&out}, out.shape, NormalF<T>{ptr<T>(out), seed, mean, stddev}, "random kernel");
  });
}

void memcpy_async(void* stream, void* dst, const void* src, std::size_t bytes, int kind) {
  LAZYDAG_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, static_cast<cudaMemcpyKind>(kind), detail::as_stream(stream)),
                     "copy of " + std::to_string(bytes) + " bytes");
}

void memcpy_peer_async(void* stream, void* dst, int dst_device, const void* src, int src_device,
                       std::size_t bytes) {
  LAZYDAG_CUDA_CHECK(cudaMemcpyPeerAsync(dst, dst_device, src, src_device, bytes, detail::as_stream(stream)),
                     "peer copy gpu(" + std::to_string(src_device) + ") -> gpu(" + std::to_string(dst_device) + ")");
}

}  // namespace lazydag::ops::cuda
