// Vectorised transcendental math for the CPU kernels, from SLEEF: exp, log,
// tanh, sigmoid (1 / (1 + exp(-x)) in one pass), log1p and pow of float32
// and float64 runs, dispatched at run time to the widest instruction set the machine
// has (AVX-512F, AVX2 + FMA, SSE2).
#pragma once

#include <cstdint>

namespace lazydag::ops::cpu::vmath {

enum class Fn : std::uint8_t { kExp, kLog, kTanh, kSigmoid, kLog1p };

/// y[i] = f(x[i]) for i < n (y may be x). SLEEF's 1.0-ULP functions: every
/// element goes through the same vector routine (a short tail is padded),
/// so a value never depends on how the array was split across workers.
void apply(Fn f, const float* x, float* y, std::int64_t n);
void apply(Fn f, const double* x, double* y, std::int64_t n);

/// y[i] = pow(x[i * sx], e[i * se]) for i < n, with sx and se 0 (one
/// value for every i) or 1 (y may be x or e): SLEEF's 1.0-ULP pow (C99's
/// special values), except that an exponent of exactly 2 gives x * x,
/// correctly rounded. Every element goes through the same vector routine,
/// as in apply().
void pow(const float* x, std::int64_t sx, const float* e, std::int64_t se, float* y, std::int64_t n);
void pow(const double* x, std::int64_t sx, const double* e, std::int64_t se, double* y, std::int64_t n);

/// "avx512f", "avx2" or "sse2": the routines apply() uses on this machine.
const char* isa() noexcept;

}  // namespace lazydag::ops::cpu::vmath
