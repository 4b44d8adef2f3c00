// Workers: an engine's CPU workers, as oneTBB tasks in an arena of its own.
// A worker is a task that runs the engine's loop until that loop finds no
// work and returns; the engine starts one more (start()) when it makes work
// ready while fewer than size() are active. Knows nothing of EngineImpl:
// what a worker does is the loop the engine passes in.
//
// The exit protocol (see EngineImpl::runner): a loop that finds no work
// calls retire() (seq_cst), looks at the ready queue once more (seq_cst),
// and stays (rejoin()) if there is work and room. start()'s caller has
// queued its work before it reads the active count (seq_cst): of the two
// threads, one sees the other, so ready work never strands.
#pragma once

#include <oneapi/tbb/task_arena.h>

#include <atomic>
#include <memory>

namespace lazydag::engine::detail {

class Workers {
 public:
  /// `n` workers (0: none; the frontends run everything).
  explicit Workers(int n);
  Workers(const Workers&) = delete;
  Workers& operator=(const Workers&) = delete;
  ~Workers() { join(); }

  [[nodiscard]] int size() const noexcept { return n_; }
  /// Workers looking for work or running it.
  [[nodiscard]] int active() const noexcept { return active_.load(std::memory_order_relaxed); }

  /// One more worker running loop(index) if fewer than size() are active;
  /// returns whether one was started. `index` is 0..size()-1 (the arena
  /// slot less the one reserved for an external thread).
  template <class Loop>
  bool start(Loop loop) {
    int active = active_.load(std::memory_order_seq_cst);
    while (active < n_) {
      if (active_.compare_exchange_weak(active, active + 1, std::memory_order_seq_cst)) {
        live_.fetch_add(1, std::memory_order_relaxed);
        try {
          arena_->enqueue([this, loop] {
            loop(tbb::this_task_arena::current_thread_index() - 1);
            live_.fetch_sub(1, std::memory_order_release);  // the task's last touch of the engine
          });
        } catch (...) {  // no task was made: join() must not wait for it
          live_.fetch_sub(1, std::memory_order_relaxed);
          active_.fetch_sub(1, std::memory_order_seq_cst);
          throw;
        }
        return true;
      }
    }
    return false;
  }

  /// A loop that found no work is no longer active.
  void retire() noexcept { active_.fetch_sub(1, std::memory_order_seq_cst); }
  /// After retire(), work was found: active again if there is room (true),
  /// else another worker has it and this loop returns.
  bool rejoin() noexcept {
    int active = active_.load(std::memory_order_seq_cst);
    return active < n_ && active_.compare_exchange_strong(active, active + 1, std::memory_order_seq_cst);
  }

  /// Waits until every started task has returned. Nothing may start() after.
  void join() const noexcept;

 private:
  const int n_;
  std::atomic<int> active_{0};  // loops looking for work or running it
  std::atomic<int> live_{0};    // tasks not yet returned
  std::unique_ptr<tbb::task_arena> arena_;
};

}  // namespace lazydag::engine::detail
