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
#include <cstddef>
#include <cstdint>
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

// Elements per tile of the flat path: small enough that the live values of
// a program (inputs, kept results, scratch: 4 KiB each in float32) stay in
// the core's L1 while the tile is worked on; large enough that the per-step
// dispatch is noise. On 16M-element float32 chains (bench_ndarray's fused
// workloads) 1024 was as fast as 4096 on relu((x - m) / s * g + b) and 15%
// faster on sigmoid(x * w + b), whose vector exp makes three passes a step.
constexpr std::int64_t kFlatTile = 1024;

// A run operand: element 0's address and the step (1 dense, 0 broadcast).
struct RunOperand {
  const char* at = nullptr;
  std::int64_t step = 0;
  DType dtype = DType::kFloat32;
};

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
  // A tile holds whole segments when segments are shorter than a tile.
  const std::int64_t tile = segment >= kFlatTile ? kFlatTile : kFlatTile / segment * segment;
  const std::size_t ns = steps.size();
  std::vector<std::size_t> last_use(ns, 0);
  for (std::size_t i = 0; i < ns; ++i) {
    for (int j = 0; j < steps[i].num_in; ++j) {
      const std::int32_t r = steps[i].in[static_cast<std::size_t>(j)];
      if (r >= 0) last_use[static_cast<std::size_t>(r)] = i;
    }
  }
  // Slot of each scratch value, in tiles of doubles; -1 for kept results.
  std::vector<std::int64_t> slot(ns, -1);
  std::vector<std::int64_t> free_slots;
  std::int64_t num_slots = 0;
  for (std::size_t i = 0; i < ns; ++i) {
    // Inputs whose last reader is step i are free for step i's result only
    // after it: a row function may not write where it reads another value.
    if (outputs[i].data == nullptr) {
      if (free_slots.empty()) {
        slot[i] = num_slots++;
      } else {
        slot[i] = free_slots.back();
        free_slots.pop_back();
      }
    }
    for (int j = 0; j < steps[i].num_in; ++j) {
      const std::int32_t r = steps[i].in[static_cast<std::size_t>(j)];
      if (r >= 0 && last_use[static_cast<std::size_t>(r)] == i && slot[static_cast<std::size_t>(r)] >= 0 &&
          std::find(free_slots.begin(), free_slots.end(), slot[static_cast<std::size_t>(r)]) == free_slots.end()) {
        free_slots.push_back(slot[static_cast<std::size_t>(r)]);
      }
    }
  }
  const std::int64_t tiles = (n + tile - 1) / tile;
  auto run_tiles = [&](std::int64_t t0, std::int64_t t1) {
    Scratch scratch(static_cast<std::size_t>(num_slots * tile));
    std::vector<RunOperand> values(ns);  // each step's run over the whole tile
    std::vector<std::int64_t> phase(inputs.size());
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t e0 = t * tile;
      const std::int64_t end = std::min(e0 + tile, n);
      // Inputs of period 1 or n need no division; rows take one per tile.
      for (std::size_t k = 0; k < inputs.size(); ++k) {
        const std::int64_t p = periods[k];
        phase[k] = p == 1 ? 0 : p == n ? e0 : e0 % p;
      }
      // The first segment boundary after e0; the steps below walk the
      // boundaries (multiples of `segment`) without dividing.
      const std::int64_t first_cut = segment == n ? end : std::min(end, e0 - e0 % segment + segment);
      // Operand r over the segment starting at flat index e. Every period is
      // a multiple of the segment length, so (phase + e - e0) wraps at most
      // tile / period times: no division per step.
      auto operand = [&](std::int32_t r, std::int64_t e) {
        if (r >= 0) {
          RunOperand v = values[static_cast<std::size_t>(r)];
          v.at += static_cast<std::size_t>(e - e0) * size_of(v.dtype);
          return v;
        }
        const std::size_t k = static_cast<std::size_t>(-1 - r);
        const TensorView& v = inputs[k];
        const std::int64_t p = periods[k];
        const bool one = p == 1;
        std::int64_t in_period = 0;
        if (!one) {
          in_period = phase[k] + (e - e0);
          while (in_period >= p) in_period -= p;
        }
        const std::int64_t at = v.offset + in_period;
        return RunOperand{static_cast<const char*>(v.data) + static_cast<std::size_t>(at) * size_of(v.dtype),
                          one ? 0 : 1, v.dtype};
      };
      for (std::size_t i = 0; i < ns; ++i) {
        const FusedStep& s = steps[i];
        const std::size_t size = size_of(s.dtype);
        char* const y0 = slot[i] < 0 ? static_cast<char*>(outputs[i].data) +
                                           static_cast<std::size_t>(outputs[i].offset + e0) * size
                                     : reinterpret_cast<char*>(scratch.data() + slot[i] * tile);
        values[i] = RunOperand{y0, 1, s.dtype};
        for (std::int64_t e = e0, next = first_cut; e < end; e = next, next = std::min(end, next + segment)) {
          const std::int64_t len = next - e;
          char* const y = y0 + static_cast<std::size_t>(e - e0) * size;
          const RunOperand a = operand(s.in[0], e);
          const RunOperand b = s.num_in > 1 ? operand(s.in[1], e) : RunOperand{};
          const RunOperand c = s.num_in > 2 ? operand(s.in[2], e) : RunOperand{};
          switch (s.kind) {
            case FusedStep::Kind::kUnary: detail::unary_run(static_cast<UnaryOp>(s.op), s.dtype, a.at, a.step, y, len); break;
            case FusedStep::Kind::kBinary:
              detail::binary_run(static_cast<BinaryOp>(s.op), s.dtype, a.at, a.step, b.at, b.step, y, len);
              break;
            case FusedStep::Kind::kScalar:
              detail::scalar_run(static_cast<BinaryOp>(s.op), s.dtype, a.at, a.step, s.scalar, s.scalar_first, y, len);
              break;
            case FusedStep::Kind::kCompare:
              detail::compare_run(static_cast<CompareOp>(s.op), a.dtype, a.at, a.step, b.at, b.step, y, len);
              break;
            case FusedStep::Kind::kCompareScalar:
              detail::compare_scalar_run(static_cast<CompareOp>(s.op), a.dtype, a.at, a.step, s.scalar, y, len);
              break;
            case FusedStep::Kind::kWhere:
              detail::where_run(s.dtype, a.at, a.step, b.at, b.step, c.at, c.step, y, len);
              break;
            case FusedStep::Kind::kCast: detail::cast_run(a.dtype, s.dtype, a.at, a.step, y, len); break;
          }
        }
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
  // Flat when every input has a period over the domain's flat index and the
  // segments the periods cut are long enough that a row function's call
  // costs little beside its work. Otherwise tiles are ranges of rows (the
  // first dim) and inputs keep their broadcast strides.
  std::vector<std::int64_t> periods(inputs.size());
  bool flat = true;
  std::int64_t shortest = n;
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    periods[k] = flat_period(inputs[k], domain);
    if (periods[k] == 0) flat = false;
    if (periods[k] > 1) shortest = std::min(shortest, periods[k]);
  }
  if (flat && (shortest >= kMinSegment || shortest == n)) {
    fused_flat(steps, inputs, periods, outputs, n);
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
