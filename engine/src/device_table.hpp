// DeviceTable: an engine's stream devices. The devices themselves (made on
// first use, then read without a lock), the stream a recorded node goes to,
// and each device's run-ahead bound: how many of its nodes, and how many of
// their bytes, may be launched and not yet completed before the next ready
// one is held back. Knows nodes and devices, nothing of EngineImpl: the
// engine asks it to admit a claimed node and, at a completion, which held
// nodes now fit; making those ready is the engine's.
#pragma once

#include <lazydag/engine/engine.hpp>
#include <lazydag/engine/stream.hpp>

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <span>

#include "node.hpp"
#include "small_vector.hpp"

namespace lazydag::engine::detail {

int default_compute_streams();  // LAZYDAG_STREAMS (engine.cpp)
unsigned sim_delay_us();        // LAZYDAG_SIM_DELAY_US (engine.cpp)

class DeviceTable {
 public:
  static constexpr int kMaxDevices = 8;  // ids 0..7 of each stream device kind

  DeviceTable(std::size_t max_in_flight, std::size_t max_in_flight_bytes) noexcept
      : max_in_flight_(max_in_flight), max_in_flight_bytes_(max_in_flight_bytes) {}
  DeviceTable(const DeviceTable&) = delete;
  DeviceTable& operator=(const DeviceTable&) = delete;
  ~DeviceTable() { close(); }

  /// The device `d`, made on first use. InvalidArgument for the CPU, an
  /// unknown kind or an id out of range; BackendUnavailable when CUDA is
  /// not there.
  StreamDevice& get(Device d);

  /// The last access, on a compute stream of a node's device, to a var the
  /// node writes: its stream and record order (seq 0: none).
  struct StreamUse {
    int stream = 0;
    std::uint64_t seq = 0;
  };
  /// The newest such access among the last writers and readers of `writes`,
  /// finished or not. The vars' locks held, before n is linked.
  static StreamUse last_use(const StreamDevice* d, std::span<VarState* const> writes);

  /// The stream n runs on: a copy stream for copies; else the stream of the
  /// newest of its unfinished producers on the same device (stream order
  /// then carries the dependency, with no event) and `written` (the last
  /// access to what it overwrites: a buffer's free or an in-place update
  /// goes where its data was last used, not to another stream that would
  /// wake for it); else the compute streams round-robin. After n is linked
  /// (its predecessors are set).
  int choose_stream(const Node* n, StreamKind kind, StreamUse written);

  /// A claimed node takes a place in its device's run-ahead bound (true),
  /// or is held (kDeferred, one more ref) until leave() frees one (false).
  bool admit(Node* n);

  /// `n` has completed on its device: its place is free, and the held nodes
  /// that now fit, oldest first, are appended to `fit`, each with the ref
  /// admit() took.
  void leave(const Node* n, SmallVector<Node*, 8>& fit);

  /// Nodes admit() has held back, since construction.
  [[nodiscard]] std::uint64_t stalls() const noexcept { return stalls_.load(std::memory_order_relaxed); }

  /// Destroys the devices (joins the emulated executors). Every node must be
  /// done. Idempotent.
  void close() noexcept;

 private:
  struct Slot {
    std::unique_ptr<StreamDevice> device;
    std::atomic<std::uint32_t> next_stream{0};  // round-robin for nodes without a producer
    std::mutex mu;                  // guards the run-ahead fields below
    std::size_t in_flight = 0;
    std::size_t in_flight_bytes = 0;
    std::deque<Node*> held;         // kDeferred nodes, one ref each, oldest first
  };
  // sim(0..7) then gpu(0..7).
  static std::size_t index(const Device& d) noexcept {
    return static_cast<std::size_t>((d.kind == DeviceKind::kGpu ? kMaxDevices : 0) + d.id);
  }
  Slot& slot_of(const Device& d) noexcept { return slots_[index(d)]; }

  const std::size_t max_in_flight_;
  const std::size_t max_in_flight_bytes_;
  std::array<Slot, 2 * kMaxDevices> slots_;
  // Written once per slot under make_mu_ (creation may be slow: CUDA
  // initialisation), read lock-free after.
  std::array<std::atomic<StreamDevice*>, 2 * kMaxDevices> devices_{};
  std::mutex make_mu_;
  std::atomic<std::uint64_t> stalls_{0};
};

}  // namespace lazydag::engine::detail
