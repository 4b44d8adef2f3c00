// Lazy fusion of elementwise ops (docs/architecture.md, "Fusion"): each
// thread keeps one open group of consecutive elementwise ops on one device
// (CPU, sim or GPU) over one shape, recorded into the engine as one node when
// something needs it. Results that no handle holds by then are never
// allocated or stored.
#pragma once

#include <lazydag/ops/kernels.hpp>

#include <functional>
#include <span>

#include "internal.hpp"

namespace lazydag::detail::fusion {

/// Whether an elementwise op recorded now would be fused (on any device):
/// fusion on (nd::set_fusion, LAZYDAG_FUSION) and an engine policy other
/// than naive (which runs each op as it is recorded).
[[nodiscard]] bool active();

/// Appends `step` (operands: in[k] >= 0 is inputs[in[k]]; the step's own
/// references are rewritten here) to the calling thread's open group and
/// returns its result, an array of `shape` and `t` with no buffer yet.
/// Records the group first when the op does not fit it (another device or
/// shape, the group full). The inputs are not settled by the caller.
/// `name` (the op's, for the fused node's name) must outlive the process's
/// use of the group: a string literal or a static table's entry.
using InputRefs = std::span<const std::reference_wrapper<const StatePtr>>;
[[nodiscard]] StatePtr append(ops::FusedStep step, InputRefs inputs, const Shape& shape, DType t, Device dev,
                              const char* name);

/// Records the open group that reads or writes `s`'s buffer, if any (any
/// thread's), so that what the caller records next comes after it.
void settle(const ArrayState& s);

/// Records the calling thread's open group, if any.
void flush_mine();

/// Records every thread's open group (nd::waitall, exit).
void flush_all();

}  // namespace lazydag::detail::fusion
