// What the frontend's sources share: access to a handle's state, and the
// storage version counter behind autograd's in-place check.
#pragma once

#include <lazydag/ndarray.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace lazydag::detail {

using StatePtr = std::shared_ptr<const ArrayState>;

namespace fusion {
void settle(const ArrayState& s);
}

struct Access {
  /// The handle's state, for an op that reads or writes its buffer: a
  /// fused group still gathering ops that touch the buffer is recorded
  /// first (fusion.hpp), so this access comes after it.
  static const StatePtr& state(const NDArray& a, const char* op) {
    const StatePtr& s = meta(a, op);
    fusion::settle(*s);
    return s;
  }
  /// The handle's state for its shape, dtype, device or autograd record
  /// alone, or for an elementwise op that may join a fused group.
  static const StatePtr& meta(const NDArray& a, const char* op) {
    if (!a.state_) {
      throw InvalidArgument(std::string(op) + ": use of an empty or moved-from NDArray");
    }
    return a.state_;
  }
  static NDArray wrap(StatePtr s) {
    NDArray a;
    a.state_ = std::move(s);
    return a;
  }
  /// Null for an empty handle.
  static const ArrayState* peek(const NDArray& a) noexcept { return a.state_.get(); }
  static long use_count(const NDArray& a) noexcept { return a.state_.use_count(); }
};

/// How many in-place writes have been recorded into the storage so far.
[[nodiscard]] std::uint64_t storage_version(const ArrayState& s) noexcept;
/// How many in-place writes with a gradient the storage has had; bump_
/// counts one more and returns the new count.
[[nodiscard]] std::uint64_t grad_generation(const ArrayState& s) noexcept;
std::uint64_t bump_grad_generation(const ArrayState& s) noexcept;
/// A point in the storages this thread makes; made_since(s, mark): `s`'s
/// buffer was made by this thread after `mark`.
[[nodiscard]] std::uint64_t storage_mark() noexcept;
[[nodiscard]] bool made_since(const ArrayState& s, std::uint64_t mark) noexcept;
/// Identifies `s`'s buffer (shared by its views).
[[nodiscard]] const void* storage_id(const ArrayState& s) noexcept;
/// Writing every element of `s` writes every byte of its buffer.
[[nodiscard]] bool covers_storage(const ArrayState& s);
/// A view of `a`'s buffer with the given geometry (in elements), which the
/// caller knows lies inside it.
[[nodiscard]] NDArray strided_view(const NDArray& a, const Shape& shape, const Strides& strides,
                                   std::int64_t offset);

/// Records one op on the arrays' device (a CPU or the emulated sim device)
/// that reads `reads` and writes `writes`, each contiguous, all on one
/// device; `kernel` gets their element pointers, reads first. Each write counts in its storage's version. InvalidArgument or
/// DeviceMismatch otherwise, recording nothing.
/// Whether record_host_kernel can run on `d`: a CPU or the sim device (its
/// memory is host memory); a GPU takes compositions of device ops instead.
[[nodiscard]] inline bool runs_host_kernels(Device d) noexcept { return d.kind != DeviceKind::kGpu; }

/// A new array whose contents nothing has written yet (an op's output).
[[nodiscard]] NDArray empty(const Shape& shape, DType t, Device dev, const char* op);

void record_host_kernel(const char* name, const std::vector<NDArray>& reads, const std::vector<NDArray>& writes,
                        std::function<void(const std::vector<void*>&)> kernel);

/// The same as an async node on a CPU device (Engine::push_async): `start`
/// gets the pointers, the run context and the node's Completion. With
/// run_on_failed_input it starts even when an input failed.
void record_host_async(const std::string& name, const std::vector<NDArray>& reads,
                       const std::vector<NDArray>& writes,
                       std::function<void(const std::vector<void*>&, const engine::RunContext&, engine::Completion&)> start,
                       bool run_on_failed_input);

}  // namespace lazydag::detail
