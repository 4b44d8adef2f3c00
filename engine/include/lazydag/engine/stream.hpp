// Stream devices: the interface between the scheduler and a device that runs
// work in stream order (the emulated `sim` device, CUDA GPUs). No CUDA header
// is included here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <exception>
#include <span>
#include <string>

#include <lazydag/engine/engine.hpp>

namespace lazydag::engine {

/// A point in one stream's order: complete once everything enqueued on that
/// stream before it has finished. `handle` is the backend's (a cudaEvent_t,
/// or the emulated stream); `value` its watermark where it has one.
struct StreamEvent {
  void* handle = nullptr;
  std::uint64_t value = 0;
};

/// When a launched node ran on the device, in the profiler's clock
/// (std::chrono::steady_clock, ns). Both zero: not measured (the profiler
/// was off at launch).
struct DeviceInterval {
  std::uint64_t start_ns = 0;
  std::uint64_t end_ns = 0;
};

/// A launched node as the backend sees it. The engine owns it until
/// complete() has been called.
class StreamTask {
 public:
  /// Runs the node's function in stream order: on the emulated device on the
  /// stream's executor, after the waits; on CUDA on the launching host
  /// thread, where the function enqueues its kernels on ctx.stream.
  /// Never throws (a failure is recorded as the node's error).
  virtual void run(const RunContext& ctx) noexcept = 0;
  /// Called once, from a backend thread, when everything run() enqueued has
  /// finished on the device; `async_error` is a failure the device reported
  /// only then (null when none), `ran` when the device ran it (measured
  /// while the profiler runs: CUDA timing events around the launch, the
  /// executor's clock on the emulated device). May give memory and events
  /// back to the backend (StreamDevice::deallocate, release_event); must
  /// not launch or block.
  virtual void complete(std::exception_ptr async_error, DeviceInterval ran) noexcept = 0;

 protected:
  ~StreamTask() = default;
};

/// One device with a few compute streams and two copy streams. Streams are
/// numbered [0, num_compute_streams()) for compute, then copy-in
/// (host->device) and copy-out (device->host). Implementations are
/// thread-safe.
class StreamDevice {
 public:
  virtual ~StreamDevice() = default;
  [[nodiscard]] virtual Device device() const noexcept = 0;
  [[nodiscard]] virtual int num_compute_streams() const noexcept = 0;
  [[nodiscard]] int num_streams() const noexcept { return num_compute_streams() + 2; }
  [[nodiscard]] int copy_in_stream() const noexcept { return num_compute_streams(); }
  [[nodiscard]] int copy_out_stream() const noexcept { return num_compute_streams() + 1; }
  /// The handle a node running on `stream` is given in RunContext::stream.
  [[nodiscard]] virtual void* stream_handle(int stream) const noexcept = 0;

  /// Non-blocking. Enqueues on `stream`: a device-side wait for each of
  /// `waits` (events of other streams, of this or another device), then
  /// task.run(), then an event, written to `done` before this returns, that
  /// later launches may wait for; task.complete() follows on a backend
  /// thread. Throws (CudaError) only when nothing was enqueued.
  virtual void launch(int stream, std::span<const StreamEvent> waits, StreamTask& task,
                      StreamEvent& done) = 0;
  /// The event of a launch that nothing will wait for any more (pooled
  /// events go back to the pool). Non-blocking, noexcept.
  virtual void release_event(const StreamEvent& e) noexcept = 0;

  /// Device memory, ordered on `stream` (a handle from stream_handle):
  /// usable by work enqueued on it after this call, and by other streams
  /// after an event of it. Throws Error when out of memory.
  [[nodiscard]] virtual void* allocate(std::size_t bytes, void* stream) = 0;
  /// Frees in stream order: the memory is reused only after the work
  /// enqueued on `stream` before this call. Non-blocking.
  virtual void deallocate(void* p, std::size_t bytes, void* stream) noexcept = 0;
  /// Bytes allocated and not yet freed.
  [[nodiscard]] virtual std::size_t bytes_in_use() const noexcept = 0;

  /// Page-locked host memory for staging copies (pooled): copies between
  /// the host and the device never touch pageable memory on the async path.
  [[nodiscard]] virtual void* allocate_host(std::size_t bytes) = 0;
  /// Returns staging memory; it is reused only after the work enqueued on
  /// `stream` so far has finished. Non-blocking.
  virtual void release_host(void* p, std::size_t bytes, void* stream) noexcept = 0;
};

/// Number of compute streams per stream device, from LAZYDAG_STREAMS (default 2).
[[nodiscard]] int default_compute_streams();

/// Fault injection on the emulated device, to test what a device fault does
/// to the engine and to the code above it without a GPU. Both are called
/// from inside an op running on a sim device (`ctx` is its RunContext) and
/// take effect when the op returns; anywhere else they throw
/// InvalidArgument.
namespace sim {
/// The device faults as a GPU does when a kernel faults: this op's
/// completion never comes, nothing enqueued on the device runs any more, the
/// device fails every pending launch (this one included) with Error(what),
/// and every later launch on it throws that error. Sticky, like a CUDA
/// context error: the sim device stays faulted for its engine's lifetime.
void fault(const RunContext& ctx, std::string what);
/// Recording this launch's completion fails, as when cudaLaunchHostFunc
/// fails after the kernels were enqueued: the op has run; it completes with
/// Error(what) after the launches before it on its stream, and the device
/// stays usable.
void fail_completion(const RunContext& ctx, std::string what);
}  // namespace sim

}  // namespace lazydag::engine
