#include "workers.hpp"

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/info.h>

#include <cstddef>
#include <mutex>
#include <thread>

namespace lazydag::engine::detail {

namespace {

// One process-wide raise of oneTBB's worker limit, never lowered: several
// engines each see at least the workers they asked for.
void ensure_tbb_workers(int workers) {
  static std::mutex mu;
  static std::unique_ptr<tbb::global_control> control;
  static std::size_t current = 0;
  std::lock_guard lk(mu);
  auto wanted = static_cast<std::size_t>(workers) + 1;  // + the external slot
  auto base = static_cast<std::size_t>(tbb::info::default_concurrency());
  if (wanted <= base || wanted <= current) return;
  auto next = std::make_unique<tbb::global_control>(tbb::global_control::max_allowed_parallelism, wanted);
  control = std::move(next);
  current = wanted;
}

}  // namespace

Workers::Workers(int n) : n_(n) {
  if (n_ == 0) return;
  ensure_tbb_workers(n_);
  // Slot 0 is reserved for an external thread (never used: frontend threads
  // help through the engine's own queues), so the workers take slots 1..n.
  arena_ = std::make_unique<tbb::task_arena>(n_ + 1, 1);
  arena_->initialize();
}

void Workers::join() const noexcept {
  // Worker tasks leave within their idle spin.
  while (live_.load(std::memory_order_acquire) != 0) std::this_thread::yield();
}

}  // namespace lazydag::engine::detail
