// CUDA elementwise kernels: unary and binary math with broadcasting,
// comparisons, where, dtype conversion, fills, counter-based random numbers
// (the CPU's generator), and the copies. One grid-stride kernel template over
// strided views; each op is a small functor.
#include "common.cuh"
#include "element_ops.cuh"

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
// one shape, each operand 16-byte aligned, or a single element broadcast.
// Each thread moves 16 bytes per operand per access (one 128-bit load or
// store: 4 float32 or int32, 2 float64 or int64) and applies the same
// element function as the general kernel, so results are identical.
template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <class T>
struct UnaryV {
  UnaryOp op;
  __device__ T operator()(T x, T) const { return apply_unary(op, x); }
};
template <class T>
struct BinaryV {
  BinaryOp op;
  __device__ T operator()(T x, T z) const { return apply_binary(op, x, z); }
};
template <class T>
struct ScalarV {
  BinaryOp op;
  T s;
  bool first;
  __device__ T operator()(T x, T) const { return first ? apply_binary(op, s, x) : apply_binary(op, x, s); }
};

template <class T, int V, class F>
__global__ void dense_kernel(const T* a, bool a_one, const T* b, bool b_one, T* y, std::int64_t n, F f) {
  const std::int64_t step = static_cast<std::int64_t>(blockDim.x) * gridDim.x;
  const std::int64_t first = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x;
  const std::int64_t packs = n / V;
  for (std::int64_t p = first; p < packs; p += step) {
    Pack<T, V> x;
    Pack<T, V> z;
    Pack<T, V> r;
    if (a_one) {
      for (int k = 0; k < V; ++k) x.v[k] = a[0];
    } else {
      x = reinterpret_cast<const Pack<T, V>*>(a)[p];
    }
    if (b_one) {
      for (int k = 0; k < V; ++k) z.v[k] = b[0];
    } else {
      z = reinterpret_cast<const Pack<T, V>*>(b)[p];
    }
    for (int k = 0; k < V; ++k) r.v[k] = f(x.v[k], z.v[k]);
    reinterpret_cast<Pack<T, V>*>(y)[p] = r;
  }
  for (std::int64_t i = packs * V + first; i < n; i += step) y[i] = f(a[a_one ? 0 : i], b[b_one ? 0 : i]);
}

// Launches the dense kernel when the operands allow it (b may be null: a
// unary or scalar op); false otherwise, launching nothing.
template <class T, class F>
bool try_dense(void* stream, const TensorView& a, const TensorView* b, const TensorView& out, F f,
               const char* name) {
  if constexpr (sizeof(T) != 4 && sizeof(T) != 8) {
    return false;
  } else {
    constexpr int V = 16 / static_cast<int>(sizeof(T));
    const std::int64_t n = numel(out.shape);
    auto at = [](const TensorView& v) { return static_cast<char*>(v.data) + v.offset * static_cast<std::int64_t>(sizeof(T)); };
    auto dense = [&](const TensorView& v) {
      return v.shape == out.shape && v.strides == contiguous_strides(v.shape) &&
             reinterpret_cast<std::uintptr_t>(at(v)) % 16 == 0;
    };
    if (n < V || !dense(out)) return false;
    const bool a_one = numel(a.shape) == 1;
    const bool b_one = b == nullptr || numel(b->shape) == 1;
    if ((!a_one && !dense(a)) || (!b_one && !dense(*b))) return false;
    const T* pa = reinterpret_cast<const T*>(at(a));
    const T* pb = b == nullptr ? pa : reinterpret_cast<const T*>(at(*b));
    detail::clear_last_error();
    dense_kernel<T, V, F><<<blocks_for((n + V - 1) / V), 256, 0, detail::as_stream(stream)>>>(
        pa, a_one, pb, b_one, reinterpret_cast<T*>(at(out)), n, f);
    check_launch(name);
    return true;
  }
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
    if (try_dense<T>(stream, a, nullptr, out, UnaryV<T>{op}, "unary kernel")) return;
    launch_map<2>(stream, {&a, &out}, out.shape, UnaryF<T>{ptr<T>(a), ptr<T>(out), op}, "unary kernel");
  });
}

void binary(void* stream, BinaryOp op, const TensorView& a, const TensorView& b, const TensorView& out) {
  dispatch(out.dtype, [&]<class T>() {
    if (try_dense<T>(stream, a, &b, out, BinaryV<T>{op}, "binary kernel")) return;
    launch_map<3>(stream, {&a, &b, &out}, out.shape, BinaryF<T>{ptr<T>(a), ptr<T>(b), ptr<T>(out), op},
                  "binary kernel");
  });
}

void binary_scalar(void* stream, BinaryOp op, const TensorView& a, double scalar, bool scalar_first,
                   const TensorView& out) {
  dispatch(out.dtype, [&]<class T>() {
    if (try_dense<T>(stream, a, nullptr, out, ScalarV<T>{op, convert_value<T>(scalar), scalar_first}, "scalar kernel")) {
      return;
    }
    launch_map<2>(stream, {&a, &out}, out.shape,
                  ScalarF<T>{ptr<T>(a), convert_value<T>(scalar), scalar_first, ptr<T>(out), op},
                  "scalar kernel");
  });
}

void compare(void* stream, CompareOp op, const TensorView& a, const TensorView& b, const TensorView& out) {
  dispatch(a.dtype, [&]<class T>() {
    launch_map<3>(stream, {&a, &b, &out}, out.shape, CompareF<T>{ptr<T>(a), ptr<T>(b), ptr<bool>(out), op},
                  "compare kernel");
  });
}

void compare_scalar(void* stream, CompareOp op, const TensorView& a, double scalar, const TensorView& out) {
  dispatch(a.dtype, [&]<class T>() {
    launch_map<2>(stream, {&a, &out}, out.shape,
                  CompareScalarF<T>{ptr<T>(a), convert_value<T>(scalar), ptr<bool>(out), op},
                  "compare kernel");
  });
}

void where(void* stream, const TensorView& cond, const TensorView& a, const TensorView& b,
           const TensorView& out) {
  dispatch(out.dtype, [&]<class T>() {
    launch_map<4>(stream, {&cond, &a, &b, &out}, out.shape,
                  WhereF<T>{ptr<bool>(cond), ptr<T>(a), ptr<T>(b), ptr<T>(out)}, "where kernel");
  });
}

void copy_cast(void* stream, const TensorView& a, const TensorView& out) {
  dispatch(a.dtype, [&]<class S>() {
    dispatch(out.dtype, [&]<class D>() {
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
