// The emulated stream device: FIFO executors, watermark events, own memory,
// completions through the shared ledger, and fault injection.
#include "sim_device.hpp"
#include "profiler_internal.hpp"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <limits>
#include <new>
#include <random>
#include <string>

namespace lazydag::engine::detail {

namespace {
// The stream whose executor is the calling thread, while it runs an op.
thread_local void* tls_running_stream = nullptr;

// Raises a watermark, never lowers it (a fault raises every stream's to the
// maximum, and an executor finishing an op after that must not undo it).
void advance(std::atomic<std::uint64_t>& mark, std::uint64_t to) {
  std::uint64_t seen = mark.load(std::memory_order_relaxed);
  while (seen < to && !mark.compare_exchange_weak(seen, to, std::memory_order_release, std::memory_order_relaxed)) {
  }
  mark.notify_all();
}
}  // namespace

SimDevice::SimDevice(int id, int num_compute_streams, unsigned max_delay_us)
    : id_(id), compute_(num_compute_streams), max_delay_us_(max_delay_us), ledger_(num_compute_streams + 2) {
  const int n = num_compute_streams + 2;
  streams_.reserve(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) {
    streams_.push_back(std::make_unique<Stream>());
    streams_.back()->index = i;
  }
  for (auto& s : streams_) {
    Stream* sp = s.get();
    sp->thread = std::thread([this, sp] { executor(*sp); });
  }
}

SimDevice::~SimDevice() {
  for (auto& s : streams_) {
    {
      std::lock_guard lk(s->mu);
      s->stop = true;
    }
    s->cv.notify_one();
  }
  for (auto& s : streams_) s->thread.join();
}

void* SimDevice::stream_handle(int stream) const noexcept {
  return streams_[static_cast<std::size_t>(stream)].get();
}

void SimDevice::launch(int stream, std::span<const StreamEvent> waits, StreamTask& task,
                       StreamEvent& done) {
  Stream& s = *streams_[static_cast<std::size_t>(stream)];
  Item item;
  item.task = &task;
  for (const StreamEvent& e : waits) {
    // A wait on this very stream is implied by its FIFO order.
    if (e.handle != &s) item.waits.push_back(e);
  }
  {
    std::lock_guard lk(s.mu);
    // Throws the sticky fault of a faulted device: nothing is enqueued.
    item.launch = ledger_.begin(stream, &task, DeviceInterval{});
    item.ticket = s.enqueued + 1;
    const std::uint64_t launch = item.launch;
    try {
      s.queue.push_back(std::move(item));
    } catch (...) {
      ledger_.cancel(launch);
      throw;
    }
    ++s.enqueued;
    done = StreamEvent{&s, s.enqueued};
  }
  s.cv.notify_one();
}

void SimDevice::inject(void* stream, Injected what, std::string message) {
  if (tls_running_stream != stream || stream == nullptr) {
    throw InvalidArgument("sim fault injection: call it from inside the op running on sim(" +
                          std::to_string(id_) + "), on its executor thread");
  }
  Stream& s = *static_cast<Stream*>(stream);
  s.injected = what;
  s.injected_message = std::move(message);
}

// A sticky fault: the ledger fails every pending launch and refuses new
// ones; executors skip what is queued; every watermark goes to the maximum
// so that no executor waits for an event that will never come.
void SimDevice::fault_device(std::exception_ptr error) {
  faulted_.store(true, std::memory_order_seq_cst);
  ledger_.fault(std::move(error));
  for (auto& s : streams_) advance(s->completed, std::numeric_limits<std::uint64_t>::max());
}

// Runs one stream's items in order. An event wait blocks only this
// executor (as cudaStreamWaitEvent blocks only the stream), on the other
// stream's watermark; the release store that advances a watermark publishes
// everything its op wrote to the streams that wait for it. Completions go
// through the ledger, as on CUDA: the executor signals its launch by ticket
// and reports what has become reportable on its stream (on every stream
// after a fault).
void SimDevice::executor(Stream& s) {
  std::minstd_rand rng(static_cast<unsigned>(id_ * 131 + s.index + 1));
  std::vector<CompletionLedger<DeviceInterval>::Done> done;
  for (;;) {
    Item item;
    {
      std::unique_lock lk(s.mu);
      s.cv.wait(lk, [&] { return !s.queue.empty() || s.stop; });
      if (s.queue.empty()) return;
      item = std::move(s.queue.front());
      s.queue.pop_front();
    }
    for (const StreamEvent& e : item.waits) {
      auto* other = static_cast<Stream*>(e.handle);
      std::uint64_t seen = other->completed.load(std::memory_order_acquire);
      while (seen < e.value && !faulted_.load(std::memory_order_acquire)) {
        other->completed.wait(seen, std::memory_order_acquire);
        seen = other->completed.load(std::memory_order_acquire);
      }
    }
    if (faulted_.load(std::memory_order_acquire)) {
      ledger_.ran(item.launch);  // never runs: the fault has failed it
    } else {
      if (max_delay_us_ != 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % (max_delay_us_ + 1)));
      }
      // The executor's clock is the device's: the op's interval is its run.
      const bool timed = profiler::detail::on();
      DeviceInterval ran;
      if (timed) ran.start_ns = profiler::detail::now_ns();
      s.injected = Injected::kNone;
      tls_running_stream = &s;
      item.task->run(RunContext{device(), &s, -1, s.index, this, {}});
      tls_running_stream = nullptr;
      if (timed) ran.end_ns = profiler::detail::now_ns();
      auto injected_error = [&](const char* what) {
        return std::make_exception_ptr(Error("sim(" + std::to_string(id_) + "): " + what + s.injected_message));
      };
      switch (s.injected) {
        case Injected::kFault:
          // Its completion never comes; the device fails it with the rest.
          ledger_.ran(item.launch);
          fault_device(injected_error("device fault: "));
          break;
        case Injected::kFailCompletion:
          advance(s.completed, item.ticket);
          ledger_.fail(item.launch, injected_error("recording the completion failed: "));
          break;
        case Injected::kNone:
          advance(s.completed, item.ticket);
          ledger_.signal(item.launch, ran);
          break;
      }
    }
    done.clear();
    ledger_.take_ready(done, faulted_.load(std::memory_order_acquire) ? -1 : s.index);
    for (auto& d : done) d.task->complete(d.error, d.extra);
  }
}

// Sim memory is host memory from a pool of its own (block_cache.hpp): the
// frontend never reads it directly, only through recorded copies, as with a
// GPU's.
void* SimDevice::allocate(std::size_t bytes, void*) {
  void* p = memory_.allocate(bytes);
  if (p == nullptr) {
    throw Error("sim(" + std::to_string(id_) + "): out of memory allocating " +
                std::to_string(bytes) + " bytes");
  }
  in_use_.fetch_add(bytes, std::memory_order_relaxed);
  return p;
}

void SimDevice::deallocate(void* p, std::size_t bytes, void*) noexcept {
  if (p == nullptr) return;
  memory_.deallocate(p, bytes);
  in_use_.fetch_sub(bytes, std::memory_order_relaxed);
}

void* SimDevice::allocate_host(std::size_t bytes) {
  void* p = std::aligned_alloc(64, (std::max<std::size_t>(bytes, 1) + 63) / 64 * 64);
  if (p == nullptr) throw Error("sim: out of host staging memory");
  return p;
}

void SimDevice::release_host(void* p, std::size_t, void*) noexcept { std::free(p); }

}  // namespace lazydag::engine::detail

namespace lazydag::engine::sim {

namespace {
void inject(const RunContext& ctx, detail::SimDevice::Injected what, std::string message, const char* call) {
  auto* dev = ctx.device.kind == DeviceKind::kSim ? dynamic_cast<detail::SimDevice*>(ctx.stream_device) : nullptr;
  if (dev == nullptr) {
    throw InvalidArgument(std::string(call) + ": called outside an op running on a sim device (the op runs on " +
                          ctx.device.str() + ")");
  }
  dev->inject(ctx.stream, what, std::move(message));
}
}  // namespace

void fault(const RunContext& ctx, std::string what) {
  inject(ctx, detail::SimDevice::Injected::kFault, std::move(what), "sim::fault");
}

void fail_completion(const RunContext& ctx, std::string what) {
  inject(ctx, detail::SimDevice::Injected::kFailCompletion, std::move(what), "sim::fail_completion");
}

}  // namespace lazydag::engine::sim
