// The CPU interpreter of fused elementwise programs: one pass over memory
// per tile. When every input is dense in the domain's layout, a single
// element, or dense over the domain's trailing dims and broadcast over the
// leading ones (a row of per-feature parameters), each step of a tile is a
// call of the unfused kernel's row function per dense run (runs.hpp);
// otherwise (columns, transposed or sliced views) each step runs
// the unfused op's whole kernel on tile-sized views (a slice of an input, of
// a kept result, or of per-thread scratch). Either way a fused program
// computes every element exactly as the separate ops would: same per-element
// arithmetic, same vector math. No JIT: the op list is interpreted per tile,
// and the tile is small enough that a step's operands are still in cache
// when the next step reads them.
#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include <lazydag/ops/kernels.hpp>

#include "iterate.hpp"
#include "runs.hpp"

namespace lazydag::ops::cpu {

namespace {

// Elements per tile: a float32 step result is 32 KiB, so the few values a
// step reads and writes stay in L1/L2 while the tile is worked on.
constexpr std::int64_t kTile = 16384;

// How an external input is sliced per tile: its strides over the tile's
// dims and the element offset of the tile's first row.
struct Slicing {
  Strides strides;
  std::int64_t base = 0;
  std::int64_t row_stride = 0;
};

void run_step(const FusedStep& s, const TensorView* const (&in)[3], const TensorView& out) {
  switch (s.kind) {
    case FusedStep::Kind::kUnary: unary(static_cast<UnaryOp>(s.op), *in[0], out); return;
    case FusedStep::Kind::kBinary: binary(static_cast<BinaryOp>(s.op), *in[0], *in[1], out); return;
    case FusedStep::Kind::kScalar:
      binary_scalar(static_cast<BinaryOp>(s.op), *in[0], s.scalar, s.scalar_first, out);
      return;
    case FusedStep::Kind::kCompare: compare(static_cast<CompareOp>(s.op), *in[0], *in[1], out); return;
    case FusedStep::Kind::kCompareScalar:
      compare_scalar(static_cast<CompareOp>(s.op), *in[0], s.scalar, out);
      return;
    case FusedStep::Kind::kWhere: where(*in[0], *in[1], *in[2], out); return;
    case FusedStep::Kind::kCast: copy_cast(*in[0], out); return;
  }
}


// A run's bookkeeping array of n values: on the stack up to N (every
// program the frontend records: at most 32 steps and 16 inputs), else on
// the heap. A tiny fused node otherwise paid a dozen mallocs per run.
template <class T, std::size_t N>
class LocalArray {
  static_assert(std::is_trivially_destructible_v<T>);

 public:
  explicit LocalArray(std::size_t n, const T& value = T{}) : n_(n) {
    if (n > N) {
      heap_ = std::make_unique<T[]>(n);
      p_ = heap_.get();
    } else {
      p_ = reinterpret_cast<T*>(inline_);  // only the first n are made
    }
    std::uninitialized_fill_n(p_, n, value);
  }
  LocalArray(const LocalArray&) = delete;
  LocalArray& operator=(const LocalArray&) = delete;
  T& operator[](std::size_t i) noexcept { return p_[i]; }
  const T& operator[](std::size_t i) const noexcept { return p_[i]; }
  [[nodiscard]] std::size_t size() const noexcept { return n_; }
  T* begin() noexcept { return p_; }
  T* end() noexcept { return p_ + n_; }
  [[nodiscard]] std::span<const T> span() const noexcept { return {p_, n_}; }

 private:
  alignas(T) unsigned char inline_[N * sizeof(T)];
  std::unique_ptr<T[]> heap_;
  T* p_;
  std::size_t n_;
};

constexpr std::size_t kLocalSteps = 32;
constexpr std::size_t kLocalInputs = 16;

// Scratch memory of the calling thread for one call of a tile loop, kept
// between calls; a call nested in another on the same thread (oneTBB may run
// another chunk here while a large kernel inside a tile waits for its own
// parallel loop) takes fresh memory instead, and so does a call after the
// thread's kept memory was destroyed: the engine runs what is still
// recorded when the process exits, on the main thread, after its
// thread_local objects are gone.
class Scratch {
 public:
  explicit Scratch(std::size_t doubles) : nested_(busy()) {
    busy() = true;
    std::vector<double>* k = nested_ ? nullptr : kept();
    std::vector<double>& mem = k != nullptr ? *k : fresh_;
    // 8 more doubles: the data starts at a cache line, so that a vector
    // load or store of a scratch value never splits one.
    if (mem.size() < doubles + 8) mem.resize(doubles + 8);
    const auto at = reinterpret_cast<std::uintptr_t>(mem.data());
    data_ = mem.data() + ((64 - at % 64) % 64) / sizeof(double);
  }
  ~Scratch() {
    if (!nested_) busy() = false;
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  [[nodiscard]] double* data() const { return data_; }

 private:
  // The thread's kept memory, or null once the thread has destroyed it.
  struct Kept {
    std::vector<double> mem;
    ~Kept() { gone() = true; }
  };
  static bool& gone() {
    thread_local bool g = false;  // trivially destructible: usable to the end
    return g;
  }
  static std::vector<double>* kept() {
    if (gone()) return nullptr;
    thread_local Kept k;
    return &k.mem;
  }
  static bool& busy() {
    thread_local bool b = false;
    return b;
  }
  bool nested_;
  std::vector<double> fresh_;
  double* data_ = nullptr;
};

// Elements per tile of the flat path: at most kFlatTile, halved (down to
// kMinFlatTile) while the bytes a tile touches (its elements of the dense
// inputs and kept results, and the scratch slots) exceed kFlatTileBytes,
// half of this machine's 48 KiB L1, so that a step's operands are still in
// L1 when the next step reads them, or while the tile's elements of the
// dense inputs read by steps outside chains (below) exceed kFlatReadBytes.
// Each such step reads its dense operand's run of the tile from memory at
// once, and the hardware prefetcher has only so many lines of each stream
// ready: a sweep of tile sizes on bench_ndarray's fused workloads found
// relu((x - m) / s * g + b) over full arrays (five dense inputs) fastest
// in tiles of 128, sigmoid(x * w + b) over full arrays (three) in tiles of
// 256, and both with row operands (one) in tiles of 1024
// (docs/benchmarks.md, "Fusion", has the A/B figures).
constexpr std::int64_t kFlatTile = 1024;
constexpr std::int64_t kMinFlatTile = 128;
constexpr std::size_t kFlatTileBytes = 24 << 10;
constexpr std::size_t kFlatReadBytes = 4 << 10;

// The shortest segment the flat path cuts: below it, inputs broadcast along
// short trailing dims go through the general path, which runs whole rows.
constexpr std::int64_t kMinSegment = 256;

// The period of `v` over the domain's flat index (see fused_flat): 1 for a
// single element; the size of the domain's trailing dims k.. when `v` is
// those dims in row-major order (any strides on dims of size 1) and has size
// 1 along the leading ones; 0 when it is neither (a column, a transposed or
// sliced view).
std::int64_t flat_period(const TensorView& v, const Shape& domain) {
  if (numel(v.shape) == 1) return 1;
  const std::size_t r = domain.size();
  const std::size_t vr = v.shape.size();
  if (vr > r) return 0;
  // Trailing dims equal to the domain's, from the right.
  std::size_t k = r;
  while (k > 0 && k - 1 >= r - vr && v.shape[k - 1 - (r - vr)] == domain[k - 1]) --k;
  for (std::size_t i = r - vr; i < k; ++i) {
    if (v.shape[i - (r - vr)] != 1) return 0;
  }
  // Row-major over its dims of size > 1.
  std::int64_t expect = 1;
  for (std::size_t i = vr; i-- > 0;) {
    if (v.shape[i] == 1) continue;
    if (v.strides[i] != expect) return 0;
    expect *= v.shape[i];
  }
  return expect;
}

// One step over a run of len elements: operands at a, b, c with steps 0
// or 1 (a's dtype is the one comparisons and casts read), result at y.
void run_segment(const FusedStep& s, const char* a, std::int64_t sa, DType ta, const char* b, std::int64_t sb,
                 const char* c, std::int64_t sc, char* y, std::int64_t len) {
  switch (s.kind) {
    case FusedStep::Kind::kUnary: detail::unary_run(static_cast<UnaryOp>(s.op), s.dtype, a, sa, y, len); return;
    case FusedStep::Kind::kBinary:
      detail::binary_run(static_cast<BinaryOp>(s.op), s.dtype, a, sa, b, sb, y, len);
      return;
    case FusedStep::Kind::kScalar:
      detail::scalar_run(static_cast<BinaryOp>(s.op), s.dtype, a, sa, s.scalar, s.scalar_first, y, len);
      return;
    case FusedStep::Kind::kCompare:
      detail::compare_run(static_cast<CompareOp>(s.op), ta, a, sa, b, sb, y, len);
      return;
    case FusedStep::Kind::kCompareScalar:
      detail::compare_scalar_run(static_cast<CompareOp>(s.op), ta, a, sa, s.scalar, y, len);
      return;
    case FusedStep::Kind::kWhere: detail::where_run(s.dtype, a, sa, b, sb, c, sc, y, len); return;
    case FusedStep::Kind::kCast: detail::cast_run(ta, s.dtype, a, sa, y, len); return;
  }
}

// The flat path: every input is, over the domain's flat index e, either one
// element (period 1), dense in the domain's layout (period n), or dense over
// the domain's trailing dims and broadcast over the leading ones (a row of
// per-feature parameters; period = the trailing dims' size): its element
// for e is at e % period. Tiles are cut into segments at multiples of the
// smallest period, so within a segment every value is a dense run of `len`
// elements (or one element repeated) and each step is one call of a
// kernel's row function per segment. Scratch slots are reused once a
// value's last reader has run.
void fused_flat(std::span<const FusedStep> steps, std::span<const TensorView> inputs,
                std::span<const std::int64_t> periods, std::span<const TensorView> outputs, std::int64_t n) {
  std::int64_t segment = n;  // the smallest period that is neither 1 nor n
  for (std::int64_t p : periods) {
    if (p > 1 && p < n) segment = std::min(segment, p);
  }
  const std::size_t ns = steps.size();
  LocalArray<std::size_t, kLocalSteps> last_use(ns, 0);
  for (std::size_t i = 0; i < ns; ++i) {
    for (int j = 0; j < steps[i].num_in; ++j) {
      const std::int32_t r = steps[i].in[static_cast<std::size_t>(j)];
      if (r >= 0) last_use[static_cast<std::size_t>(r)] = i;
    }
  }
  // Slot of each scratch value (slot_stride doubles each, below); -1 for
  // kept results.
  LocalArray<std::int64_t, kLocalSteps> slot(ns, -1);
  LocalArray<std::int64_t, kLocalSteps> free_slots(ns);  // a stack of num_free
  std::size_t num_free = 0;
  std::int64_t num_slots = 0;
  for (std::size_t i = 0; i < ns; ++i) {
    // Inputs whose last reader is step i are free for step i's result only
    // after it: a row function may not write where it reads another value.
    if (outputs[i].data == nullptr) {
      if (num_free == 0) {
        slot[i] = num_slots++;
      } else {
        slot[i] = free_slots[--num_free];
      }
    }
    for (int j = 0; j < steps[i].num_in; ++j) {
      const std::int32_t r = steps[i].in[static_cast<std::size_t>(j)];
      if (r >= 0 && last_use[static_cast<std::size_t>(r)] == i && slot[static_cast<std::size_t>(r)] >= 0 &&
          std::find(free_slots.begin(), free_slots.begin() + num_free, slot[static_cast<std::size_t>(r)]) ==
              free_slots.begin() + num_free) {
        free_slots[num_free++] = slot[static_cast<std::size_t>(r)];
      }
    }
  }
  // Chains: a run of steps, each of whose "value" operand is the step
  // before's result, read by it alone and not kept, and each an op
  // detail::chain_run computes (add, sub, mul, div, max, min with an array
  // or a scalar, neg, abs, relu, on float32 or float64), runs as one
  // chain_run per segment: the value stays in vector registers from the
  // first op to the last instead of being stored to scratch and loaded
  // back by every step. chain_op[i]: step i as a chain op, all but its
  // array operand (set per segment); operand_first for a binary op whose
  // first operand is the other one.
  using detail::ChainOp;
  LocalArray<ChainOp, kLocalSteps> chain_op(ns);
  auto as_chain_op = [&](std::size_t i) {
    const FusedStep& s = steps[i];
    ChainOp& o = chain_op[i];
    o.operand_first = false;  // set below for a scalar first, by the caller for an array
    switch (s.kind) {
      case FusedStep::Kind::kUnary: o.kind = ChainOp::Kind::kUnary; break;
      case FusedStep::Kind::kBinary: o.kind = ChainOp::Kind::kArray; break;
      case FusedStep::Kind::kScalar:
        o.kind = ChainOp::Kind::kScalar;
        o.scalar = s.scalar;
        o.operand_first = s.scalar_first;
        break;
      default: return false;
    }
    o.op = s.op;
    if (!detail::chainable(o.kind, s.op, s.dtype)) return false;
    for (int j = 0; j < s.num_in; ++j) {
      const std::int32_t r = s.in[static_cast<std::size_t>(j)];
      const DType t = r >= 0 ? steps[static_cast<std::size_t>(r)].dtype : inputs[static_cast<std::size_t>(-1 - r)].dtype;
      if (t != s.dtype) return false;
    }
    return true;
  };
  // A chain's operands other than its value are rows, single elements,
  // scalars or values computed before it (in cache): a dense input read
  // block by block beside the value made the chain slower than steps over
  // small tiles, while with row operands the chain runs as fast as a
  // hand-written loop (docs/benchmarks.md, "Fusion").
  auto dense_input = [&](std::int32_t r) { return r < 0 && periods[static_cast<std::size_t>(-1 - r)] == n; };
  LocalArray<std::size_t, kLocalSteps> chain_end(ns, 0);  // a chain's first step: one past its last
  for (std::size_t i = 0; i < ns;) {
    std::size_t j = i + 1;
    if (as_chain_op(i) && !(steps[i].num_in > 1 && dense_input(steps[i].in[1]))) {
      for (; j < ns && steps[j].dtype == steps[i].dtype && as_chain_op(j); ++j) {
        const std::size_t p = j - 1;
        if (slot[p] < 0 || last_use[p] != j) break;
        const FusedStep& s = steps[j];
        const auto prev = static_cast<std::int32_t>(p);
        const bool first = s.in[0] == prev;
        const bool second = s.num_in > 1 && s.in[1] == prev;
        if (first == second) break;  // not an operand, or both (x * x)
        if (second && s.kind != FusedStep::Kind::kBinary) break;
        if (s.num_in > 1 && dense_input(s.in[second ? 0 : 1])) break;
        if (s.kind == FusedStep::Kind::kBinary) chain_op[j].operand_first = second;
      }
    }
    chain_end[i] = j;
    i = j;
  }
  // Inputs read by a step outside any chain: each such step reads its
  // dense operand's run of a tile at once (the tile size below); a chain
  // reads all its operands block by block.
  LocalArray<bool, kLocalInputs> read_alone(inputs.size(), false);
  for (std::size_t i = 0; i < ns;) {
    const std::size_t last = chain_end[i];
    if (last == i + 1) {
      for (int j = 0; j < steps[i].num_in; ++j) {
        const std::int32_t r = steps[i].in[static_cast<std::size_t>(j)];
        if (r < 0) read_alone[static_cast<std::size_t>(-1 - r)] = true;
      }
    }
    i = last;
  }
  // Bytes of a scratch slot's element: the widest dtype a slot holds.
  std::size_t slot_elem = 1;
  // Bytes a tile touches per element: dense inputs read outside chains,
  // kept results, slots.
  std::size_t per_elem = 0;
  std::size_t read_per_elem = 0;  // of those dense inputs alone
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    if (periods[k] == n && read_alone[k]) read_per_elem += size_of(inputs[k].dtype);
  }
  per_elem += read_per_elem;
  for (std::size_t i = 0; i < ns; ++i) {
    if (slot[i] >= 0) slot_elem = std::max(slot_elem, size_of(steps[i].dtype));
    if (outputs[i].data != nullptr) per_elem += size_of(steps[i].dtype);
  }
  per_elem += static_cast<std::size_t>(num_slots) * slot_elem;
  std::int64_t tile = kFlatTile;
  while (tile > kMinFlatTile && (static_cast<std::size_t>(tile) * per_elem > kFlatTileBytes ||
                                 static_cast<std::size_t>(tile) * read_per_elem > kFlatReadBytes)) {
    tile /= 2;
  }
  // A tile holds whole segments when segments are shorter than a tile.
  if (segment < tile) tile = tile / segment * segment;
  // Slots a whole number of cache lines apart, in doubles (the scratch's unit).
  const std::int64_t slot_stride =
      static_cast<std::int64_t>((static_cast<std::size_t>(tile) * slot_elem + 63) / 64 * 64 / sizeof(double));
  const std::int64_t tiles = (n + tile - 1) / tile;
  // Where each step's operands and result are, worked out once per
  // program: a value in scratch (its slot), a kept result or an input dense
  // in the domain's layout (address of element e: base + e * size), one
  // element (base), or a row (period p: base + (e % p) * size).
  struct Place {
    const char* base = nullptr;
    std::int64_t size = 0;    // element bytes
    std::int64_t slot = -1;   // >= 0: a scratch slot
    std::int64_t period = 0;  // 0: dense or scratch; 1: one element; else a row
    std::size_t input = 0;    // a row's input (its phase)
    DType dtype = DType::kFloat32;
  };
  auto place_of = [&](std::int32_t r) {
    Place q;
    if (r >= 0) {
      const auto i = static_cast<std::size_t>(r);
      q.dtype = steps[i].dtype;
      q.size = static_cast<std::int64_t>(size_of(q.dtype));
      if (slot[i] >= 0) {
        q.slot = slot[i];
      } else {
        q.base = static_cast<const char*>(outputs[i].data) + outputs[i].offset * q.size;
      }
      return q;
    }
    const auto k = static_cast<std::size_t>(-1 - r);
    const TensorView& v = inputs[k];
    q.dtype = v.dtype;
    q.size = static_cast<std::int64_t>(size_of(v.dtype));
    q.base = static_cast<const char*>(v.data) + v.offset * q.size;
    q.period = periods[k] == n ? 0 : periods[k];
    q.input = k;
    return q;
  };
  LocalArray<std::array<Place, 4>, kLocalSteps> places(ns);  // per step: operands 0..2, result 3
  for (std::size_t i = 0; i < ns; ++i) {
    for (int j = 0; j < steps[i].num_in; ++j) {
      places[i][static_cast<std::size_t>(j)] = place_of(steps[i].in[static_cast<std::size_t>(j)]);
    }
    places[i][3] = place_of(static_cast<std::int32_t>(i));
  }
  // No software prefetch of the next tile: prefetching a single dense
  // input's next tile into L2 (a layer's x * w + b) gained nothing in
  // bench_ndarray's fused row workloads, and perf put 6% of the fused
  // sigmoid's samples on the stalled prefetches (docs/benchmarks.md,
  // "Fusion"). The hardware prefetcher keeps up by itself.
  auto run_tiles = [&](std::int64_t t0, std::int64_t t1) {
    Scratch scratch(static_cast<std::size_t>(num_slots * slot_stride));
    LocalArray<std::int64_t, kLocalInputs> phase(inputs.size());  // a row's element at the tile's start
    // The chain ops with this thread's array operands.
    LocalArray<ChainOp, kLocalSteps> chain_ops(ns);
    std::copy(chain_op.begin(), chain_op.end(), chain_ops.begin());
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t e0 = t * tile;
      const std::int64_t end = std::min(e0 + tile, n);
      // Only rows take a division, one per tile.
      for (std::size_t k = 0; k < inputs.size(); ++k) {
        const std::int64_t p = periods[k];
        phase[k] = p == 1 || p == n ? 0 : e0 % p;
      }
      // The first segment boundary after e0; the steps below walk the
      // boundaries (multiples of `segment`) without dividing.
      const std::int64_t first_cut = segment == n ? end : std::min(end, e0 - e0 % segment + segment);
      // Operand q's run over the segment starting at flat index e, and its
      // step (0 for one element). Every period is a multiple of the segment
      // length, so phase + (e - e0) wraps at most tile / period times.
      auto at = [&](const Place& q, std::int64_t e) -> std::pair<const char*, std::int64_t> {
        if (q.slot >= 0) {
          return {reinterpret_cast<const char*>(scratch.data() + q.slot * slot_stride) + (e - e0) * q.size, 1};
        }
        if (q.period == 0) return {q.base + e * q.size, 1};
        if (q.period == 1) return {q.base, 0};
        std::int64_t in_period = phase[q.input] + (e - e0);
        while (in_period >= q.period) in_period -= q.period;
        return {q.base + in_period * q.size, 1};
      };
      for (std::size_t i = 0; i < ns;) {
        const std::size_t last = chain_end[i];
        if (last > i + 1) {
          for (std::int64_t e = e0, next = first_cut; e < end; e = next, next = std::min(end, next + segment)) {
            const auto x = at(places[i][0], e);
            for (std::size_t j = i; j < last; ++j) {
              ChainOp& o = chain_ops[j];
              if (o.kind != ChainOp::Kind::kArray) continue;
              const auto b = at(places[j][o.operand_first ? 0 : 1], e);
              o.operand = b.first;
              o.step = b.second;
            }
            char* const y = const_cast<char*>(at(places[last - 1][3], e).first);
            detail::chain_run(steps[i].dtype, chain_ops.begin() + i, static_cast<int>(last - i), x.first, x.second, y,
                              next - e);
          }
          i = last;
          continue;
        }
        const FusedStep& s = steps[i];
        const std::array<Place, 4>& q = places[i];
        for (std::int64_t e = e0, next = first_cut; e < end; e = next, next = std::min(end, next + segment)) {
          const auto a = at(q[0], e);
          const auto b = at(q[1], e);
          const auto c = at(q[2], e);
          char* const y = const_cast<char*>(at(q[3], e).first);
          run_segment(s, a.first, a.second, q[0].dtype, b.first, b.second, c.first, c.second, y, next - e);
        }
        ++i;
      }
    }
  };
  if (n < detail::kParallelElements) {
    run_tiles(0, tiles);
  } else {
    detail::parallel_chunks(0, tiles, 1, run_tiles);
  }
}

}  // namespace

void fused(std::span<const FusedStep> steps, std::span<const TensorView> inputs,
           std::span<const TensorView> outputs, const Shape& domain) {
  const std::int64_t n = numel(domain);
  if (n == 0 || steps.empty()) return;
  // One step (an op that found nothing to fuse with, recorded alone: most
  // often one a wait needs at once) is the unfused op's kernel on the same
  // views, without the tile loop's set-up: on one-element arrays that set-up
  // cost more than the op.
  if (steps.size() == 1 && outputs[0].data != nullptr) {
    const FusedStep& s = steps[0];
    const TensorView* in[3] = {nullptr, nullptr, nullptr};
    for (int j = 0; j < s.num_in; ++j) {
      in[j] = &inputs[static_cast<std::size_t>(-1 - s.in[static_cast<std::size_t>(j)])];
    }
    run_step(s, in, outputs[0]);
    return;
  }
  // Flat when every input has a period over the domain's flat index and the
  // segments the periods cut are long enough that a row function's call
  // costs little beside its work. Otherwise tiles are ranges of rows (the
  // first dim) and inputs keep their broadcast strides.
  LocalArray<std::int64_t, kLocalInputs> periods(inputs.size());
  bool flat = true;
  std::int64_t shortest = n;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    periods[k] = flat_period(inputs[k], domain);
    if (periods[k] == 0) flat = false;
    if (periods[k] > 1) shortest = std::min(shortest, periods[k]);
  }
  if (flat && (shortest >= kMinSegment || shortest == n)) {
    fused_flat(steps, inputs, periods.span(), outputs, n);
    return;
  }
  const std::int64_t rows_total = domain[0];
  const std::int64_t inner = n / domain[0];
  const std::int64_t rows_per_tile = std::max<std::int64_t>(1, kTile / inner);
  const std::int64_t tiles = (rows_total + rows_per_tile - 1) / rows_per_tile;
  const std::int64_t tile_elems = rows_per_tile * inner;

  std::vector<Slicing> slicing(inputs.size());
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const TensorView& v = inputs[k];
    Slicing& s = slicing[k];
    s.base = v.offset;
    s.strides = detail::broadcast_strides(v, domain);
    s.row_stride = s.strides[0];
  }
  // Scratch slots, in doubles (8-byte elements at most), for the results
  // nobody keeps.
  std::vector<std::int64_t> slot(steps.size(), -1);
  std::int64_t scratch_doubles = 0;
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (outputs[i].data == nullptr) {
      slot[i] = scratch_doubles;
      scratch_doubles += (tile_elems + 7) / 8 * 8;
    }
  }

  auto run_tiles = [&](std::int64_t t0, std::int64_t t1) {
    Scratch scratch(static_cast<std::size_t>(scratch_doubles));
    std::vector<TensorView> values(steps.size());
    std::vector<TensorView> ext(inputs.size());
    Shape tshape;
    Strides contiguous;
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t r0 = t * rows_per_tile;
      const std::int64_t rows = std::min(rows_per_tile, rows_total - r0);
      tshape.assign(domain.begin(), domain.end());
      tshape[0] = rows;
      contiguous = contiguous_strides(tshape);
      for (std::size_t k = 0; k < inputs.size(); ++k) {
        TensorView& v = ext[k];
        v.data = inputs[k].data;
        v.dtype = inputs[k].dtype;
        v.shape = tshape;
        v.strides = slicing[k].strides;
        v.offset = slicing[k].base + r0 * slicing[k].row_stride;
      }
      for (std::size_t i = 0; i < steps.size(); ++i) {
        const FusedStep& s = steps[i];
        TensorView& out = values[i];
        out.dtype = s.dtype;
        out.shape = tshape;
        out.strides = contiguous;
        if (slot[i] < 0) {
          out.data = outputs[i].data;
          out.offset = r0 * inner;
        } else {
          out.data = scratch.data() + slot[i];
          out.offset = 0;
        }
        const TensorView* in[3] = {nullptr, nullptr, nullptr};
        for (int j = 0; j < s.num_in; ++j) {
          const std::int32_t r = s.in[static_cast<std::size_t>(j)];
          in[j] = r >= 0 ? &values[static_cast<std::size_t>(r)] : &ext[static_cast<std::size_t>(-1 - r)];
        }
        run_step(s, in, out);
      }
    }
  };
  if (n < detail::kParallelElements) {
    run_tiles(0, tiles);
  } else {
    detail::parallel_chunks(0, tiles, 1, run_tiles);
  }
}

}  // namespace lazydag::ops::cpu
