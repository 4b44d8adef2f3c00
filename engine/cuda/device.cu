// The CUDA stream device gpu(n): non-blocking streams, pooled events without
// timing (timing events only while the profiler runs), a stream-ordered memory pool (cudaMallocAsync), a pinned staging
// pool, and completions reported to the scheduler by a completer thread fed
// from host functions enqueued on the streams (no worker blocks on the GPU).
#include "../src/cuda_backend.hpp"
#include "../src/profiler_internal.hpp"
#include "check.hpp"

#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
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
  struct Callback {
    CudaDevice* device;
    int stream;
  };
  // A launch awaiting its completion; `t0`/`t1` bracket it on the stream
  // (timing events) while the profiler runs.
  struct Pending {
    StreamTask* task;
    cudaEvent_t t0;
    cudaEvent_t t1;
  };
  static void CUDART_CB on_host(void* data);
  void completer();
  cudaEvent_t acquire_event();
  cudaEvent_t acquire_timing_event();
  void start_clock(cudaStream_t s);
  DeviceInterval interval(const Pending& p, bool measure) noexcept;

  const int id_;
  const int compute_;
  std::vector<cudaStream_t> streams_;
  std::vector<Callback> callbacks_;  // one per stream: the host function's argument
  // One launch at a time per stream: the order of `pending_` must be the
  // stream's order, which the host functions report in.
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

  // Completion: launches append to their stream's queue; a host function
  // enqueued after each launch says "the oldest on stream k is done"; the
  // completer thread (never a worker) reports it to the scheduler. Host
  // functions may not call CUDA, so they only touch this queue.
  std::mutex done_mu_;
  std::condition_variable done_cv_;
  std::vector<std::deque<Pending>> pending_;       // per stream, launch order
  std::vector<std::size_t> finished_;             // per stream: completions to report
  std::map<StreamTask*, std::exception_ptr> late_errors_;  // launches that failed after run()
  bool stop_ = false;
  std::thread completer_;

  // Pinned staging blocks by size, each with the event after which it is free.
  struct Block {
    void* p;
    cudaEvent_t ready;
  };
  std::mutex host_mu_;
  std::multimap<std::size_t, Block> host_free_;
};

CudaDevice::CudaDevice(int id, int compute_streams) : id_(id), compute_(compute_streams) {
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
  DeviceScope scope(id_);
  const int n = compute_streams + 2;
  streams_.resize(static_cast<std::size_t>(n));
  for (auto& s : streams_) {
    LAZYDAG_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "create stream");
  }
  for (int i = 0; i < n; ++i) {
    callbacks_.push_back(Callback{this, i});
    launch_mu_.push_back(std::make_unique<std::mutex>());
  }
  pending_.resize(static_cast<std::size_t>(n));
  finished_.assign(static_cast<std::size_t>(n), 0);
  // Freed blocks stay in the pool (no release to the driver at each sync).
  LAZYDAG_CUDA_CHECK(cudaDeviceGetDefaultMemPool(&pool_, id_), "memory pool");
  std::uint64_t threshold = std::numeric_limits<std::uint64_t>::max();
  LAZYDAG_CUDA_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold),
                     "pool release threshold");
  completer_ = std::thread([this] { completer(); });
}

CudaDevice::~CudaDevice() {
  {
    DeviceScope scope(id_, std::nothrow);
    for (cudaStream_t s : streams_) (void)cudaStreamSynchronize(s);
  }
  {
    std::lock_guard lk(done_mu_);
    stop_ = true;
  }
  done_cv_.notify_all();
  completer_.join();
  DeviceScope scope(id_, std::nothrow);
  for (auto& [size, b] : host_free_) {
    (void)cudaFreeHost(b.p);
    (void)cudaEventDestroy(b.ready);
  }
  for (cudaEvent_t e : free_events_) (void)cudaEventDestroy(e);
  for (cudaEvent_t e : free_timing_events_) (void)cudaEventDestroy(e);
  if (clock_ != nullptr) (void)cudaEventDestroy(clock_);
  for (cudaStream_t s : streams_) (void)cudaStreamDestroy(s);
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
  std::lock_guard lk(events_mu_);
  if (clock_ != nullptr) return;
  cudaEvent_t e = nullptr;
  LAZYDAG_CUDA_CHECK(cudaEventCreate(&e), "create timing event");
  if (cudaError_t err = cudaEventRecord(e, s); err != cudaSuccess || cudaEventSynchronize(e) != cudaSuccess) {
    (void)cudaEventDestroy(e);
    cuda::throw_cuda_error(err != cudaSuccess ? err : cudaGetLastError(), "start the profiler's device clock",
                           "gpu(" + std::to_string(id_) + ")");
  }
  clock_ns_ = profiler::detail::now_ns();
  clock_ = e;
}

// Reads a completed launch's timing events (when `measure`) and returns
// them to the pool.
DeviceInterval CudaDevice::interval(const Pending& p, bool measure) noexcept {
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
  std::lock_guard lk(events_mu_);
  free_timing_events_.push_back(p.t0);
  free_timing_events_.push_back(p.t1);
  return ran;
}

void CudaDevice::release_event(const StreamEvent& e) noexcept {
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
  Pending p{&task, nullptr, nullptr};
  if (profiler::detail::on()) {
    try {
      start_clock(s);
      p.t0 = acquire_timing_event();
      p.t1 = acquire_timing_event();
      LAZYDAG_CUDA_CHECK(cudaEventRecord(p.t0, s), "record a timing event");
    } catch (...) {
      release_event(StreamEvent{e, 0});
      std::lock_guard lk(events_mu_);
      for (cudaEvent_t t : {p.t0, p.t1}) {
        if (t != nullptr) free_timing_events_.push_back(t);
      }
      throw;
    }
  }
  {
    std::lock_guard lk(done_mu_);
    pending_[static_cast<std::size_t>(stream)].push_back(p);
  }
  task.run(RunContext{device(), s, -1, stream, this, {}});
  // From here the node has run: failures are reported through completion.
  cudaError_t err = p.t1 != nullptr ? cudaEventRecord(p.t1, s) : cudaSuccess;
  if (err == cudaSuccess) err = cudaEventRecord(e, s);
  if (err == cudaSuccess) {
    done = StreamEvent{e, 0};
    err = cudaLaunchHostFunc(s, &CudaDevice::on_host, &callbacks_[static_cast<std::size_t>(stream)]);
  } else {
    release_event(StreamEvent{e, 0});
    done = StreamEvent{};
  }
  if (err != cudaSuccess) {
    // No host function will report it: wait for the stream here (an error
    // path); the host functions of earlier launches have run by then, so
    // one more count completes exactly this task.
    (void)cudaStreamSynchronize(s);
    std::exception_ptr failure;
    try {
      cuda::throw_cuda_error(err, "record the completion of a launch", "gpu(" + std::to_string(id_) + ")");
    } catch (...) {
      failure = std::current_exception();
    }
    std::lock_guard lk(done_mu_);
    late_errors_[&task] = failure;
    finished_[static_cast<std::size_t>(stream)]++;
    done_cv_.notify_one();
  }
}

void CUDART_CB CudaDevice::on_host(void* data) {
  auto* cb = static_cast<Callback*>(data);
  CudaDevice* d = cb->device;
  {
    std::lock_guard lk(d->done_mu_);
    d->finished_[static_cast<std::size_t>(cb->stream)]++;
  }
  d->done_cv_.notify_one();
}

// Reports completions in launch order per stream. While work is pending it
// also looks for a sticky device error every 100 ms: a faulted kernel stops
// the host functions, and the waits must fail instead of hanging.
void CudaDevice::completer() {
  (void)cudaSetDevice(id_);  // this thread serves one device (event timing, queries)
  std::unique_lock lk(done_mu_);
  for (;;) {
    std::vector<std::pair<Pending, std::exception_ptr>> ready;
    for (std::size_t i = 0; i < pending_.size(); ++i) {
      while (finished_[i] != 0 && !pending_[i].empty()) {
        --finished_[i];
        Pending p = pending_[i].front();
        pending_[i].pop_front();
        std::exception_ptr e;
        if (auto it = late_errors_.find(p.task); it != late_errors_.end()) {
          e = it->second;
          late_errors_.erase(it);
        }
        ready.emplace_back(p, e);
      }
    }
    if (!ready.empty()) {
      lk.unlock();
      for (auto& [p, e] : ready) p.task->complete(e, interval(p, !e));
      lk.lock();
      continue;
    }
    bool any = false;
    for (auto& q : pending_) any = any || !q.empty();
    if (stop_ && !any) return;
    if (done_cv_.wait_for(lk, std::chrono::milliseconds(100)) == std::cv_status::timeout && any) {
      lk.unlock();
      cudaError_t sticky = cudaSuccess;
      {
        DeviceScope scope(id_, std::nothrow);
        for (cudaStream_t s : streams_) {
          cudaError_t q = cudaStreamQuery(s);
          if (q != cudaSuccess && q != cudaErrorNotReady) sticky = q;
        }
      }
      lk.lock();
      if (sticky != cudaSuccess) {
        std::exception_ptr err;
        try {
          cuda::throw_cuda_error(sticky, "kernel execution", "gpu(" + std::to_string(id_) + ")");
        } catch (...) {
          err = std::current_exception();
        }
        std::vector<Pending> failed;
        for (std::size_t i = 0; i < pending_.size(); ++i) {
          failed.insert(failed.end(), pending_[i].begin(), pending_[i].end());
          pending_[i].clear();
          finished_[i] = 0;  // no later count may complete a launch made after this
        }
        lk.unlock();  // interval() takes events_mu_: never under done_mu_
        for (const Pending& p : failed) {
          (void)interval(p, false);
          p.task->complete(err, DeviceInterval{});
        }
        lk.lock();
      }
    }
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
  if (cudaError_t e = cudaFreeAsync(p, static_cast<cudaStream_t>(stream)); e != cudaSuccess) {
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
  (void)cudaSetDevice(previous);
  std::lock_guard lk(host_mu_);
  host_free_.emplace(bytes, Block{p, e});
}

}  // namespace

std::unique_ptr<StreamDevice> make_cuda_device(int id, int compute_streams) {
  return std::make_unique<CudaDevice>(id, compute_streams);
}

void range_push(const char* name) noexcept { nvtxRangePushA(name); }
void range_pop() noexcept { nvtxRangePop(); }

}  // namespace lazydag::engine::detail
