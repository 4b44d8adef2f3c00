// The CUDA stream device gpu(n): non-blocking streams, pooled events without
// timing (timing events only while the profiler runs), a stream-ordered
// memory pool (cudaMallocAsync), a pinned staging pool, and completions
// reported to the scheduler by a completer thread fed from host functions
// (no worker blocks on the GPU). The host functions run on a signal stream
// beside each stream, behind a wait for the launch's event, so the work
// stream never stalls on a round trip to the host between two kernels. Which launch a
// completion belongs to, failed recordings and sticky faults are the
// CompletionLedger's, shared with the emulated device and tested there.
#include "../src/cuda_backend.hpp"
#include "../src/profiler_internal.hpp"
#include "../src/stream_ledger.hpp"
#include "check.hpp"

#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

namespace lazydag::engine::detail {

namespace {

// Makes `id` the calling thread's current device for a scope. The throwing
// form is for calls that report errors; the std::nothrow form is for the
// places where a throw would terminate (destructors, the completer thread):
// cudaGetDevice/cudaSetDevice can return an earlier asynchronous error, or
// cudaErrorCudartUnloading at exit, and the calls after it then simply fail
// on their own.
class DeviceScope {
 public:
  explicit DeviceScope(int id) {
    LAZYDAG_CUDA_CHECK(cudaGetDevice(&previous_), "current device");
    if (previous_ != id) LAZYDAG_CUDA_CHECK(cudaSetDevice(id), "select device");
  }
  DeviceScope(int id, std::nothrow_t) noexcept {
    if (cudaGetDevice(&previous_) != cudaSuccess) previous_ = id;
    if (previous_ != id) (void)cudaSetDevice(id);
  }
  ~DeviceScope() {
    int now = previous_;
    if (cudaGetDevice(&now) == cudaSuccess && now != previous_) (void)cudaSetDevice(previous_);
  }
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = 0;
};

class CudaDevice;

// Host functions get one pointer-sized argument: the device's slot in this
// table and the launch's ticket, packed. A slot is taken at construction and
// freed only after the device's streams are synchronised (every host
// function of it has run), so a host function never finds another device.
std::array<std::atomic<CudaDevice*>, 256> g_devices{};

class CudaDevice final : public StreamDevice {
 public:
  CudaDevice(int id, int compute_streams);
  ~CudaDevice() override;
  CudaDevice(const CudaDevice&) = delete;
  CudaDevice& operator=(const CudaDevice&) = delete;

  [[nodiscard]] Device device() const noexcept override { return {DeviceKind::kGpu, id_}; }
  [[nodiscard]] int num_compute_streams() const noexcept override { return compute_; }
  [[nodiscard]] void* stream_handle(int stream) const noexcept override {
    return streams_[static_cast<std::size_t>(stream)];
  }
  void launch(int stream, std::span<const StreamEvent> waits, StreamTask& task,
              StreamEvent& done) override;
  void release_event(const StreamEvent& e) noexcept override;
  [[nodiscard]] void* allocate(std::size_t bytes, void* stream) override;
  void deallocate(void* p, std::size_t bytes, void* stream) noexcept override;
  [[nodiscard]] std::size_t bytes_in_use() const noexcept override {
    return in_use_.load(std::memory_order_relaxed);
  }
  [[nodiscard]] void* allocate_host(std::size_t bytes) override;
  void release_host(void* p, std::size_t bytes, void* stream) noexcept override;

 private:
  // Timing events bracketing a launch on its stream, while the profiler runs.
  struct Timing {
    cudaEvent_t t0 = nullptr;
    cudaEvent_t t1 = nullptr;
  };
  static void CUDART_CB on_host(void* data);
  void completer();
  cudaEvent_t acquire_event();
  cudaEvent_t acquire_timing_event();
  void release_timing(const Timing& t) noexcept;
  void start_clock(cudaStream_t s);
  DeviceInterval interval(const Timing& p, bool measure) noexcept;
  std::exception_ptr sticky_error() noexcept;
  void init_streams();

  const int id_;
  const int compute_;
  std::vector<cudaStream_t> streams_;
  // One per stream: where the host functions that signal its completions
  // run, each behind a wait for its launch's event.
  std::vector<cudaStream_t> signal_streams_;
  std::size_t slot_ = 0;  // in g_devices
  // One launch at a time per stream: tickets follow the stream's order.
  std::vector<std::unique_ptr<std::mutex>> launch_mu_;
  cudaMemPool_t pool_ = nullptr;
  std::atomic<std::size_t> in_use_{0};

  std::mutex events_mu_;
  std::vector<cudaEvent_t> free_events_;
  std::vector<cudaEvent_t> free_timing_events_;
  // The device's clock in the host's: `clock_` completed at `clock_ns_`
  // (set at the first profiled launch, under events_mu_).
  cudaEvent_t clock_ = nullptr;
  std::uint64_t clock_ns_ = 0;

  // Completion: each launch is registered in the ledger; the host function
  // enqueued after it signals its ticket; the completer thread (never a
  // worker) reports completions to the scheduler. Host functions may not
  // call CUDA, so they only signal the ledger.
  CompletionLedger<Timing> ledger_;
  std::thread completer_;

  // Pinned staging blocks by size, each with the event after which it is free.
  struct Block {
    void* p;
    cudaEvent_t ready;
  };
  std::mutex host_mu_;
  std::multimap<std::size_t, Block> host_free_;
  std::size_t host_free_bytes_ = 0;  // kept at most kMaxPooledHostBytes (beyond: finished blocks are freed)
  static constexpr std::size_t kMaxPooledHostBytes = std::size_t{256} << 20;
};

CudaDevice::CudaDevice(int id, int compute_streams)
    : id_(id), compute_(compute_streams), ledger_(compute_streams + 2) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    (void)cudaGetLastError();
    throw BackendUnavailable("gpu(" + std::to_string(id) + "): no usable CUDA device (" +
                             cudaGetErrorName(e) + ": " + cudaGetErrorString(e) + ")");
  }
  if (id >= count) {
    throw BackendUnavailable("gpu(" + std::to_string(id) + "): this machine has " +
                             std::to_string(count) + " CUDA device(s)");
  }
  slot_ = g_devices.size();
  for (std::size_t i = 0; i < g_devices.size(); ++i) {
    CudaDevice* expected = nullptr;
    if (g_devices[i].compare_exchange_strong(expected, this, std::memory_order_acq_rel)) {
      slot_ = i;
      break;
    }
  }
  if (slot_ == g_devices.size()) {
    throw BackendUnavailable("gpu(" + std::to_string(id) + "): more than " + std::to_string(g_devices.size()) +
                             " CUDA stream devices open at once (one per engine and GPU)");
  }
  try {
    init_streams();
  } catch (...) {
    {
      DeviceScope scope(id_, std::nothrow);
      for (cudaStream_t s : streams_) (void)cudaStreamDestroy(s);
      for (cudaStream_t s : signal_streams_) (void)cudaStreamDestroy(s);
    }
    g_devices[slot_].store(nullptr, std::memory_order_release);
    throw;
  }
  completer_ = std::thread([this] { completer(); });
}

void CudaDevice::init_streams() {
  DeviceScope scope(id_);
  const int n = compute_ + 2;
  streams_.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    cudaStream_t s = nullptr;
    LAZYDAG_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "create stream");
    streams_.push_back(s);
    cudaStream_t signal = nullptr;
    LAZYDAG_CUDA_CHECK(cudaStreamCreateWithFlags(&signal, cudaStreamNonBlocking), "create signal stream");
    signal_streams_.push_back(signal);
    launch_mu_.push_back(std::make_unique<std::mutex>());
  }
  // Freed blocks stay in the pool (no release to the driver at each sync).
  LAZYDAG_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool_, id_), "memory pool");
  std::uint64_t threshold = std::numeric_limits<std::uint64_t>::max();
  LAZYDAG_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold),
                     "pool release threshold");
}

CudaDevice::~CudaDevice() {
  {
    DeviceScope scope(id_, std::nothrow);
    for (cudaStream_t s : streams_) (void)cudaStreamSynchronize(s);
    for (cudaStream_t s : signal_streams_) (void)cudaStreamSynchronize(s);
  }
  ledger_.stop();
  completer_.join();
  // Every host function of this device has run (the streams are idle, or
  // the context is dead and runs none): its slot may go to another device.
  g_devices[slot_].store(nullptr, std::memory_order_release);
  DeviceScope scope(id_, std::nothrow);
  for (auto& [size, b] : host_free_) {
    (void)cudaFreeHost(b.p);
    (void)cudaEventDestroy(b.ready);
  }
  for (cudaEvent_t e : free_events_) (void)cudaEventDestroy(e);
  for (cudaEvent_t e : free_timing_events_) (void)cudaEventDestroy(e);
  if (clock_ != nullptr) (void)cudaEventDestroy(clock_);
  for (cudaStream_t s : streams_) (void)cudaStreamDestroy(s);
  for (cudaStream_t s : signal_streams_) (void)cudaStreamDestroy(s);
}

cudaEvent_t CudaDevice::acquire_event() {
  {
    std::lock_guard lk(events_mu_);
    if (!free_events_.empty()) {
      cudaEvent_t e = free_events_.back();
      free_events_.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  // Dependency events carry no timestamp: timing events cost more to record.
  LAZYDAG_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "create event");
  return e;
}

cudaEvent_t CudaDevice::acquire_timing_event() {
  {
    std::lock_guard lk(events_mu_);
    if (!free_timing_events_.empty()) {
      cudaEvent_t e = free_timing_events_.back();
      free_timing_events_.pop_back();
      return e;
    }
  }
  cudaEvent_t e = nullptr;
  LAZYDAG_CUDA_CHECK(cudaEventCreate(&e), "create timing event");
  return e;
}

// Once per device, at the first profiled launch: an event whose completion
// time is read on the host (one wait, then never again). Device times are
// then this host time plus cudaEventElapsedTime from it; they are late by at
// most the wait's wake-up latency, and lose resolution slowly with the
// distance from it (float milliseconds: about 1 us after 100 s).
void CudaDevice::start_clock(cudaStream_t s) {
  {
    std::lock_guard lk(events_mu_);
    if (clock_ != nullptr) return;
  }
  // Recorded and waited for outside events_mu_ (a blocking wait must not
  // hold up the completer and the launches, which take it); the first
  // launch to finish sets the clock, the others drop theirs.
  cudaEvent_t e = nullptr;
  LAZYDAG_CUDA_CHECK(cudaEventCreate(&e), "create timing event");
  if (cudaError_t err = cudaEventRecord(e, s); err != cudaSuccess || cudaEventSynchronize(e) != cudaSuccess) {
    (void)cudaEventDestroy(e);
    cuda::throw_cuda_error(err != cudaSuccess ? err : cudaGetLastError(), "start the profiler's device clock",
                           "gpu(" + std::to_string(id_) + ")");
  }
  const std::uint64_t now = profiler::detail::now_ns();
  std::lock_guard lk(events_mu_);
  if (clock_ != nullptr) {
    (void)cudaEventDestroy(e);
    return;
  }
  clock_ns_ = now;
  clock_ = e;
}

// Reads a completed launch's timing events (when `measure`) and returns
// them to the pool.
DeviceInterval CudaDevice::interval(const Timing& p, bool measure) noexcept {
  DeviceInterval ran;
  if (p.t0 == nullptr) return ran;
  float ms0 = 0;
  float ms1 = 0;
  if (measure && cudaEventElapsedTime(&ms0, clock_, p.t0) == cudaSuccess &&
      cudaEventElapsedTime(&ms1, clock_, p.t1) == cudaSuccess) {
    ran.start_ns = clock_ns_ + static_cast<std::uint64_t>(static_cast<double>(ms0) * 1e6);
    ran.end_ns = clock_ns_ + static_cast<std::uint64_t>(static_cast<double>(ms1) * 1e6);
  } else if (measure) {
    (void)cudaGetLastError();  // not measured: the node keeps its launch times
  }
  release_timing(p);
  return ran;
}

void CudaDevice::release_timing(const Timing& t) noexcept {
  std::lock_guard lk(events_mu_);
  for (cudaEvent_t e : {t.t0, t.t1}) {
    if (e != nullptr) free_timing_events_.push_back(e);
  }
}

// A launch whose completion event could not be recorded has a null event:
// it must not enter the pool, where a later launch would draw it.
void CudaDevice::release_event(const StreamEvent& e) noexcept {
  if (e.handle == nullptr) return;
  std::lock_guard lk(events_mu_);
  free_events_.push_back(static_cast<cudaEvent_t>(e.handle));
}

void CudaDevice::launch(int stream, std::span<const StreamEvent> waits, StreamTask& task,
                        StreamEvent& done) {
  DeviceScope scope(id_);
  std::lock_guard launch_lock(*launch_mu_[static_cast<std::size_t>(stream)]);
  cudaStream_t s = streams_[static_cast<std::size_t>(stream)];
  for (const StreamEvent& w : waits) {
    LAZYDAG_CUDA_CHECK(cudaStreamWaitEvent(s, static_cast<cudaEvent_t>(w.handle), 0),
                       "wait for a producer on another stream");
  }
  cudaEvent_t e = acquire_event();
  Timing timing;
  std::uint64_t ticket = 0;
  try {
    if (profiler::detail::on()) {
      start_clock(s);
      timing.t0 = acquire_timing_event();
      timing.t1 = acquire_timing_event();
      LAZYDAG_CUDA_CHECK(cudaEventRecord(timing.t0, s), "record a timing event");
    }
    // Throws the device's sticky fault once the completer has seen one.
    ticket = ledger_.begin(stream, &task, timing);
  } catch (...) {
    release_event(StreamEvent{e, 0});
    release_timing(timing);
    throw;
  }
  task.run(RunContext{device(), s, -1, stream, this, {}});
  // From here the node has run: failures are reported through completion,
  // and a fault may report it.
  ledger_.ran(ticket);
  cudaError_t err = timing.t1 != nullptr ? cudaEventRecord(timing.t1, s) : cudaSuccess;
  if (err == cudaSuccess) err = cudaEventRecord(e, s);
  if (err == cudaSuccess) {
    done = StreamEvent{e, 0};
    // The signal stream waits for the launch's event (the wait takes the
    // event's current record: a later re-record of a recycled event does
    // not move it) and then calls the host function; `s` goes on at once.
    cudaStream_t signal = signal_streams_[static_cast<std::size_t>(stream)];
    const auto data = static_cast<std::uintptr_t>((ticket << 8) | slot_);
    err = cudaStreamWaitEvent(signal, e, 0);
    if (err == cudaSuccess) err = cudaLaunchHostFunc(signal, &CudaDevice::on_host, reinterpret_cast<void*>(data));
  } else {
    release_event(StreamEvent{e, 0});
    done = StreamEvent{};
  }
  if (err != cudaSuccess) {
    // No host function will report this launch. Wait for what it enqueued
    // (an error path), then fail it, and only it: the launches before it
    // are reported by their own host functions, or failed by the sticky
    // fault poll when the context is broken (host functions are not called
    // after an error in the context).
    (void)cudaStreamSynchronize(s);
    (void)cudaStreamSynchronize(signal_streams_[static_cast<std::size_t>(stream)]);
    (void)cudaGetLastError();
    std::exception_ptr failure;
    try {
      cuda::throw_cuda_error(err, "record the completion of a launch", "gpu(" + std::to_string(id_) + ")");
    } catch (...) {
      failure = std::current_exception();
    }
    ledger_.fail(ticket, failure);
  }
}

void CUDART_CB CudaDevice::on_host(void* data) {
  const auto packed = reinterpret_cast<std::uintptr_t>(data);
  if (CudaDevice* d = g_devices[packed & 0xFF].load(std::memory_order_acquire)) d->ledger_.signal(packed >> 8);
}

// The device's sticky error, if its context has one (a faulted kernel:
// host functions stop, so the waits must fail instead of hanging), else null.
std::exception_ptr CudaDevice::sticky_error() noexcept {
  cudaError_t sticky = cudaSuccess;
  {
    DeviceScope scope(id_, std::nothrow);
    for (const auto* list : {&streams_, &signal_streams_}) {
      for (cudaStream_t s : *list) {
        cudaError_t q = cudaStreamQuery(s);
        if (q != cudaSuccess && q != cudaErrorNotReady) sticky = q;
      }
    }
  }
  if (sticky == cudaSuccess) return nullptr;
  try {
    cuda::throw_cuda_error(sticky, "kernel execution", "gpu(" + std::to_string(id_) + ")");
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

// Reports completions, in launch order per stream. While work is pending it
// also looks for a sticky device error every 100 ms and fails every pending
// launch with it (the ledger then refuses new launches).
void CudaDevice::completer() {
  (void)cudaSetDevice(id_);  // this thread serves one device (event timing, queries)
  std::vector<CompletionLedger<Timing>::Done> ready;
  for (;;) {
    ready.clear();
    if (ledger_.take_ready(ready) != 0) {
      for (auto& d : ready) d.task->complete(d.error, interval(d.extra, !d.error));
      continue;
    }
    if (ledger_.pending() == 0) {
      if (ledger_.stopping()) return;
      (void)ledger_.wait_ready(std::chrono::milliseconds(100));
      continue;
    }
    if (ledger_.wait_ready(std::chrono::milliseconds(100))) continue;
    std::exception_ptr sticky = sticky_error();
    if (!sticky && ledger_.stopping()) {
      // The destructor synchronised every stream: a launch still pending
      // will not be signalled. Fail it rather than wait forever.
      sticky = std::make_exception_ptr(
          Error("gpu(" + std::to_string(id_) + "): launch never reported complete before shutdown"));
    }
    if (sticky) ledger_.fault(sticky);
  }
}

void* CudaDevice::allocate(std::size_t bytes, void* stream) {
  DeviceScope scope(id_);
  void* p = nullptr;
  LAZYDAG_CUDA_CHECK(cudaMallocAsync(&p, std::max<std::size_t>(bytes, 1), static_cast<cudaStream_t>(stream)),
                     "allocate " + std::to_string(bytes) + " bytes on gpu(" + std::to_string(id_) + ")");
  in_use_.fetch_add(bytes, std::memory_order_relaxed);
  return p;
}

void CudaDevice::deallocate(void* p, std::size_t bytes, void* stream) noexcept {
  if (p == nullptr) return;
  int previous = 0;
  (void)cudaGetDevice(&previous);
  (void)cudaSetDevice(id_);
  // After the runtime has unloaded (arrays destroyed at process exit) the
  // memory goes with the process: nothing to report.
  if (cudaError_t e = cudaFreeAsync(p, static_cast<cudaStream_t>(stream));
      e != cudaSuccess && e != cudaErrorCudartUnloading) {
    std::cerr << "lazydag: cudaFreeAsync failed on gpu(" << id_ << "): " << cudaGetErrorName(e) << '\n';
  }
  (void)cudaSetDevice(previous);
  in_use_.fetch_sub(bytes, std::memory_order_relaxed);
}

void* CudaDevice::allocate_host(std::size_t bytes) {
  {
    std::lock_guard lk(host_mu_);
    // The smallest free block that fits and whose last copy has finished.
    for (auto it = host_free_.lower_bound(bytes); it != host_free_.end() && it->first <= 2 * bytes + 4096;
         ++it) {
      if (cudaEventQuery(it->second.ready) == cudaSuccess) {
        void* p = it->second.p;
        (void)cudaEventDestroy(it->second.ready);
        host_free_bytes_ -= it->first;
        host_free_.erase(it);
        return p;
      }
    }
  }
  void* p = nullptr;
  LAZYDAG_CUDA_CHECK(cudaHostAlloc(&p, std::max<std::size_t>(bytes, 1), cudaHostAllocPortable),
                     "pinned staging of " + std::to_string(bytes) + " bytes");
  return p;
}

void CudaDevice::release_host(void* p, std::size_t bytes, void* stream) noexcept {
  if (p == nullptr) return;
  int previous = 0;
  (void)cudaGetDevice(&previous);
  (void)cudaSetDevice(id_);
  cudaEvent_t e = nullptr;
  if (cudaEventCreateWithFlags(&e, cudaEventDisableTiming) != cudaSuccess ||
      cudaEventRecord(e, static_cast<cudaStream_t>(stream)) != cudaSuccess) {
    // Cannot order the reuse: wait for the stream (error path only).
    (void)cudaStreamSynchronize(static_cast<cudaStream_t>(stream));
    if (e == nullptr) (void)cudaEventCreateWithFlags(&e, cudaEventDisableTiming);
  }
  std::vector<Block> trimmed;
  {
    std::lock_guard lk(host_mu_);
    host_free_.emplace(bytes, Block{p, e});
    host_free_bytes_ += bytes;
    // Over the bound: free the largest blocks whose last copy has finished.
    for (auto it = host_free_.end(); host_free_bytes_ > kMaxPooledHostBytes && it != host_free_.begin();) {
      --it;
      if (it->second.ready == nullptr || cudaEventQuery(it->second.ready) == cudaSuccess) {
        host_free_bytes_ -= it->first;
        trimmed.push_back(it->second);
        it = host_free_.erase(it);
      }
    }
  }
  // Outside the lock: cudaFreeHost may synchronise with the device.
  for (const Block& b : trimmed) {
    (void)cudaFreeHost(b.p);
    if (b.ready != nullptr) (void)cudaEventDestroy(b.ready);
  }
  (void)cudaSetDevice(previous);
}

}  // namespace

std::unique_ptr<StreamDevice> make_cuda_device(int id, int compute_streams) {
  return std::make_unique<CudaDevice>(id, compute_streams);
}

void range_push(const char* name) noexcept { nvtxRangePushA(name); }
void range_pop() noexcept { nvtxRangePop(); }

}  // namespace lazydag::engine::detail
