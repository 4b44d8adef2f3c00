// CPU reductions (sum, mean, max, min, argmax) over everything or one axis.
// Deterministic: partial results are combined in a fixed order, whatever the
// number of threads, so results never depend on the engine's configuration.
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "iterate.hpp"

namespace lazydag::ops::cpu {

namespace {

constexpr std::int64_t kChunk = 1 << 16;

template <class T>
using Acc = std::conditional_t<std::is_floating_point_v<T>, double, std::int64_t>;

// Integer sums wrap around (two's complement) rather than overflow into
// undefined behaviour; float sums accumulate in double.
template <class A>
void add_to(A& sum, A v) {
  if constexpr (std::is_integral_v<A>) {
    sum = static_cast<A>(static_cast<std::uint64_t>(sum) + static_cast<std::uint64_t>(v));
  } else {
    sum += v;
  }
}

// The running state of one reduction lane.
template <class T>
struct Partial {
  Acc<T> sum = 0;
  T best{};
  std::int64_t index = -1;  // of `best`; -1 while empty

  void add(T v, std::int64_t i) {
    add_to(sum, static_cast<Acc<T>>(v));
    if (index < 0) {
      best = v;
      index = i;
    }
  }
  void keep_max(T v, std::int64_t i) {
    if (index < 0 || v > best || (v != v && best == best)) {  // first NaN wins, like NumPy
      best = v;
      index = i;
    }
  }
  void keep_min(T v, std::int64_t i) {
    if (index < 0 || v < best || (v != v && best == best)) {
      best = v;
      index = i;
    }
  }
  void step(ReduceOp op, T v, std::int64_t i) {
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMean: add_to(sum, static_cast<Acc<T>>(v)); break;
      case ReduceOp::kMax:
      case ReduceOp::kArgmax: keep_max(v, i); break;
      case ReduceOp::kMin: keep_min(v, i); break;
    }
  }
  // Later chunks merge into earlier ones: ties keep the first index.
  void merge(ReduceOp op, const Partial& o) {
    if (o.index < 0 && (op == ReduceOp::kMax || op == ReduceOp::kMin || op == ReduceOp::kArgmax)) {
      return;
    }
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kMean: add_to(sum, o.sum); break;
      case ReduceOp::kMax:
      case ReduceOp::kArgmax: keep_max(o.best, o.index); break;
      case ReduceOp::kMin: keep_min(o.best, o.index); break;
    }
  }
  template <class O>
  O result(ReduceOp op, std::int64_t len) const {
    switch (op) {
      case ReduceOp::kSum: return static_cast<O>(sum);
      case ReduceOp::kMean:
        return static_cast<O>(len == 0 ? std::numeric_limits<double>::quiet_NaN()
                                       : static_cast<double>(sum) / static_cast<double>(len));
      case ReduceOp::kMax:
      case ReduceOp::kMin: return static_cast<O>(best);
      case ReduceOp::kArgmax: return static_cast<O>(index);
    }
    return O{};
  }
};

// max, min or argmax over the dense run x[i0, i1) into `p` (empty), with
// the result of p.step over the run in order. kLanes independent lanes
// (vectors of GCC's vector extension) keep their own extreme, a compare
// and a select per element, each lane in order, and each lane notes
// whether it saw a NaN; the extreme is then found among the lanes and, for
// argmax, its first index by a second scan, a block at a time. Without NaNs the extreme's
// value is the same whatever the order, and values that compare equal
// have the same bits except the two zeros: a run holding a NaN, or whose
// extreme is a zero (whose sign the first occurrence decides), takes the
// element-by-element loop instead. Element by element, a max of 16M
// float32 made a branch per element.
template <class T>
void extreme_run(ReduceOp op, const T* x, std::int64_t i0, std::int64_t i1, Partial<T>& p) {
  // GCC's vector extension at the baseline's width (16 bytes: SSE2),
  // kVecs of them side by side: kLanes values kept in registers.
  typedef T Vec __attribute__((vector_size(16)));
  constexpr std::int64_t kPer = 16 / sizeof(T);
  constexpr std::int64_t kVecs = 4;
  constexpr std::int64_t kLanes = kPer * kVecs;
  auto scalar = [&] {
    for (std::int64_t i = i0; i < i1; ++i) p.step(op, x[i], i);
  };
  if (i1 - i0 < 2 * kLanes) {
    scalar();
    return;
  }
  const bool min = op == ReduceOp::kMin;
  Vec acc[kVecs];
  std::memcpy(acc, x + i0, sizeof acc);
  constexpr bool kFloat = std::is_floating_point_v<T>;
  decltype(acc[0] != acc[0]) nan[kVecs] = {};  // lanes that saw a NaN (all bits set)
  if constexpr (kFloat) {
    for (std::int64_t q = 0; q < kVecs; ++q) nan[q] = acc[q] != acc[q];
  }
  std::int64_t i = i0 + kLanes;
  const std::int64_t whole = i0 + (i1 - i0) / kLanes * kLanes;
  auto scan = [&]<bool kMin>() {
    for (; i < whole; i += kLanes) {
      Vec v[kVecs];
      std::memcpy(v, x + i, sizeof v);
#pragma GCC unroll 4
      for (std::int64_t q = 0; q < kVecs; ++q) {
        if constexpr (kMin) {
          acc[q] = v[q] < acc[q] ? v[q] : acc[q];
        } else {
          acc[q] = v[q] > acc[q] ? v[q] : acc[q];
        }
        if constexpr (kFloat) nan[q] |= v[q] != v[q];
      }
    }
  };
  if (min) {
    scan.template operator()<true>();
  } else {
    scan.template operator()<false>();
  }
  T m = acc[0][0];
  bool any_nan = false;
  for (std::int64_t q = 0; q < kVecs; ++q) {
    for (std::int64_t j = 0; j < kPer; ++j) {
      const T a = acc[q][j];
      m = min ? (a < m ? a : m) : (a > m ? a : m);
      any_nan = any_nan || nan[q][j] != 0;
    }
  }
  for (; i < i1; ++i) {
    m = min ? (x[i] < m ? x[i] : m) : (x[i] > m ? x[i] : m);
    if constexpr (kFloat) any_nan = any_nan || x[i] != x[i];
  }
  if constexpr (kFloat) {
    if (any_nan || m == T{0}) {
      scalar();
      return;
    }
  }
  p.best = m;
  p.index = i0;  // max and min need only the value (index >= 0: not empty)
  if (op != ReduceOp::kArgmax) return;
  // The first index of m: a block of kLanes at a time, then within it.
  const Vec mv = Vec{} + m;
  std::int64_t k = i0;
  for (; k + kLanes <= i1; k += kLanes) {
    Vec v[kVecs];
    std::memcpy(v, x + k, sizeof v);
    auto hit = v[0] == mv;
    for (std::int64_t q = 1; q < kVecs; ++q) hit |= v[q] == mv;
    std::uint64_t bits[2];
    std::memcpy(bits, &hit, sizeof bits);
    if ((bits[0] | bits[1]) != 0) break;
  }
  while (x[k] != m) ++k;
  p.index = k;
}

}  // namespace

void reduce(ReduceOp op, const TensorView& a, bool all, int axis, const TensorView& out) {
  // `a` is contiguous (the frontend copies strided views first).
  const auto& s = a.shape;
  std::int64_t outer = 1;
  std::int64_t len = 1;
  std::int64_t inner = 1;
  for (int d = 0; d < static_cast<int>(s.size()); ++d) {
    if (all || d == axis) {
      len *= s[d];
    } else if (d < axis) {
      outer *= s[d];
    } else {
      inner *= s[d];
    }
  }
  if (all) {
    outer = 1;
    inner = 1;
  }
  dispatch(a.dtype, [&]<class T>() {
    dispatch(out.dtype, [&]<class O>() {
      if constexpr (std::is_same_v<T, bool> || std::is_same_v<O, bool>) {
        throw std::logic_error("reduction on bool");  // refused at record time
      } else {
        const T* x = detail::typed<T>(a) + a.offset;
        O* y = detail::typed<O>(out) + out.offset;
        if (outer * inner == 1) {
          // One lane, possibly long: fixed-size chunks in parallel, merged in order.
          const std::int64_t chunks = std::max<std::int64_t>(1, (len + kChunk - 1) / kChunk);
          std::vector<Partial<T>> part(static_cast<std::size_t>(chunks));
          auto run = [&](std::int64_t c0, std::int64_t c1) {
            for (std::int64_t c = c0; c < c1; ++c) {
              const std::int64_t end = std::min(len, (c + 1) * kChunk);
              std::int64_t i = c * kChunk;
              if (op == ReduceOp::kSum || op == ReduceOp::kMean) {
                // Four independent accumulators (a fixed order, so still
                // deterministic) instead of one long dependency chain.
                Acc<T> s0 = 0, s1 = 0, s2 = 0, s3 = 0;
                for (; i + 4 <= end; i += 4) {
                  add_to(s0, static_cast<Acc<T>>(x[i]));
                  add_to(s1, static_cast<Acc<T>>(x[i + 1]));
                  add_to(s2, static_cast<Acc<T>>(x[i + 2]));
                  add_to(s3, static_cast<Acc<T>>(x[i + 3]));
                }
                for (; i < end; ++i) add_to(s0, static_cast<Acc<T>>(x[i]));
                add_to(s0, s1);
                add_to(s2, s3);
                add_to(s0, s2);
                part[c].sum = s0;
                continue;
              }
              extreme_run(op, x, i, end, part[c]);
            }
          };
          if (chunks == 1) {
            run(0, 1);
          } else {
            detail::parallel_chunks(0, chunks, 1, run);
          }
          Partial<T> total = part[0];
          for (std::int64_t c = 1; c < chunks; ++c) total.merge(op, part[c]);
          y[0] = total.template result<O>(op, len);
          return;
        }
        const std::int64_t outputs = outer * inner;
        if ((op == ReduceOp::kSum || op == ReduceOp::kMean) && inner > 1) {
          // Sums over an axis that is not the last (a bias's gradient: the
          // batch axis): a block of neighbouring lanes at a time, each
          // output still the sum of its lane in order (the same bits as one
          // lane at a time), the rows read contiguously and the additions
          // vectorised across the block.
          constexpr std::int64_t kBlock = 256;
          const std::int64_t blocks = (inner + kBlock - 1) / kBlock;
          auto columns = [&](std::int64_t t0, std::int64_t t1) {
            Acc<T> acc[kBlock];
            for (std::int64_t t = t0; t < t1; ++t) {
              const std::int64_t o = t / blocks;
              const std::int64_t j0 = (t % blocks) * kBlock;
              const std::int64_t w = std::min(kBlock, inner - j0);
              for (std::int64_t j = 0; j < w; ++j) acc[j] = 0;
              const T* base = x + o * len * inner + j0;
              for (std::int64_t k = 0; k < len; ++k) {
                const T* row = base + k * inner;
                for (std::int64_t j = 0; j < w; ++j) add_to(acc[j], static_cast<Acc<T>>(row[j]));
              }
              O* dst = y + o * inner + j0;
              for (std::int64_t j = 0; j < w; ++j) {
                Partial<T> p;
                p.sum = acc[j];
                dst[j] = p.template result<O>(op, len);
              }
            }
          };
          if (outputs * len < detail::kParallelElements) {
            columns(0, outer * blocks);
          } else {
            const std::int64_t grain = std::max<std::int64_t>(
                1, detail::kParallelElements / std::max<std::int64_t>(len * std::min(kBlock, inner), 1));
            detail::parallel_chunks(0, outer * blocks, grain, columns);
          }
          return;
        }
        // One lane per output element, each reduced sequentially.
        auto lanes = [&](std::int64_t o0, std::int64_t o1) {
          for (std::int64_t o = o0; o < o1; ++o) {
            const T* lane = x + (o / inner) * len * inner + o % inner;
            Partial<T> p;
            if (inner == 1 && op != ReduceOp::kSum && op != ReduceOp::kMean) {
              extreme_run(op, lane, 0, len, p);
            } else {
              for (std::int64_t k = 0; k < len; ++k) p.step(op, lane[k * inner], k);
            }
            y[o] = p.template result<O>(op, len);
          }
        };
        if (outputs * len < detail::kParallelElements) {
          lanes(0, outputs);
        } else {
          const std::int64_t grain =
              std::max<std::int64_t>(1, detail::kParallelElements / std::max<std::int64_t>(len, 1));
          detail::parallel_chunks(0, outputs, grain, lanes);
        }
      }
    });
  });
}

}  // namespace lazydag::ops::cpu
