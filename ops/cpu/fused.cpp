// The CPU interpreter of fused elementwise programs: one pass over memory
// per tile. Each step runs the unfused op's own kernel on tile-sized views
// (a slice of an input, of a kept result, or of per-thread scratch), so a
// fused program computes every element exactly as the separate ops would:
// same kernel, same per-element arithmetic, same vector math. No JIT: the
// op list is interpreted per tile, and the tile is small enough that a
// step's operands are still in cache when the next step reads them.
#include <algorithm>
#include <cstddef>
#include <vector>

#include <lazydag/ops/kernels.hpp>

#include "iterate.hpp"

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
    // The thread's scratch, kept between calls; a call nested in this one
    // (oneTBB may run another chunk here while a large kernel inside a tile
    // waits for its own parallel loop) takes fresh memory instead.
    thread_local std::vector<double> kept;
    thread_local bool kept_busy = false;
    std::vector<double> fresh;
    const bool nested = kept_busy;
    std::vector<double>& scratch = nested ? fresh : kept;
    kept_busy = true;
    struct Release {
      bool nested;
      ~Release() {
        if (!nested) kept_busy = false;
      }
    } release{nested};
    if (scratch.size() < static_cast<std::size_t>(scratch_doubles)) scratch.resize(scratch_doubles);
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
