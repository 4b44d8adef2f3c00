// The CPU interpreter of fused elementwise programs: one pass over memory
// per tile. When every input is dense in the domain's layout or a single
// element (the common case), each step of a tile is one call of the unfused
// kernel's row function on dense runs (runs.hpp); otherwise each step runs
// the unfused op's whole kernel on tile-sized views (a slice of an input, of
// a kept result, or of per-thread scratch). Either way a fused program
// computes every element exactly as the separate ops would: same per-element
// arithmetic, same vector math. No JIT: the op list is interpreted per tile,
// and the tile is small enough that a step's operands are still in cache
// when the next step reads them.
#include <algorithm>
#include <cstddef>
#include <vector>

#include <lazydag/ops/kernels.hpp>

#include "iterate.hpp"
#include "runs.hpp"

namespace lazydag::ops::cpu {

namespace {

// Elements per tile: a float32 step result is 32 KiB, so the few values a
// step reads and writes stay in L1/L2 while the tile is worked on.
constexpr std::int64_t kTile = 16384;

bool is_contiguous(const TensorView& v) { return v.strides == contiguous_strides(v.shape); }

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
// parallel loop) takes fresh memory instead.
class Scratch {
 public:
  explicit Scratch(std::size_t doubles) : nested_(busy()) {
    busy() = true;
    std::vector<double>& mem = nested_ ? fresh_ : kept();
    if (mem.size() < doubles) mem.resize(doubles);
    data_ = mem.data();
  }
  ~Scratch() {
    if (!nested_) busy() = false;
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  [[nodiscard]] double* data() const { return data_; }

 private:
  static std::vector<double>& kept() {
    thread_local std::vector<double> mem;
    return mem;
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
// a program (inputs, kept results, scratch) stay in the core's L2 while the
// tile is worked on; large enough that the per-step dispatch is noise.
constexpr std::int64_t kFlatTile = 4096;

// A run operand: element 0's address and the step (1 dense, 0 broadcast).
struct RunOperand {
  const char* at = nullptr;
  std::int64_t step = 0;
  DType dtype = DType::kFloat32;
};

// The flat path: every input is the domain's own dense layout or a single
// element, so each value of a tile is a dense run of `len` elements (or one
// element repeated) and each step is one call of a kernel's row function.
// Scratch slots are reused once a value's last reader has run.
void fused_flat(std::span<const FusedStep> steps, std::span<const TensorView> inputs,
                std::span<const TensorView> outputs, std::int64_t n) {
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
  const std::int64_t tiles = (n + kFlatTile - 1) / kFlatTile;
  auto run_tiles = [&](std::int64_t t0, std::int64_t t1) {
    Scratch scratch(static_cast<std::size_t>(num_slots * kFlatTile));
    std::vector<RunOperand> values(ns);
    for (std::int64_t t = t0; t < t1; ++t) {
      const std::int64_t e0 = t * kFlatTile;
      const std::int64_t len = std::min(kFlatTile, n - e0);
      auto operand = [&](std::int32_t r) {
        if (r >= 0) return values[static_cast<std::size_t>(r)];
        const TensorView& v = inputs[static_cast<std::size_t>(-1 - r)];
        const std::size_t size = size_of(v.dtype);
        const bool one = numel(v.shape) == 1;
        return RunOperand{static_cast<const char*>(v.data) + static_cast<std::size_t>(v.offset + (one ? 0 : e0)) * size,
                          one ? 0 : 1, v.dtype};
      };
      for (std::size_t i = 0; i < ns; ++i) {
        const FusedStep& s = steps[i];
        char* y = slot[i] < 0 ? static_cast<char*>(outputs[i].data) +
                                    static_cast<std::size_t>(outputs[i].offset + e0) * size_of(s.dtype)
                              : reinterpret_cast<char*>(scratch.data() + slot[i] * kFlatTile);
        values[i] = RunOperand{y, 1, s.dtype};
        const RunOperand a = operand(s.in[0]);
        const RunOperand b = s.num_in > 1 ? operand(s.in[1]) : RunOperand{};
        const RunOperand c = s.num_in > 2 ? operand(s.in[2]) : RunOperand{};
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
  // Flat when every input is the domain's own contiguous layout or a single
  // element: the domain is then one run of n elements. Otherwise tiles are
  // ranges of rows (the first dim) and inputs keep their broadcast strides.
  bool flat = true;
  for (const TensorView& v : inputs) {
    if (numel(v.shape) != 1 && (v.shape != domain || !is_contiguous(v))) flat = false;
  }
  flat = flat || domain.empty();  // a rank-0 domain: every input has one element
  if (flat) {
    fused_flat(steps, inputs, outputs, n);
    return;
  }
  const std::int64_t rows_total = flat ? n : domain[0];
  const std::int64_t inner = flat ? 1 : n / domain[0];
  const std::int64_t rows_per_tile = std::max<std::int64_t>(1, kTile / inner);
  const std::int64_t tiles = (rows_total + rows_per_tile - 1) / rows_per_tile;
  const std::int64_t tile_elems = rows_per_tile * inner;

  std::vector<Slicing> slicing(inputs.size());
  for (std::size_t k = 0; k < inputs.size(); ++k) {
    const TensorView& v = inputs[k];
    Slicing& s = slicing[k];
    s.base = v.offset;
    if (flat) {
      s.row_stride = numel(v.shape) == 1 ? 0 : 1;
      s.strides = {s.row_stride};
    } else {
      s.strides = detail::broadcast_strides(v, domain);
      s.row_stride = s.strides[0];
    }
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
      if (flat) {
        tshape.assign(1, rows);
      } else {
        tshape.assign(domain.begin(), domain.end());
        tshape[0] = rows;
      }
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
