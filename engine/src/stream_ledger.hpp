// Completion bookkeeping shared by the stream devices (the emulated sim
// device and CUDA): which launches are pending on which stream, which of
// them the device has finished, which failed, and the device's sticky
// fault. The backends keep only their runtime calls; this is the logic that
// decides which launch a completion belongs to, and it runs in every test
// through sim.
//
// Every launch gets a ticket that names it (its stream and its place in the
// stream); the device's completion signal (a CUDA host function, the sim
// executor) carries that ticket, so a completion is never attributed to a
// launch by counting. A launch whose signal will never come (recording its
// completion failed) is failed by ticket, and a sticky fault fails every
// pending launch; a signal that arrives for a launch no longer pending is
// ignored, and an error belongs to its entry alone (it goes with it).
// Completions are reported per stream in launch order.
#pragma once

#include <lazydag/engine/stream.hpp>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <utility>
#include <vector>

namespace lazydag::engine::detail {

/// `Extra` is what the backend keeps per launch until it is reported (CUDA:
/// its timing events); a small copyable value.
template <class Extra>
class CompletionLedger {
 public:
  static constexpr int kMaxStreams = 256;

  /// A launch to report: complete `task` with `error` (null: success).
  struct Done {
    StreamTask* task = nullptr;
    std::exception_ptr error;
    Extra extra{};
  };

  explicit CompletionLedger(int streams) : streams_(static_cast<std::size_t>(std::clamp(streams, 1, kMaxStreams))) {}
  CompletionLedger(const CompletionLedger&) = delete;
  CompletionLedger& operator=(const CompletionLedger&) = delete;

  /// Registers a launch on `stream`, before anything of it is enqueued;
  /// callers serialise launches per stream, so tickets follow stream order.
  /// Returns its ticket (never 0). After a fault, throws the fault and
  /// registers nothing: a faulted device runs nothing more.
  std::uint64_t begin(int stream, StreamTask* task, Extra extra) {
    std::lock_guard lk(mu_);
    if (fault_) std::rethrow_exception(fault_);
    const std::uint64_t ticket = (++next_ << 8) | static_cast<std::uint64_t>(stream);
    streams_[static_cast<std::size_t>(stream)].push_back(Entry{ticket, task, extra, false, nullptr, false});
    ++pending_;
    return ticket;
  }

  /// Forgets a launch that begin() registered but that was not enqueued
  /// after all (the launch throws): nothing will report it.
  void cancel(std::uint64_t ticket) noexcept {
    std::lock_guard lk(mu_);
    auto& q = streams_[ticket & 0xFF];
    auto it = find(q, ticket);
    if (it == q.end()) return;
    q.erase(it);
    --pending_;
  }

  /// The launch's task has returned from run(): from now on a fault may
  /// report it. (A fault never completes a task while its run() is still
  /// executing: the engine would recycle the node under it.) signal() and
  /// fail() imply it.
  void ran(std::uint64_t ticket) noexcept { update(ticket, [](Entry& e) { e.armed = true; }); }

  /// The device finished the launch `ticket` (`extra`, when given, replaces
  /// what begin() stored). Ignored when it is no longer pending or already
  /// settled (failed by a fault before its signal came).
  void signal(std::uint64_t ticket) noexcept {
    update(ticket, [](Entry& e) {
      e.armed = true;
      e.settled = true;
    });
  }
  void signal(std::uint64_t ticket, Extra extra) noexcept {
    update(ticket, [&](Entry& e) {
      e.armed = true;
      if (!e.settled) e.extra = extra;
      e.settled = true;
    });
  }

  /// The launch's completion will never be signalled (recording it
  /// failed): it completes with `error`, after the launches before it on its
  /// stream. A fault that came first keeps its error.
  void fail(std::uint64_t ticket, std::exception_ptr error) noexcept {
    update(ticket, [&](Entry& e) {
      e.armed = true;
      if (!e.settled) e.error = std::move(error);
      e.settled = true;
    });
  }

  /// A sticky device fault: every pending launch fails with `error`, later
  /// begin() calls throw it, later signals are ignored. The first fault wins.
  void fault(std::exception_ptr error) noexcept {
    {
      std::lock_guard lk(mu_);
      if (!fault_) fault_ = error;
      for (auto& q : streams_) {
        for (Entry& e : q) {
          if (!e.settled) {
            e.settled = true;
            e.error = error;
          }
        }
      }
    }
    cv_.notify_all();
  }

  /// Moves the launches that can be reported (each stream's prefix of
  /// settled launches whose run() has returned, in launch order) to `out`;
  /// `stream` < 0: of every stream. Returns how many.
  std::size_t take_ready(std::vector<Done>& out, int stream = -1) {
    std::lock_guard lk(mu_);
    std::size_t n = 0;
    for (std::size_t i = 0; i < streams_.size(); ++i) {
      if (stream >= 0 && static_cast<std::size_t>(stream) != i) continue;
      auto& q = streams_[i];
      while (!q.empty() && reportable(q.front())) {
        out.push_back(Done{q.front().task, std::move(q.front().error), q.front().extra});
        q.pop_front();
        --pending_;
        ++n;
      }
    }
    return n;
  }

  /// Waits until some launch can be reported, stop() is called, or
  /// `timeout` passes; returns whether one can be reported.
  bool wait_ready(std::chrono::milliseconds timeout) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, timeout, [&] { return stop_ || any_ready(); }) && any_ready();
  }

  /// Wakes wait_ready() for good (the device is shutting down).
  void stop() noexcept {
    {
      std::lock_guard lk(mu_);
      stop_ = true;
    }
    cv_.notify_all();
  }

  [[nodiscard]] bool stopping() const {
    std::lock_guard lk(mu_);
    return stop_;
  }
  /// Launches registered and not yet taken.
  [[nodiscard]] std::size_t pending() const {
    std::lock_guard lk(mu_);
    return pending_;
  }
  /// The sticky fault, or null.
  [[nodiscard]] std::exception_ptr fault() const {
    std::lock_guard lk(mu_);
    return fault_;
  }

 private:
  struct Entry {
    std::uint64_t ticket;
    StreamTask* task;
    Extra extra;
    bool settled;               // signalled, failed or faulted
    std::exception_ptr error;
    bool armed = false;         // its run() has returned: reportable once settled and at the front
  };

  template <class F>
  void update(std::uint64_t ticket, F f) noexcept {
    {
      std::lock_guard lk(mu_);
      const std::size_t stream = ticket & 0xFF;
      if (stream >= streams_.size()) return;
      auto& q = streams_[stream];
      auto it = find(q, ticket);
      if (it == q.end()) return;
      f(*it);
    }
    cv_.notify_all();
  }

  // Tickets increase along a stream's queue.
  static typename std::deque<Entry>::iterator find(std::deque<Entry>& q, std::uint64_t ticket) {
    auto it = std::lower_bound(q.begin(), q.end(), ticket,
                               [](const Entry& e, std::uint64_t t) { return e.ticket < t; });
    return it != q.end() && it->ticket == ticket ? it : q.end();
  }

  static bool reportable(const Entry& e) { return e.settled && e.armed; }

  [[nodiscard]] bool any_ready() const {
    for (const auto& q : streams_) {
      if (!q.empty() && reportable(q.front())) return true;
    }
    return false;
  }

  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::deque<Entry>> streams_;
  std::uint64_t next_ = 0;
  std::size_t pending_ = 0;
  std::exception_ptr fault_;
  bool stop_ = false;
};

}  // namespace lazydag::engine::detail
