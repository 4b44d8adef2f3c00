// Helpers shared by the engine test suites: engine configurations to sweep
// and bounded spin-waits (a deadline, never a sleep, decides failure).
#pragma once

#include <lazydag/engine/engine.hpp>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace lazydag::test {

struct Config {
  engine::Policy policy;
  int threads;
  [[nodiscard]] std::string str() const {
    return std::string(engine::to_string(policy)) + "/" + std::to_string(threads);
  }
  [[nodiscard]] engine::EngineOptions options(std::size_t max_pending = 16384) const {
    engine::EngineOptions o;
    o.policy = policy;
    o.num_threads = threads;
    o.max_pending = max_pending;
    // the suites run with LAZYDAG_WATCHDOG set: a hang fails with a report
    o.watchdog_seconds = engine::EngineOptions::from_env().watchdog_seconds;
    return o;
  }
};

/// A 64-bit hash step: the values the random programs compute.
inline std::uint64_t mix(std::uint64_t h, std::uint64_t x) {
  h ^= x + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h *= 0xff51afd7ed558ccdULL;
  return h ^ (h >> 33);
}

/// naive, then lazy and eager with 1, 2 and 4 workers.
inline std::vector<Config> all_configs() {
  using engine::Policy;
  return {{Policy::kNaive, 0}, {Policy::kLazy, 1},  {Policy::kLazy, 2},  {Policy::kLazy, 4},
          {Policy::kEager, 1}, {Policy::kEager, 2}, {Policy::kEager, 4}};
}

/// Spins (yielding) until pred() holds or `seconds` pass; returns pred().
template <class Pred>
bool spin_until(Pred pred, double seconds = 20.0) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (!pred()) {
    if (std::chrono::steady_clock::now() > deadline) return pred();
    std::this_thread::yield();
  }
  return true;
}

/// A gate a node can park on: open() releases every waiter. wait() gives up
/// after a deadline so a broken engine fails the test instead of hanging it.
class Gate {
 public:
  void open() { open_.store(true, std::memory_order_release); }
  bool wait(double seconds = 20.0) const {
    return spin_until([&] { return open_.load(std::memory_order_acquire); }, seconds);
  }

 private:
  std::atomic<bool> open_{false};
};

}  // namespace lazydag::test
