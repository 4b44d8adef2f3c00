// The emulated stream device: FIFO executors, watermark events, own memory.
#include "sim_device.hpp"
#include "profiler_internal.hpp"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <new>
#include <random>
#include <string>

namespace lazydag::engine::detail {

SimDevice::SimDevice(int id, int num_compute_streams, unsigned max_delay_us)
    : id_(id), compute_(num_compute_streams), max_delay_us_(max_delay_us) {
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
    item.ticket = ++s.enqueued;
    done = StreamEvent{&s, item.ticket};
    s.queue.push_back(std::move(item));
  }
  s.cv.notify_one();
}

// Runs one stream's items in order. An event wait blocks only this
// executor (as cudaStreamWaitEvent blocks only the stream), on the other
// stream's watermark; the release store that advances a watermark publishes
// everything its op wrote to the streams that wait for it.
void SimDevice::executor(Stream& s) {
  std::minstd_rand rng(static_cast<unsigned>(id_ * 131 + s.index + 1));
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
      while (seen < e.value) {
        other->completed.wait(seen, std::memory_order_acquire);
        seen = other->completed.load(std::memory_order_acquire);
      }
    }
    if (max_delay_us_ != 0) {
      std::this_thread::sleep_for(std::chrono::microseconds(rng() % (max_delay_us_ + 1)));
    }
    // The executor's clock is the device's: the op's interval is its run.
    const bool timed = profiler::detail::on();
    DeviceInterval ran;
    if (timed) ran.start_ns = profiler::detail::now_ns();
    item.task->run(RunContext{device(), &s, -1, s.index, this, {}});
    if (timed) ran.end_ns = profiler::detail::now_ns();
    s.completed.store(item.ticket, std::memory_order_release);
    s.completed.notify_all();
    item.task->complete(nullptr, ran);
  }
}

// Sim memory is host memory from an allocator of its own: the frontend never
// reads it directly, only through recorded copies, as with a GPU's.
void* SimDevice::allocate(std::size_t bytes, void*) {
  const std::size_t size = (std::max<std::size_t>(bytes, 1) + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, size);
  if (p == nullptr) {
    throw Error("sim(" + std::to_string(id_) + "): out of memory allocating " +
                std::to_string(bytes) + " bytes");
  }
  in_use_.fetch_add(bytes, std::memory_order_relaxed);
  return p;
}

void SimDevice::deallocate(void* p, std::size_t bytes, void*) noexcept {
  if (p == nullptr) return;
  std::free(p);
  in_use_.fetch_sub(bytes, std::memory_order_relaxed);
}

void* SimDevice::allocate_host(std::size_t bytes) {
  void* p = std::aligned_alloc(64, (std::max<std::size_t>(bytes, 1) + 63) / 64 * 64);
  if (p == nullptr) throw Error("sim: out of host staging memory");
  return p;
}

void SimDevice::release_host(void* p, std::size_t, void*) noexcept { std::free(p); }

}  // namespace lazydag::engine::detail
