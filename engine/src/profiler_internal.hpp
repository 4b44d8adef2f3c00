// What the engine hands to the profiler. Recording goes to a per-thread
// buffer; when the profiler is off the cost is one relaxed atomic load.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <lazydag/engine/engine.hpp>

#include "tick_clock.hpp"

namespace lazydag::profiler::detail {

extern std::atomic<bool> g_on;

inline bool on() noexcept { return g_on.load(std::memory_order_relaxed); }

inline std::uint64_t now_ns() noexcept { return engine::detail::TickClock::steady_ns(); }

struct NodeEvent {
  std::uint64_t engine = 0;  // distinguishes engines' node ids
  std::uint64_t id = 0;
  std::string name;
  engine::Device device;
  int worker = -1;
  std::uint64_t t_push = 0;
  std::uint64_t t_ready = 0;
  std::uint64_t t_start = 0;
  std::uint64_t t_end = 0;
  // Stream-device nodes: their stream (shown as a track of its own, with
  // the device's interval) and the host's launch interval; -1 for CPU nodes.
  int stream = -1;
  int compute_streams = 0;
  std::uint64_t t_launch_start = 0;
  std::uint64_t t_launch_end = 0;
  // read var indices, then written var indices, then predecessor ids: one
  // allocation per event instead of three
  std::vector<std::uint64_t> ids;
  std::uint16_t num_reads = 0;
  std::uint16_t num_writes = 0;
  bool failed = false;
  bool skipped = false;
};

struct FrontendEvent {
  const char* category = "";  // "record" or "wait"
  std::string name;
  std::string where;
  std::uint64_t t0 = 0;
  std::uint64_t t1 = 0;
};

/// Append to the calling thread's buffer (no global lock).
void record(NodeEvent&& e);
void record(FrontendEvent&& e);
/// Names the calling thread's track ("worker 0", "frontend").
void name_thread(const std::string& name);

}  // namespace lazydag::profiler::detail
