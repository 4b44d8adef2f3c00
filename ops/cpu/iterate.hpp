// Strided, broadcasting iteration for the CPU kernels: visits an output
// shape in runs of consecutive elements with the matching offsets and steps
// of N operands, in parallel (oneTBB) when the array is large.
#pragma once

#include <oneapi/tbb/blocked_range.h>
#include <oneapi/tbb/parallel_for.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>

#include <lazydag/ops/kernels.hpp>

#include "../src/nest.hpp"

// Loops whose operands are in cache, where the arithmetic is the cost, are
// compiled more than once on x86-64 with everything they call inlined into
// each copy (flatten), and the dynamic loader picks the copy for the
// running CPU (GCC's target_clones, an ifunc). The ops library is built
// with -ffp-contract=off, so no clone fuses a * b + c (AVX-512F has FMA)
// and every clone rounds as the baseline does: IEEE operations element by
// element.
//   LAZYDAG_RUN_CLONES    baseline and AVX2: the elementwise runs (an
//                         AVX-512 clone measured slower on a fused chain);
//   LAZYDAG_WIDE_CLONES   baseline, AVX2 and AVX-512F: loops of divisions
//                         and square roots (the optimizers' updates), where
//                         the wider unit pays.
// Not under ThreadSanitizer: a clone of a function of internal linkage is
// reached through a relocation the loader resolves when it loads the
// library, and the instrumented resolver then runs before the sanitizer's
// runtime has started (every program crashed at load).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_THREAD__)
#define LAZYDAG_RUN_CLONES __attribute__((target_clones("avx2", "default"), flatten))
#define LAZYDAG_WIDE_CLONES __attribute__((target_clones("avx512f", "avx2", "default"), flatten))
#else
#define LAZYDAG_RUN_CLONES
#define LAZYDAG_WIDE_CLONES
#endif

namespace lazydag::ops::cpu::detail {

/// tbb::parallel_for over [begin, end) with `grain`, calling f(lo, hi) per
/// chunk. The caller publishes with a release store that each chunk
/// acquires, and each chunk ends with a release increment that the caller
/// acquires after the loop (two atomics per chunk), so the happens-before
/// between the caller and the chunks does not rest on oneTBB's own spawn
/// and join alone.
///
/// Under ThreadSanitizer the chunks run in order on the calling thread:
/// oneTBB's join happens inside the uninstrumented libtbb.so, so TSan does
/// not see the workers' last write to parallel_for's wait node (on the
/// caller's stack) happen before the caller returns, and reports a race on
/// whatever the caller's next frames put in that stack slot. The engine's
/// own concurrency, which TSan is there to check, is unaffected.
template <class F>
void parallel_chunks(std::int64_t begin, std::int64_t end, std::int64_t grain, F&& f) {
#if defined(__SANITIZE_THREAD__)
  for (std::int64_t lo = begin; lo < end; lo += grain) f(lo, std::min(end, lo + grain));
#else
  std::atomic<bool> start{false};
  std::atomic<std::int64_t> done{0};
  start.store(true, std::memory_order_release);
  tbb::parallel_for(tbb::blocked_range<std::int64_t>(begin, end, grain),
                    [&](const tbb::blocked_range<std::int64_t>& r) {
                      (void)start.load(std::memory_order_acquire);
                      f(r.begin(), r.end());
                      done.fetch_add(1, std::memory_order_release);
                    });
  (void)done.load(std::memory_order_acquire);
#endif
}

/// Below this many elements a kernel runs on the calling thread alone.
inline constexpr std::int64_t kParallelElements = 1 << 15;

/// Strides of `v` broadcast to `out` (0 along broadcast dims), rank of out.
inline Strides broadcast_strides(const TensorView& v, const Shape& out) {
  Strides s(out.size(), 0);
  const std::size_t r = v.shape.size();
  const std::size_t rank = out.size();
  for (std::size_t i = 0; i < r; ++i) {
    s[rank - r + i] = v.shape[i] == 1 ? 0 : v.strides[i];
  }
  return s;
}

/// Strides in a fixed array: the kernels' loop nests take these, so that a
/// kernel call allocates nothing.
using Dims = std::array<std::int64_t, kMaxRank>;

/// broadcast_strides without the allocation.
inline Dims broadcast_dims(const TensorView& v, const Shape& out) {
  Dims s{};
  const std::size_t r = v.shape.size();
  const std::size_t rank = out.size();
  for (std::size_t i = 0; i < r; ++i) s[rank - r + i] = v.shape[i] == 1 ? 0 : v.strides[i];
  return s;
}

inline Dims dims(const Strides& strides) {
  Dims s{};
  std::copy(strides.begin(), strides.end(), s.begin());
  return s;
}

template <class T>
T* typed(const TensorView& v) {
  return static_cast<T*>(v.data);
}

using ops::detail::make_nest;
using ops::detail::Nest;

// for_each_row through the merged loop nest.
template <std::size_t N, class S, class Row>
void for_each_row_nested(const Shape& shape, const std::array<S, N>& strides,
                         const std::array<std::int64_t, N>& base, Row&& row, std::int64_t total) {
  const Nest<N> nest = make_nest<N>(shape, strides);
  const int inner_dim = nest.rank - 1;
  const std::int64_t inner = nest.shape[inner_dim];
  std::array<std::int64_t, N> step{};
  for (std::size_t k = 0; k < N; ++k) step[k] = nest.strides[k][inner_dim];
  // Elements [e0, e1) in row-major order of the nest.
  auto run = [&](std::int64_t e0, std::int64_t e1) {
    std::array<std::int64_t, kMaxRank> idx{};
    std::int64_t rem = e0 / inner;
    std::int64_t j = e0 % inner;
    std::array<std::int64_t, N> off = base;
    for (int d = inner_dim - 1; d >= 0; --d) {
      idx[d] = rem % nest.shape[d];
      rem /= nest.shape[d];
      for (std::size_t k = 0; k < N; ++k) off[k] += idx[d] * nest.strides[k][d];
    }
    for (std::int64_t e = e0; e < e1;) {
      const std::int64_t len = std::min(inner - j, e1 - e);
      std::array<std::int64_t, N> at = off;
      for (std::size_t k = 0; k < N; ++k) at[k] += j * step[k];
      row(at, step, len);
      e += len;
      j = 0;
      // next row: an odometer over the outer dims
      for (int d = inner_dim - 1; d >= 0; --d) {
        for (std::size_t k = 0; k < N; ++k) off[k] += nest.strides[k][d];
        if (++idx[d] < nest.shape[d]) break;
        for (std::size_t k = 0; k < N; ++k) off[k] -= nest.shape[d] * nest.strides[k][d];
        idx[d] = 0;
      }
    }
  };
  if (total < kParallelElements) {
    run(0, total);
    return;
  }
  parallel_chunks(0, total, kParallelElements, run);
}

/// Calls row(off, step, len) for every run of consecutive elements along
/// the innermost dim of the merged nest of `shape`: off[k] is operand k's
/// element offset of the run's first element, step[k] its step (0 along a
/// broadcast dim). In parallel chunks of about kParallelElements elements
/// when the array is large, split inside rows as well as across them, so a
/// one-row (dense) array is split too. Row functions whose steps are 0 or 1
/// are loops the compiler vectorises.
template <std::size_t N, class S, class Row>
void for_each_row(const Shape& shape, const std::array<S, N>& strides,
                  const std::array<std::int64_t, N>& base, Row&& row) {
  const std::int64_t total = numel(shape);
  if (total == 0) return;
  // Small, and every operand dense in row-major order (a dim of size 1 may
  // have any stride), as most of a model's small ops are: one run, with no
  // nest to build (a tenth of the instructions of a recorded x + 1 on one
  // element went to building it).
  if (total < kParallelElements) {
    bool dense = true;
    for (std::size_t k = 0; k < N && dense; ++k) {
      std::int64_t expect = 1;
      for (std::size_t d = shape.size(); d-- > 0 && dense;) {
        dense = shape[d] == 1 || strides[k][d] == expect;
        expect *= shape[d];
      }
    }
    if (dense) {
      std::array<std::int64_t, N> unit{};
      unit.fill(1);
      row(base, unit, total);
      return;
    }
  }
  for_each_row_nested<N>(shape, strides, base, row, total);
}


/// Calls f(i0, i1) over [0, n) in parallel chunks when n is large.
template <class F>
void parallel_range(std::int64_t n, F&& f) {
  if (n < kParallelElements) {
    f(std::int64_t{0}, n);
    return;
  }
  parallel_chunks(0, n, kParallelElements, f);
}

}  // namespace lazydag::ops::cpu::detail
