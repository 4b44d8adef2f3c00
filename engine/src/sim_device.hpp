// The emulated stream device `sim(n)`: one FIFO executor thread per stream,
// events as per-stream watermarks, memory of its own. It runs the stream and
// event logic of the scheduler on machines without a GPU, and its completion
// bookkeeping (CompletionLedger) is the CUDA backend's, fault injection
// included (sim::fault, sim::fail_completion).
#pragma once

#include <lazydag/engine/stream.hpp>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "block_cache.hpp"
#include "stream_ledger.hpp"

namespace lazydag::engine::detail {

class SimDevice final : public StreamDevice {
 public:
  /// Starts num_compute_streams + 2 executor threads. `max_delay_us` > 0
  /// makes each op start after a random delay in [0, max_delay_us] µs, to
  /// shake out missing waits (LAZYDAG_SIM_DELAY_US).
  SimDevice(int id, int num_compute_streams, unsigned max_delay_us);
  /// Runs what was enqueued, then joins the executors.
  ~SimDevice() override;
  SimDevice(const SimDevice&) = delete;
  SimDevice& operator=(const SimDevice&) = delete;

  [[nodiscard]] Device device() const noexcept override { return {DeviceKind::kSim, id_}; }
  [[nodiscard]] int num_compute_streams() const noexcept override { return compute_; }
  [[nodiscard]] void* stream_handle(int stream) const noexcept override;
  void launch(int stream, std::span<const StreamEvent> waits, StreamTask& task,
              StreamEvent& done) override;
  void release_event(const StreamEvent&) noexcept override {}
  [[nodiscard]] void* allocate(std::size_t bytes, void* stream) override;
  void deallocate(void* p, std::size_t bytes, void* stream) noexcept override;
  [[nodiscard]] std::size_t bytes_in_use() const noexcept override {
    return in_use_.load(std::memory_order_relaxed);
  }
  // The executor runs a copy to completion before it returns, so staging
  // memory is free for reuse as soon as it is released.
  [[nodiscard]] void* allocate_host(std::size_t bytes) override;
  void release_host(void* p, std::size_t bytes, void* stream) noexcept override;

  /// sim::fault and sim::fail_completion: what the op running on `stream`
  /// (this thread must be its executor) injects when it returns.
  enum class Injected : std::uint8_t { kNone, kFault, kFailCompletion };
  void inject(void* stream, Injected what, std::string message);

 private:
  struct Item {
    std::vector<StreamEvent> waits;
    StreamTask* task = nullptr;
    std::uint64_t ticket = 0;  // the stream's watermark when it has run
    std::uint64_t launch = 0;  // its ledger ticket
  };
  struct Stream {
    int index = 0;
    std::mutex mu;
    std::condition_variable cv;
    std::deque<Item> queue;
    bool stop = false;
    std::uint64_t enqueued = 0;           // tickets handed out (under mu)
    std::atomic<std::uint64_t> completed{0};  // the watermark events compare with
    std::thread thread;
    // Set by the op this stream's executor is running (executor thread only).
    Injected injected = Injected::kNone;
    std::string injected_message;
  };
  void executor(Stream& s);
  void fault_device(std::exception_ptr error);

  const int id_;
  const int compute_;
  const unsigned max_delay_us_;
  std::vector<std::unique_ptr<Stream>> streams_;
  std::atomic<std::size_t> in_use_{0};
  BlockCache memory_;  // freed blocks kept for reuse, as a GPU pool does

  // Completions, reported in stream order with their device intervals; the
  // device's sticky fault.
  CompletionLedger<DeviceInterval> ledger_;
  std::atomic<bool> faulted_{false};
};

}  // namespace lazydag::engine::detail
