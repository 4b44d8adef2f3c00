// SLEEF's vector routines behind one call per run of elements. Each
// instruction set gets its own loop, compiled for that target only (the
// library is built for the x86-64 baseline); the choice is made once, from
// the CPU's feature bits. Other architectures use SLEEF's scalar routines.
#include "vmath.hpp"

#include <sleef.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

namespace lazydag::ops::cpu::vmath {

namespace {

#if defined(__x86_64__) && defined(__GNUC__)

}  // namespace

// sleef.h declares its AVX2 and AVX-512 routines only when the including
// file is compiled for those targets; this one is built for the baseline
// and calls them from functions compiled for their target, so it declares
// the ones it uses (signatures as in sleef.h 3.5).
// The attributes tell the compiler these take their vectors in the
// registers of that target (clang refuses the call otherwise).
#define LAZYDAG_AVX512 __attribute__((target("avx512f")))
#define LAZYDAG_AVX2 __attribute__((target("avx2,fma")))
extern "C" {
LAZYDAG_AVX512 __m512 Sleef_expf16_u10avx512f(__m512);
LAZYDAG_AVX512 __m512 Sleef_logf16_u10avx512f(__m512);
LAZYDAG_AVX512 __m512 Sleef_tanhf16_u10avx512f(__m512);
LAZYDAG_AVX512 __m512 Sleef_log1pf16_u10avx512f(__m512);
LAZYDAG_AVX512 __m512d Sleef_expd8_u10avx512f(__m512d);
LAZYDAG_AVX512 __m512d Sleef_logd8_u10avx512f(__m512d);
LAZYDAG_AVX512 __m512d Sleef_tanhd8_u10avx512f(__m512d);
LAZYDAG_AVX512 __m512d Sleef_log1pd8_u10avx512f(__m512d);
LAZYDAG_AVX2 __m256 Sleef_expf8_u10avx2(__m256);
LAZYDAG_AVX2 __m256 Sleef_logf8_u10avx2(__m256);
LAZYDAG_AVX2 __m256 Sleef_tanhf8_u10avx2(__m256);
LAZYDAG_AVX2 __m256 Sleef_log1pf8_u10avx2(__m256);
LAZYDAG_AVX2 __m256d Sleef_expd4_u10avx2(__m256d);
LAZYDAG_AVX2 __m256d Sleef_logd4_u10avx2(__m256d);
LAZYDAG_AVX2 __m256d Sleef_tanhd4_u10avx2(__m256d);
LAZYDAG_AVX2 __m256d Sleef_log1pd4_u10avx2(__m256d);
LAZYDAG_AVX512 __m512 Sleef_powf16_u10avx512f(__m512, __m512);
LAZYDAG_AVX512 __m512d Sleef_powd8_u10avx512f(__m512d, __m512d);
LAZYDAG_AVX2 __m256 Sleef_powf8_u10avx2(__m256, __m256);
LAZYDAG_AVX2 __m256d Sleef_powd4_u10avx2(__m256d, __m256d);
}

namespace {

// A loop over full vectors, then the tail through a zero-padded vector.
#define LAZYDAG_VLOOP(NAME, T, W, VEC, LOAD, STORE, FN, TARGET)          \
  TARGET void NAME(const T* x, T* y, std::int64_t n) {                  \
    std::int64_t i = 0;                                                 \
    for (; i + (W) <= n; i += (W)) STORE(y + i, FN(LOAD(x + i)));       \
    if (i < n) {                                                        \
      alignas(64) T buf[W] = {};                                        \
      std::memcpy(buf, x + i, static_cast<std::size_t>(n - i) * sizeof(T)); \
      STORE(buf, FN(LOAD(buf)));                                        \
      std::memcpy(y + i, buf, static_cast<std::size_t>(n - i) * sizeof(T)); \
    }                                                                   \
  }

#define LAZYDAG_SSE2

// sigmoid(x) = 1 / (1 + exp(-x)) per vector: the negation flips the sign
// bit (as the scalar -x does), then SLEEF's exp, one add and one division,
// each correctly rounded, so a value is the same as from separate passes.
LAZYDAG_AVX512 __m512 sigmoid_f16(__m512 x) {
  const __m512 one = _mm512_set1_ps(1.0F);
  const __m512 neg = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(x), _mm512_set1_epi32(INT32_MIN)));
  return _mm512_div_ps(one, _mm512_add_ps(one, Sleef_expf16_u10avx512f(neg)));
}
LAZYDAG_AVX512 __m512d sigmoid_d8(__m512d x) {
  const __m512d one = _mm512_set1_pd(1.0);
  const __m512d neg = _mm512_castsi512_pd(_mm512_xor_si512(_mm512_castpd_si512(x), _mm512_set1_epi64(INT64_MIN)));
  return _mm512_div_pd(one, _mm512_add_pd(one, Sleef_expd8_u10avx512f(neg)));
}
LAZYDAG_AVX2 __m256 sigmoid_f8(__m256 x) {
  const __m256 one = _mm256_set1_ps(1.0F);
  const __m256 neg = _mm256_xor_ps(x, _mm256_set1_ps(-0.0F));
  return _mm256_div_ps(one, _mm256_add_ps(one, Sleef_expf8_u10avx2(neg)));
}
LAZYDAG_AVX2 __m256d sigmoid_d4(__m256d x) {
  const __m256d one = _mm256_set1_pd(1.0);
  const __m256d neg = _mm256_xor_pd(x, _mm256_set1_pd(-0.0));
  return _mm256_div_pd(one, _mm256_add_pd(one, Sleef_expd4_u10avx2(neg)));
}
__m128 sigmoid_f4(__m128 x) {
  const __m128 one = _mm_set1_ps(1.0F);
  return _mm_div_ps(one, _mm_add_ps(one, Sleef_expf4_u10sse2(_mm_xor_ps(x, _mm_set1_ps(-0.0F)))));
}
__m128d sigmoid_d2(__m128d x) {
  const __m128d one = _mm_set1_pd(1.0);
  return _mm_div_pd(one, _mm_add_pd(one, Sleef_expd2_u10sse2(_mm_xor_pd(x, _mm_set1_pd(-0.0)))));
}

LAZYDAG_VLOOP(exp_f_512, float, 16, __m512, _mm512_loadu_ps, _mm512_storeu_ps, Sleef_expf16_u10avx512f, LAZYDAG_AVX512)
LAZYDAG_VLOOP(log_f_512, float, 16, __m512, _mm512_loadu_ps, _mm512_storeu_ps, Sleef_logf16_u10avx512f, LAZYDAG_AVX512)
LAZYDAG_VLOOP(tanh_f_512, float, 16, __m512, _mm512_loadu_ps, _mm512_storeu_ps, Sleef_tanhf16_u10avx512f, LAZYDAG_AVX512)
LAZYDAG_VLOOP(exp_d_512, double, 8, __m512d, _mm512_loadu_pd, _mm512_storeu_pd, Sleef_expd8_u10avx512f, LAZYDAG_AVX512)
LAZYDAG_VLOOP(log_d_512, double, 8, __m512d, _mm512_loadu_pd, _mm512_storeu_pd, Sleef_logd8_u10avx512f, LAZYDAG_AVX512)
LAZYDAG_VLOOP(tanh_d_512, double, 8, __m512d, _mm512_loadu_pd, _mm512_storeu_pd, Sleef_tanhd8_u10avx512f, LAZYDAG_AVX512)
LAZYDAG_VLOOP(log1p_f_512, float, 16, __m512, _mm512_loadu_ps, _mm512_storeu_ps, Sleef_log1pf16_u10avx512f, LAZYDAG_AVX512)
LAZYDAG_VLOOP(log1p_d_512, double, 8, __m512d, _mm512_loadu_pd, _mm512_storeu_pd, Sleef_log1pd8_u10avx512f, LAZYDAG_AVX512)
LAZYDAG_VLOOP(sigmoid_f_512, float, 16, __m512, _mm512_loadu_ps, _mm512_storeu_ps, sigmoid_f16, LAZYDAG_AVX512)
LAZYDAG_VLOOP(sigmoid_d_512, double, 8, __m512d, _mm512_loadu_pd, _mm512_storeu_pd, sigmoid_d8, LAZYDAG_AVX512)

LAZYDAG_VLOOP(exp_f_256, float, 8, __m256, _mm256_loadu_ps, _mm256_storeu_ps, Sleef_expf8_u10avx2, LAZYDAG_AVX2)
LAZYDAG_VLOOP(log_f_256, float, 8, __m256, _mm256_loadu_ps, _mm256_storeu_ps, Sleef_logf8_u10avx2, LAZYDAG_AVX2)
LAZYDAG_VLOOP(tanh_f_256, float, 8, __m256, _mm256_loadu_ps, _mm256_storeu_ps, Sleef_tanhf8_u10avx2, LAZYDAG_AVX2)
LAZYDAG_VLOOP(exp_d_256, double, 4, __m256d, _mm256_loadu_pd, _mm256_storeu_pd, Sleef_expd4_u10avx2, LAZYDAG_AVX2)
LAZYDAG_VLOOP(log_d_256, double, 4, __m256d, _mm256_loadu_pd, _mm256_storeu_pd, Sleef_logd4_u10avx2, LAZYDAG_AVX2)
LAZYDAG_VLOOP(tanh_d_256, double, 4, __m256d, _mm256_loadu_pd, _mm256_storeu_pd, Sleef_tanhd4_u10avx2, LAZYDAG_AVX2)
LAZYDAG_VLOOP(log1p_f_256, float, 8, __m256, _mm256_loadu_ps, _mm256_storeu_ps, Sleef_log1pf8_u10avx2, LAZYDAG_AVX2)
LAZYDAG_VLOOP(log1p_d_256, double, 4, __m256d, _mm256_loadu_pd, _mm256_storeu_pd, Sleef_log1pd4_u10avx2, LAZYDAG_AVX2)
LAZYDAG_VLOOP(sigmoid_f_256, float, 8, __m256, _mm256_loadu_ps, _mm256_storeu_ps, sigmoid_f8, LAZYDAG_AVX2)
LAZYDAG_VLOOP(sigmoid_d_256, double, 4, __m256d, _mm256_loadu_pd, _mm256_storeu_pd, sigmoid_d4, LAZYDAG_AVX2)

LAZYDAG_VLOOP(exp_f_128, float, 4, __m128, _mm_loadu_ps, _mm_storeu_ps, Sleef_expf4_u10sse2, LAZYDAG_SSE2)
LAZYDAG_VLOOP(log_f_128, float, 4, __m128, _mm_loadu_ps, _mm_storeu_ps, Sleef_logf4_u10sse2, LAZYDAG_SSE2)
LAZYDAG_VLOOP(tanh_f_128, float, 4, __m128, _mm_loadu_ps, _mm_storeu_ps, Sleef_tanhf4_u10sse2, LAZYDAG_SSE2)
LAZYDAG_VLOOP(exp_d_128, double, 2, __m128d, _mm_loadu_pd, _mm_storeu_pd, Sleef_expd2_u10sse2, LAZYDAG_SSE2)
LAZYDAG_VLOOP(log_d_128, double, 2, __m128d, _mm_loadu_pd, _mm_storeu_pd, Sleef_logd2_u10sse2, LAZYDAG_SSE2)
LAZYDAG_VLOOP(tanh_d_128, double, 2, __m128d, _mm_loadu_pd, _mm_storeu_pd, Sleef_tanhd2_u10sse2, LAZYDAG_SSE2)
LAZYDAG_VLOOP(log1p_f_128, float, 4, __m128, _mm_loadu_ps, _mm_storeu_ps, Sleef_log1pf4_u10sse2, LAZYDAG_SSE2)
LAZYDAG_VLOOP(log1p_d_128, double, 2, __m128d, _mm_loadu_pd, _mm_storeu_pd, Sleef_log1pd2_u10sse2, LAZYDAG_SSE2)
LAZYDAG_VLOOP(sigmoid_f_128, float, 4, __m128, _mm_loadu_ps, _mm_storeu_ps, sigmoid_f4, LAZYDAG_SSE2)
LAZYDAG_VLOOP(sigmoid_d_128, double, 2, __m128d, _mm_loadu_pd, _mm_storeu_pd, sigmoid_d2, LAZYDAG_SSE2)

// pow(x, e) per vector: SLEEF's pow, then x * x in the lanes whose
// exponent is exactly 2 (correctly rounded, as NumPy's x ** 2 and the
// scalar kernels' square loop; SLEEF's pow may be 1 ULP off there).
LAZYDAG_AVX512 __m512 pow_f16(__m512 x, __m512 e) {
  const __mmask16 two = _mm512_cmp_ps_mask(e, _mm512_set1_ps(2.0F), _CMP_EQ_OQ);
  return _mm512_mask_mul_ps(Sleef_powf16_u10avx512f(x, e), two, x, x);
}
LAZYDAG_AVX512 __m512d pow_d8(__m512d x, __m512d e) {
  const __mmask8 two = _mm512_cmp_pd_mask(e, _mm512_set1_pd(2.0), _CMP_EQ_OQ);
  return _mm512_mask_mul_pd(Sleef_powd8_u10avx512f(x, e), two, x, x);
}
LAZYDAG_AVX2 __m256 pow_f8(__m256 x, __m256 e) {
  const __m256 two = _mm256_cmp_ps(e, _mm256_set1_ps(2.0F), _CMP_EQ_OQ);
  return _mm256_blendv_ps(Sleef_powf8_u10avx2(x, e), _mm256_mul_ps(x, x), two);
}
LAZYDAG_AVX2 __m256d pow_d4(__m256d x, __m256d e) {
  const __m256d two = _mm256_cmp_pd(e, _mm256_set1_pd(2.0), _CMP_EQ_OQ);
  return _mm256_blendv_pd(Sleef_powd4_u10avx2(x, e), _mm256_mul_pd(x, x), two);
}
__m128 pow_f4(__m128 x, __m128 e) {
  const __m128 two = _mm_cmpeq_ps(e, _mm_set1_ps(2.0F));
  return _mm_or_ps(_mm_and_ps(two, _mm_mul_ps(x, x)), _mm_andnot_ps(two, Sleef_powf4_u10sse2(x, e)));
}
__m128d pow_d2(__m128d x, __m128d e) {
  const __m128d two = _mm_cmpeq_pd(e, _mm_set1_pd(2.0));
  return _mm_or_pd(_mm_and_pd(two, _mm_mul_pd(x, x)), _mm_andnot_pd(two, Sleef_powd2_u10sse2(x, e)));
}

// y[i] = FN(x[i * sx], z[i * sz]) with steps 0 or 1: full vectors, then
// the tail through zero-padded vectors (pow(0, 0) = 1: no special value).
#define LAZYDAG_VLOOP2(NAME, T, W, VEC, LOAD, SET1, STORE, FN, TARGET)                         \
  TARGET void NAME(const T* x, std::int64_t sx, const T* z, std::int64_t sz, T* y, std::int64_t n) { \
    const VEC x0 = SET1(*x);                                                                 \
    const VEC z0 = SET1(*z);                                                                 \
    std::int64_t i = 0;                                                                      \
    for (; i + (W) <= n; i += (W)) {                                                         \
      STORE(y + i, FN(sx != 0 ? LOAD(x + i) : x0, sz != 0 ? LOAD(z + i) : z0));              \
    }                                                                                        \
    if (i < n) {                                                                             \
      alignas(64) T bx[W] = {};                                                              \
      alignas(64) T bz[W] = {};                                                              \
      for (std::int64_t k = 0; k < n - i; ++k) {                                             \
        bx[k] = x[(i + k) * sx];                                                             \
        bz[k] = z[(i + k) * sz];                                                             \
      }                                                                                      \
      STORE(bx, FN(LOAD(bx), LOAD(bz)));                                                     \
      std::memcpy(y + i, bx, static_cast<std::size_t>(n - i) * sizeof(T));                  \
    }                                                                                        \
  }

LAZYDAG_VLOOP2(pow_f_512, float, 16, __m512, _mm512_loadu_ps, _mm512_set1_ps, _mm512_storeu_ps, pow_f16, LAZYDAG_AVX512)
LAZYDAG_VLOOP2(pow_d_512, double, 8, __m512d, _mm512_loadu_pd, _mm512_set1_pd, _mm512_storeu_pd, pow_d8, LAZYDAG_AVX512)
LAZYDAG_VLOOP2(pow_f_256, float, 8, __m256, _mm256_loadu_ps, _mm256_set1_ps, _mm256_storeu_ps, pow_f8, LAZYDAG_AVX2)
LAZYDAG_VLOOP2(pow_d_256, double, 4, __m256d, _mm256_loadu_pd, _mm256_set1_pd, _mm256_storeu_pd, pow_d4, LAZYDAG_AVX2)
LAZYDAG_VLOOP2(pow_f_128, float, 4, __m128, _mm_loadu_ps, _mm_set1_ps, _mm_storeu_ps, pow_f4, LAZYDAG_SSE2)
LAZYDAG_VLOOP2(pow_d_128, double, 2, __m128d, _mm_loadu_pd, _mm_set1_pd, _mm_storeu_pd, pow_d2, LAZYDAG_SSE2)

#undef LAZYDAG_VLOOP2
#undef LAZYDAG_VLOOP
#undef LAZYDAG_AVX512
#undef LAZYDAG_AVX2
#undef LAZYDAG_SSE2

using FloatLoop = void (*)(const float*, float*, std::int64_t);
using DoubleLoop = void (*)(const double*, double*, std::int64_t);
using FloatLoop2 = void (*)(const float*, std::int64_t, const float*, std::int64_t, float*, std::int64_t);
using DoubleLoop2 = void (*)(const double*, std::int64_t, const double*, std::int64_t, double*, std::int64_t);

struct Table {
  const char* isa;
  FloatLoop f[5];  // in the order of Fn
  DoubleLoop d[5];
  FloatLoop2 pow_f;
  DoubleLoop2 pow_d;
};

const Table& table() {
  static const Table t = [] {
    __builtin_cpu_init();
    // LAZYDAG_VMATH_ISA=avx2 or sse2 caps the choice (the tests run the
    // narrower loops on machines that have wider ones).
    const char* cap = std::getenv("LAZYDAG_VMATH_ISA");
    const bool no512 = cap != nullptr && (std::strcmp(cap, "avx2") == 0 || std::strcmp(cap, "sse2") == 0);
    const bool no256 = cap != nullptr && std::strcmp(cap, "sse2") == 0;
    if (!no512 && __builtin_cpu_supports("avx512f")) {
      return Table{"avx512f", {exp_f_512, log_f_512, tanh_f_512, sigmoid_f_512, log1p_f_512},
                   {exp_d_512, log_d_512, tanh_d_512, sigmoid_d_512, log1p_d_512}, pow_f_512, pow_d_512};
    }
    if (!no256 && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
      return Table{"avx2", {exp_f_256, log_f_256, tanh_f_256, sigmoid_f_256, log1p_f_256},
                   {exp_d_256, log_d_256, tanh_d_256, sigmoid_d_256, log1p_d_256}, pow_f_256, pow_d_256};
    }
    return Table{"sse2", {exp_f_128, log_f_128, tanh_f_128, sigmoid_f_128, log1p_f_128},
                   {exp_d_128, log_d_128, tanh_d_128, sigmoid_d_128, log1p_d_128}, pow_f_128, pow_d_128};
  }();
  return t;
}

}  // namespace

void apply(Fn f, const float* x, float* y, std::int64_t n) { table().f[static_cast<int>(f)](x, y, n); }
void apply(Fn f, const double* x, double* y, std::int64_t n) { table().d[static_cast<int>(f)](x, y, n); }
void pow(const float* x, std::int64_t sx, const float* e, std::int64_t se, float* y, std::int64_t n) {
  table().pow_f(x, sx, e, se, y, n);
}
void pow(const double* x, std::int64_t sx, const double* e, std::int64_t se, double* y, std::int64_t n) {
  table().pow_d(x, sx, e, se, y, n);
}
const char* isa() noexcept { return table().isa; }

#else  // scalar SLEEF elsewhere

}  // namespace

void apply(Fn f, const float* x, float* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    y[i] = f == Fn::kExp    ? Sleef_expf_u10(x[i])
           : f == Fn::kLog  ? Sleef_logf_u10(x[i])
           : f == Fn::kTanh ? Sleef_tanhf_u10(x[i])
           : f == Fn::kLog1p ? Sleef_log1pf_u10(x[i])
                            : 1.0F / (1.0F + Sleef_expf_u10(-x[i]));
  }
}
void apply(Fn f, const double* x, double* y, std::int64_t n) {
  for (std::int64_t i = 0; i < n; ++i) {
    y[i] = f == Fn::kExp    ? Sleef_exp_u10(x[i])
           : f == Fn::kLog  ? Sleef_log_u10(x[i])
           : f == Fn::kTanh ? Sleef_tanh_u10(x[i])
           : f == Fn::kLog1p ? Sleef_log1p_u10(x[i])
                            : 1.0 / (1.0 + Sleef_exp_u10(-x[i]));
  }
}
template <class T, class F>
void pow_scalar(const T* x, std::int64_t sx, const T* e, std::int64_t se, T* y, std::int64_t n, F p) {
  for (std::int64_t i = 0; i < n; ++i) {
    const T a = x[i * sx];
    const T b = e[i * se];
    y[i] = b == T(2) ? a * a : p(a, b);
  }
}
void pow(const float* x, std::int64_t sx, const float* e, std::int64_t se, float* y, std::int64_t n) {
  pow_scalar(x, sx, e, se, y, n, [](float a, float b) { return Sleef_powf_u10(a, b); });
}
void pow(const double* x, std::int64_t sx, const double* e, std::int64_t se, double* y, std::int64_t n) {
  pow_scalar(x, sx, e, se, y, n, [](double a, double b) { return Sleef_pow_u10(a, b); });
}
const char* isa() noexcept { return "scalar"; }

#endif

}  // namespace lazydag::ops::cpu::vmath
