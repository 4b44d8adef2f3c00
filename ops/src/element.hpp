// Per-element rules shared by the CPU kernels (cpu/) and the CUDA kernels
// (cuda/), compiled by g++ for the host and by nvcc for the device, so that
// both devices compute the same values: integer wrap-around, comparisons,
// dtype conversion and the counter-based random generator. Internal header.
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

#include <lazydag/ops/kernels.hpp>

#if defined(__CUDACC__)
#define LAZYDAG_HD __host__ __device__
#else
#define LAZYDAG_HD
#endif

namespace lazydag::ops::detail {

// Integer arithmetic wraps around (two's complement) instead of being
// undefined on overflow: the operation is done in the unsigned type.
template <class T>
LAZYDAG_HD T wrap_add(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
}
template <class T>
LAZYDAG_HD T wrap_sub(T a, T b) {
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<U>(a) - static_cast<U>(b)));
}
template <class T>
LAZYDAG_HD T wrap_mul(T a, T b) {
  using U = std::make_unsigned_t<T>;
  using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
  return static_cast<T>(static_cast<U>(static_cast<W>(static_cast<U>(a)) * static_cast<W>(static_cast<U>(b))));
}

template <class T>
LAZYDAG_HD bool apply_compare(CompareOp op, T a, T b) {
  switch (op) {
    case CompareOp::kEq: return a == b;
    case CompareOp::kNe: return a != b;
    case CompareOp::kLt: return a < b;
    case CompareOp::kLe: return a <= b;
    case CompareOp::kGt: return a > b;
    case CompareOp::kGe: return a >= b;
  }
  return false;
}

// Value conversion (astype, scalars, random numbers into integer arrays).
// Float-to-integer conversion is defined for every value (a plain cast of
// NaN or an out-of-range value is undefined behaviour): NaN becomes 0 and
// values beyond the type's range saturate. Anything to bool is `!= 0`.
template <class D, class S>
LAZYDAG_HD D convert_value(S v) {
  if constexpr (std::is_same_v<D, bool>) {
    return v != S(0);
  } else if constexpr (std::is_integral_v<D> && std::is_floating_point_v<S>) {
    static_assert(std::is_same_v<D, std::int32_t> || std::is_same_v<D, std::int64_t>,
                  "integer element types are int32 and int64");
    // Literal bounds: std::numeric_limits is not callable from device code.
    constexpr D lo = std::is_same_v<D, std::int32_t> ? D(-2147483647 - 1) : D(-9223372036854775807LL - 1);
    constexpr D hi = std::is_same_v<D, std::int32_t> ? D(2147483647) : D(9223372036854775807LL);
    if (v != v) return D(0);
    if (v <= static_cast<S>(lo)) return lo;
    if (v >= static_cast<S>(hi)) return hi;
    return static_cast<D>(v);
  } else {
    return static_cast<D>(v);
  }
}

// a * b and a + b each rounded once. nvcc contracts a * b + c into one FMA
// by default (--fmad=true), which rounds once where the CPU rounds twice:
// the device code of the shared formulas spells the two roundings out, so
// that both devices compute the same bits.
LAZYDAG_HD inline double mul_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
LAZYDAG_HD inline double add_rn(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}

// Element i of arange(start, step): start + i * step, rounded twice.
LAZYDAG_HD inline double arange_value(double start, double step, std::int64_t i) {
  return add_rn(start, mul_rn(static_cast<double>(i), step));
}

// splitmix64 of (seed, counter): a counter-based generator, so element i of
// a random array depends only on the seed and i, on every device.
LAZYDAG_HD inline std::uint64_t mix64(std::uint64_t seed, std::uint64_t counter) {
  std::uint64_t z = seed * 0x9e3779b97f4a7c15ULL + counter * 0xd1b54a32d192ed03ULL + 0x632be59bd9b4e019ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// Uniform in [0, 1) with 53 random bits.
LAZYDAG_HD inline double unit(std::uint64_t seed, std::uint64_t counter) {
  return static_cast<double>(mix64(seed, counter) >> 11) * 0x1.0p-53;
}

// Element i of random_uniform(low, high): exact on every device.
LAZYDAG_HD inline double uniform_value(std::uint64_t seed, std::int64_t i, double low, double high) {
  return add_rn(low, mul_rn(high - low, unit(seed, static_cast<std::uint64_t>(i))));
}

// Element i of random_normal(mean, stddev): Box-Muller on two counters per
// element; u1 in (0, 1] keeps log finite. Equal across devices up to the
// last bit of each device's sqrt/log/cos.
LAZYDAG_HD inline double normal_value(std::uint64_t seed, std::int64_t i, double mean, double stddev) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  const auto c = static_cast<std::uint64_t>(i) * 2;
  const double u1 = 1.0 - unit(seed, c);
  const double u2 = unit(seed, c + 1);
  return add_rn(mean, mul_rn(mul_rn(stddev, ::sqrt(-2.0 * ::log(u1))), ::cos(kTwoPi * u2)));
}

}  // namespace lazydag::ops::detail
