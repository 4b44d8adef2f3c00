// The optimizers' element loops: compiled with the rest of the CPU kernels
// (-fno-math-errno and the vectoriser on, so the square root vectorises)
// and split over the workers in chunks.
#include <lazydag/ops/kernels.hpp>

#include <cmath>

#include "iterate.hpp"

namespace lazydag::ops::cpu {

namespace {

template <class T>
void adam_chunk(T* __restrict p, T* __restrict m, T* __restrict v, const T* __restrict g, std::int64_t lo,
                std::int64_t hi, const AdamStep& a) {
  const T b1 = static_cast<T>(a.beta1), b2 = static_cast<T>(a.beta2);
  const T step = static_cast<T>(a.step), rbc2 = static_cast<T>(a.rbc2);
  const T eps = static_cast<T>(a.eps), wd = static_cast<T>(a.weight_decay), shrink = static_cast<T>(a.shrink);
  if (a.decoupled) {
    for (std::int64_t i = lo; i < hi; ++i) {
      p[i] *= shrink;
      const T d = g[i];
      m[i] = b1 * m[i] + (1 - b1) * d;
      v[i] = b2 * v[i] + (1 - b2) * d * d;
      p[i] -= step * m[i] / (std::sqrt(v[i]) * rbc2 + eps);
    }
  } else {
    for (std::int64_t i = lo; i < hi; ++i) {
      const T d = g[i] + wd * p[i];
      m[i] = b1 * m[i] + (1 - b1) * d;
      v[i] = b2 * v[i] + (1 - b2) * d * d;
      p[i] -= step * m[i] / (std::sqrt(v[i]) * rbc2 + eps);
    }
  }
}

}  // namespace

void adam_step(DType t, void* p, void* m, void* v, const void* g, std::int64_t n, const AdamStep& a) {
  if (t != DType::kFloat32 && t != DType::kFloat64) throw InvalidArgument("adam_step: float32 or float64 only");
  detail::parallel_range(n, [&](std::int64_t lo, std::int64_t hi) {
    if (t == DType::kFloat64) {
      adam_chunk(static_cast<double*>(p), static_cast<double*>(m), static_cast<double*>(v),
                 static_cast<const double*>(g), lo, hi, a);
    } else {
      adam_chunk(static_cast<float*>(p), static_cast<float*>(m), static_cast<float*>(v),
                 static_cast<const float*>(g), lo, hi, a);
    }
  });
}

}  // namespace lazydag::ops::cpu
