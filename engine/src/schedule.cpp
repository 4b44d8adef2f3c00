// Scheduling: readiness, claiming, the workers, bypass and completion.
//
// A node is ready when its `pending` count reaches 0; the thread that takes
// it there owns the hand-off: it runs the node itself (bypass: the first
// successor a completing thread makes ready, when no prioritised work waits),
// gives it to the wait that asked for it, or puts it on the ready queue and
// makes sure a worker or a helping frontend thread will look. Claiming
// (kReady -> kRunning, a CAS) decides who runs a node that sits in two
// places (a waiter's help list and the queue).
//
// Workers are oneTBB tasks in the engine's arena. A worker runs chains of
// ready work, spins briefly when it finds none, then returns; a node made
// ready when fewer workers than configured are active enqueues one more.
// The exit protocol and the enqueue check are a Dekker pair on seq_cst
// operations (queue size, the active count), so ready work never strands
// (workers.hpp).
#include "engine_impl.hpp"
#include "errors.hpp"

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <bit>
#include <chrono>
#include <climits>
#include <ctime>

#include "cuda_backend.hpp"
#include "profiler_internal.hpp"

namespace lazydag::engine::detail {

void futex_wait(std::atomic<std::uint32_t>& word, std::uint32_t expected, std::int64_t timeout_ns) noexcept {
  static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t));
  timespec ts{};
  timespec* tp = nullptr;
  if (timeout_ns >= 0) {
    ts.tv_sec = static_cast<time_t>(timeout_ns / 1000000000);
    ts.tv_nsec = static_cast<long>(timeout_ns % 1000000000);
    tp = &ts;
  }
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAIT_PRIVATE, expected, tp, nullptr, 0);
}

void futex_wake_all(std::atomic<std::uint32_t>& word) noexcept {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

void futex_wake_one(std::atomic<std::uint32_t>& word) noexcept {
  syscall(SYS_futex, reinterpret_cast<std::uint32_t*>(&word), FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
}

namespace {
// How long an idle worker looks for work before its task returns.
constexpr std::chrono::microseconds kRunnerSpin{50};
// Queue entries a worker takes at once, at most (ReadyQueue::pop_batch):
// draining 100,000 independent tiny nodes, a lock per node was a third of
// the waitall's samples.
constexpr std::size_t kRunnerBatch = 32;
// How long a worker leaves a lone ready node to the frontend that has just
// recorded it (eager): a frontend that waits right after recording runs it
// itself, with no hand-over between cores; one that records on lets the
// queue grow, and the worker starts at once.
constexpr std::chrono::nanoseconds kGrace{1500};
// Eager, while a frontend streams ready nodes (kStreak pushes of CPU nodes
// ready when recorded behind another queued node, none of the streak's
// ends since: a push not ready, a ready stream-device node, a node made
// ready by a completion): a worker
// leaves the queue to fill until the frontend stops (no growth for kQuiet),
// or kCoalesce entries wait, or kGraceMax passes; then it takes a batch.
// A worker taking each node as it was pushed made every push a transfer
// of the queue's lines between cores: 100,000 independent empty nodes took
// 880 ns each, against 260-320 recorded first and run by a waitall
// (bench_engine's independent, eager against lazy). Not for
// work that the frontend's next nodes depend on (a not-ready push ends the
// streak): run at once, it spares the frontend their edges.
constexpr std::uint32_t kStreak = 16;
constexpr std::chrono::nanoseconds kQuiet{1500};
constexpr std::chrono::nanoseconds kGraceMax{10000};
constexpr std::size_t kCoalesce = 64;
// Between two looks at the queue's size while coalescing: each look moves
// the line the frontend writes on every push to this core.
constexpr std::chrono::nanoseconds kLookEvery{500};
}  // namespace

// A ready node goes to the waiter that tagged it when that waiter is looking
// for work (then only there: no worker is woken for it); otherwise onto the
// queue for the workers, and also into a busy waiter's help list: whichever
// is first claims it.
void EngineImpl::make_ready(Node* n, bool pushed) {
  // seq_cst store, then seq_cst load of the tag: against a wait's tag CAS
  // then its load of the state (request_subgraph), one of the two sees the
  // other, so a node of a wait's subgraph always reaches that wait.
  publish_ready(n);
  if (hand_to_waiter(n)) return;
  queue_.push(n, n->priority, n->seq);
  note_pushed_last(pushed);
  notify_idle();
}

// The ref of whoever takes the node (the queue entry, or the thread about
// to run it), then kReady: once that is visible (a wait's traversal may put
// the node in its help list) the node may run, complete and lose every
// other ref before this thread reads it again.
void EngineImpl::publish_ready(Node* n) {
  NodePool::retain(n);
  if (profiler::detail::on()) n->t_ready = profiler::detail::now_ns();
  n->state.store(NodeState::kReady, std::memory_order_seq_cst);
}

// `n`, just made ready by this thread, claimed to run here; null when a
// wait's traversal took it first or its device's run-ahead bound holds it.
Node* EngineImpl::claim_now(Node* n) {
  if (n->sdev == nullptr && !n->async) {
    // A CPU node run here at once is never published as ready: claims CAS
    // from kReady, so no other thread can take it, and a wait's traversal
    // that reaches it leaves it to this thread and waits for its completion.
    // It needs no ref of its own either: its unfinished ref, dropped at the
    // end of its completion on this thread, keeps it until then. A retain,
    // a seq_cst store and a CAS fewer, and finish_node's release: locked
    // instructions were half of a 10,000-node chain's time per node.
    if (profiler::detail::on()) n->t_ready = profiler::detail::now_ns();
    n->run_here = true;
    n->state.store(NodeState::kRunning, std::memory_order_relaxed);
    return n;
  }
  publish_ready(n);
  if (claim(n)) return n;
  pool_.release(n);
  return nullptr;
}

void EngineImpl::note_pushed_last(bool pushed) noexcept {
  // Loaded first: a store per queued node would move the lines between
  // cores (idle workers read them).
  if (pushed_last_.load(std::memory_order_relaxed) != pushed) pushed_last_.store(pushed, std::memory_order_relaxed);
  if (!pushed && streaming_.load(std::memory_order_relaxed)) streaming_.store(false, std::memory_order_relaxed);
}

// The frontend's streak of pushes ready when recorded (kStreak). Relaxed:
// a hint, whose races only start or end a coalescing early.
void EngineImpl::extend_streak() noexcept {
  const std::uint32_t streak = streak_.load(std::memory_order_relaxed);
  if (streak >= kStreak) return;
  streak_.store(streak + 1, std::memory_order_relaxed);
  if (streak + 1 == kStreak) streaming_.store(true, std::memory_order_relaxed);
}

void EngineImpl::end_streak() noexcept {
  if (streak_.load(std::memory_order_relaxed) == 0) return;
  streak_.store(0, std::memory_order_relaxed);
  if (streaming_.load(std::memory_order_relaxed)) streaming_.store(false, std::memory_order_relaxed);
}

// After kReady is stored: a node tagged by a node wait goes into that
// waiter's help list; when the waiter is idle it is only there (true: the
// caller's queue ref was given up), else it is queued too.
bool EngineImpl::hand_to_waiter(Node* n) {
  const std::uint32_t tag = n->tag.load(std::memory_order_seq_cst);
  if (tag == 0) return false;
  Waiter& w = waiters_.at(tag);
  bool handed = false;
  {
    std::lock_guard g(w.lock);
    if (w.in_use && w.mode == WaitMode::kNode) {
      NodePool::retain(n);
      w.help.push_back(n);
      handed = true;
    }
  }
  // seq_cst: pairs with the waiter storing idle before it looks at its list.
  if (handed && w.idle.load(std::memory_order_seq_cst)) {
    wake_waiters();
    pool_.release(n);
    return true;
  }
  return false;
}

void EngineImpl::add_ready(ReadyBatch& b, Node* n) {
  b.nodes[b.size++] = n;
  if (b.size == b.nodes.size()) flush_ready(b);
}

void EngineImpl::flush_ready(ReadyBatch& b) {
  make_ready_many(b.nodes.data(), b.size);
  b.size = 0;
}

// make_ready of k nodes (k <= kReadyBatch): those an idle node wait tagged
// go to it alone, the rest to the queue under one lock, and as many
// workers are started as there are nodes (up to the configured number).
void EngineImpl::make_ready_many(Node* const* nodes, std::size_t k) {
  if (k == 0) return;
  std::array<Node*, kReadyBatch> queued{};
  std::size_t q = 0;
  for (std::size_t i = 0; i < k; ++i) {
    Node* n = nodes[i];
    publish_ready(n);
    if (!hand_to_waiter(n)) queued[q++] = n;
  }
  queue_.push_batch(queued.data(), q);
  if (q != 0) note_pushed_last(false);
  // A worker started per node, while any is left to start.
  for (std::size_t i = 0; i < q; ++i) {
    notify_idle();
    if (workers_.active() >= num_threads_) break;
  }
}

// Eager: a small CPU node that became ready on the thread recording it runs
// there at once, as a worker would run it (successors it makes ready go to
// the queue). No queue entry and no wake-up: on a machine where moving a
// node, its vars and its arrays to another core costs microseconds, a node
// whose work is a few hundred nanoseconds is cheaper here. A wait that
// tagged it meanwhile sees it complete as if a worker had run it.
void EngineImpl::run_inline(Node* n) {
  if (Node* m = claim_now(n); m != nullptr) run_chain(m, -1, Bypass{});
}

// After a queue push: one more worker if fewer than configured are active;
// with none to start, parked frontend threads that help with any work.
void EngineImpl::notify_idle() {
  if (workers_.start([this](int worker) { runner(worker); })) return;
  if (events_.any_parked() &&
      (num_threads_ == 0 || waiters_.any_waitall(std::memory_order_relaxed) ||
       waiters_.any_throttled(std::memory_order_relaxed))) {
    wake_waiters();
  }
}

// Takes a ready node to run (CPU) or to launch (stream device). A stream
// node whose device has its run-ahead bound in flight is held instead.
bool EngineImpl::claim(Node* n) {
  NodeState expected = NodeState::kReady;
  if (!n->state.compare_exchange_strong(expected, NodeState::kRunning, std::memory_order_acq_rel)) {
    return false;
  }
  return n->sdev == nullptr || claim_stream(n);
}

Node* EngineImpl::pop_queue() {
  while (Node* n = queue_.pop()) {
    if (claim(n)) return n;  // the queue entry's ref passes to the caller
    pool_.release(n);        // claimed elsewhere already, or held by its device
  }
  return nullptr;
}

Node* EngineImpl::pop_help(Waiter& w) {
  for (;;) {
    Node* n = nullptr;
    {
      std::lock_guard g(w.lock);
      if (w.help.empty()) return nullptr;
      n = w.help.back();
      w.help.pop_back();
    }
    if (claim(n)) return n;
    pool_.release(n);
  }
}

// Runs `n` (claimed, one ref owned) and then every successor handed back by
// bypass, on this thread.
void EngineImpl::run_chain(Node* n, int worker, Bypass bypass) {
  while (n != nullptr) {
    run_node(n, worker);
    n = finish_node(n, bypass);
  }
}

void EngineImpl::run_node(Node* n, int worker) {
  NodePool::ran_here(n);
  if (n->sdev == nullptr) {
    execute(n, RunContext{n->device, nullptr, worker, -1, nullptr, {}});
  } else {
    launch(n);
  }
}

// After run_node: a CPU node is done; a stream node is launched (unless its
// completion, which may come first, already said so). Drops the runner's
// ref; returns a claimed successor to run next, or null.
Node* EngineImpl::finish_node(Node* n, Bypass bypass) {
  Node* next = nullptr;
  if (n->sdev == nullptr) {
    // An async node completes on the second arrival: its runner's or its
    // Completion's, whichever is later.
    if (!n->async) {
      // Claimed by claim_now without a ref: complete() drops the last one
      // this thread may count on, so n is not touched after it.
      const bool run_here = n->run_here;
      n->run_here = false;
      next = complete(n, bypass);
      if (run_here) return next;
    } else if (n->async_arrivals.fetch_add(1, std::memory_order_acq_rel) == 1) {
      if (n->async_started) bury(n);  // its Completion came first; its function may go now
      next = complete(n, bypass);
    }
  } else if (n->launch_failed) {
    (void)mark_launched(n, Bypass{});
    device_done(n);
    next = complete(n, bypass);
  } else {
    next = mark_launched(n, bypass);
  }
  pool_.release(n);
  return next;
}

// An async node's Completion: its outcome, then its arrival (any thread;
// the Completion holds no ref, the node's own is held until it completes).
void EngineImpl::async_done(Node* n, std::exception_ptr error) noexcept {
  ErrorPtr err;
  if (error) {
    try {
      err = std::make_shared<ErrorRecord>(n->name.str(), std::move(error), n->seq);
    } catch (...) {  // out of memory: the node still completes
    }
  }
  for (VarState* v : n->writes) v->poison = err;
  n->failed = err != nullptr;
  n->error = std::move(err);
  if (n->async_arrivals.fetch_add(1, std::memory_order_acq_rel) == 1) {
    bury(n);  // the runner has returned: its function may go (by a frontend thread)
    (void)complete(n, Bypass{});
  }
}

// `s` has just become ready on this thread: keep it as the bypass node when
// allowed and none is kept yet, else hand it off.
Node* EngineImpl::ready_successor(Node* s, Node* kept, Bypass bypass) {
  if (kept == nullptr && can_bypass(s, bypass)) return claim_now(s);
  make_ready(s);
  return kept;
}

bool EngineImpl::can_bypass(Node* s, Bypass bypass) const {
  return bypass.on && !queue_.has_priorities() &&
         (bypass.only_tag == 0 || s->tag.load(std::memory_order_seq_cst) == bypass.only_tag);
}

void EngineImpl::execute(Node* n, const RunContext& ctx) {
  InputFailure input = input_failure(n);
  ErrorPtr err = std::move(input.error);
  bool failed = false;
  // Still "inside the op" while its captures are destroyed: a destructor
  // that records (a freed array recording its var's deletion) must not wait.
  const EngineImpl* outer = tls_running_engine;
  tls_running_engine = this;
  const bool profiling = profiler::detail::on();
  if (profiling) {
    n->t_start = profiler::detail::now_ns();
    n->worker = ctx.worker_index;
  }
  if (!err || n->run_on_failed_input) {
    range_push(n->name.c_str());
    // Only push_async's wrapper reads it: set for async nodes alone.
    Node* const outer_node = tls_running_node;
    if (n->async) tls_running_node = n;
    try {
      if (err) {
        RunContext with_cause = ctx;
        with_cause.failed_input = err->cause;
        n->fn(with_cause);
        if (n->async) err = nullptr;  // its Completion reports the outcome
      } else {
        n->fn(ctx);
      }
    } catch (...) {
      err = std::make_shared<ErrorRecord>(n->name.str(), std::current_exception(), n->seq);
      failed = true;
    }
    tls_running_node = outer_node;
    range_pop();
  } else if (n->async) {
    // Skipped: nothing started, so nothing will call a Completion.
    n->async_arrivals.fetch_add(1, std::memory_order_acq_rel);
  }
  if (profiling) n->t_end = profiler::detail::now_ns();
  if (n->async && !err) {
    n->async_started = true;
    // Started: async_done sets the outcome (maybe already has, on another
    // thread); the runner touches none of it. The function, whose captures
    // the started work may still use, is destroyed at completion.
    tls_running_engine = outer;
    return;
  }
  poison_writes(n, err, input, failed);
  if ((ctx.worker_index >= 0 || ctx.stream_device != nullptr) && !n->fn.trivially_destructible()) {
    bury(n);  // a worker or device thread: the frontend destroys the captures
  } else {
    n->fn.reset();  // captures die here, outside every lock: their destructors may record
  }
  tls_running_engine = outer;
  n->error = std::move(err);
  n->failed = failed;
}

// A function that ran on a worker or a device thread is destroyed by the
// next frontend call (push, a wait) instead, unless destroying it runs no
// code (captures of pointers and numbers, stored inline; reset at once):
// see graveyard.hpp. The node (one ref) lives until then. Any thread.
void EngineImpl::bury(Node* n) noexcept {
  NodePool::retain(n);
  graveyard_.bury(n);
}

// A frontend thread outside any op, holding no engine lock: destroys the
// buried functions (their destructors may record, which drains again).
void EngineImpl::drain_graveyard() noexcept {
  Node* n = graveyard_.take_all();
  if (n == nullptr) return;
  // "Inside the op" while captures are destroyed, as if on the thread that
  // ran them: a destructor that records does not drain, wait or stall.
  const EngineImpl* outer = tls_running_engine;
  tls_running_engine = this;
  while (n != nullptr) {
    Node* next = n->grave_next;
    n->fn.reset();
    pool_.release(n);
    n = next;
  }
  tls_running_engine = outer;
}

// Marks `n` done: successors lose one pending input (the first made ready
// is returned for bypass), predecessors lose a reference, a stream node's
// vars a hold, waits for it are woken. The caller keeps a ref of its own.

Node* EngineImpl::complete(Node* n, Bypass bypass) {
  if (n->t_end != 0) {
    trace(n);
    n->t_push = n->t_ready = n->t_start = n->t_end = n->t_launch_start = n->t_launch_end = 0;
  }
  // Nodes that ran are counted by the completion count below, less the
  // skipped ones: a counter of their own was a locked add on every node.
  // Failures and skips are counted before the node is done.
  if (n->error) errors_.note(n);
  Node* next = nullptr;
  {
    std::lock_guard g(n->lock);
    // seq_cst: a wait increments `waiters` and then reads the state; this
    // store and the load of `waiters` below form the other half.
    n->state.store(NodeState::kDone, std::memory_order_seq_cst);
    n->live.store(false, std::memory_order_relaxed);
    // The first successor made ready may be kept for bypass; the others
    // are queued in batches (one queue lock and wake-up per batch).
    ReadyBatch ready;
    for (Node* s : n->succs) {
      // Launch edges were satisfied when n was launched.
      if (!launch_edge(n, s) && s->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        if (next == nullptr && can_bypass(s, bypass)) {
          next = claim_now(s);
        } else {
          add_ready(ready, s);
        }
      }
    }
    flush_ready(ready);
    n->succs.clear();
    for (Node* p : n->preds) pool_.release(p);
    n->preds.clear();
  }
  if (n->sdev != nullptr) {  // only stream-device nodes hold their vars (var_table.hpp)
    for (VarState* v : n->reads) vars_.drop(v);
    for (VarState* v : n->writes) vars_.drop(v);
  }
  // seq_cst: a waitall registers (waiters_) and then sums the counts. Only
  // then are the other threads' counts summed (their cache lines): the
  // completion that drains the epoch wakes it (pending_counts.hpp).
  counts_.completed(n->epoch, n->cost_bytes);
  const bool epoch_drained = waiters_.any_waitall() && counts_.unfinished_in(n->epoch) == 0;
  if (n->waiters.load(std::memory_order_seq_cst) != 0 ||
      epoch_drained ||
      (waiters_.any_throttled() && !over_window(1, UnrequestedLists::kNone))) {
    wake_waiters();
  }
  pool_.release(n);  // the unfinished ref
  return next;
}

// kQuiet, kCoalesce, kGraceMax above. Only reads: the flag, the size.
void EngineImpl::await_recording() const noexcept {
  using Clock = std::chrono::steady_clock;
  std::size_t seen = queue_.size();
  if (seen == 0 || seen >= kCoalesce || queue_.has_urgent()) return;
  Clock::time_point now = Clock::now();
  const Clock::time_point limit = now + kGraceMax;
  Clock::time_point quiet_until = now + kQuiet;
  for (;;) {
    // The flag every few pauses (its line is written only when it
    // changes), the queue's size every kLookEvery, and the core yielded
    // in between: with more threads than cores the frontend may be
    // waiting for it.
    const Clock::time_point look = now + kLookEvery;
    do {
      for (int i = 0; i < 4; ++i) cpu_relax();
      if (!streaming_.load(std::memory_order_relaxed)) return;
      now = Clock::now();
    } while (now < look);
    const std::size_t size = queue_.size();
    // Taken meanwhile (a wait ran some), enough for a batch, or a node of
    // positive priority waiting: start.
    if (size < seen || size >= kCoalesce || queue_.has_urgent()) return;
    if (size > seen) {
      seen = size;
      quiet_until = now + kQuiet;
    }
    if (now >= quiet_until || now >= limit) return;
    std::this_thread::yield();
  }
}

void EngineImpl::runner(int worker) {
  if (profiler::detail::on()) {
    thread_local bool named = false;
    if (!named) {
      named = true;
      profiler::detail::name_thread("worker " + std::to_string(worker));
    }
  }
  const bool grace = options_.policy == Policy::kEager;
  // Queue entries taken at once (one ref each), run oldest first; a
  // prioritised node queued meanwhile goes before the rest of the batch.
  // Nodes in a batch are still kReady: a wait that needs one claims it
  // from its help list as it would from the queue.
  Node* batch[kRunnerBatch];
  std::size_t next = 0;
  std::size_t count = 0;
  const auto ways = static_cast<std::size_t>(num_threads_) + 1;  // the workers and a helping frontend
  auto take = [&]() -> Node* {
    for (;;) {
      Node* n = nullptr;
      if (next < count) {
        if (queue_.has_urgent()) n = queue_.pop();
        if (n == nullptr) n = batch[next++];
      } else {
        count = queue_.pop_batch(batch, kRunnerBatch, ways);
        next = 0;
        if (count == 0) return nullptr;
        n = batch[next++];
      }
      if (claim(n)) return n;  // the entry's ref passes to the caller
      pool_.release(n);        // claimed elsewhere already, or held by its device
    }
  };
  for (;;) {
    // Only for nodes a push has just queued: a node a completion made
    // ready has no frontend about to take it, and waiting for one held up
    // every second node of a worker's pipeline by the whole grace.
    if (grace && next == count) {
      if (streaming_.load(std::memory_order_relaxed)) {
        await_recording();
      } else if (queue_.size() == 1 && pushed_last_.load(std::memory_order_relaxed)) {
        const auto until = std::chrono::steady_clock::now() + kGrace;
        for (unsigned i = 0; queue_.size() == 1; ++i) {
          if (i % 8 == 7 && std::chrono::steady_clock::now() >= until) break;
          cpu_relax();
        }
      }
    }
    if (Node* n = take(); n != nullptr) {
      // run_chain, except that a chain of bypassed successors, which may
      // be long, gives the rest of the batch back to the queue first, where
      // the other workers and the waits can take it.
      while (n != nullptr) {
        run_node(n, worker);
        n = finish_node(n, Bypass{true, 0});
        if (n != nullptr && next < count) {
          try {
            queue_.push_batch(batch + next, count - next);
            next = count;
          } catch (...) {  // out of memory growing the queue: this worker runs them later
          }
          if (next == count) notify_idle();
        }
      }
      continue;
    }
    // Idle: look for work a little longer (a new node is likely soon and
    // re-enqueueing a task costs more), yielding so a thread that has the
    // work to record gets the core.
    if (spin_for(kRunnerSpin, [&] { return !queue_.empty(); })) continue;
    workers_.retire();
    // A push that saw this runner still active did not start another: look
    // once more before leaving, and stay if there is work and room.
    if (!queue_.empty() && workers_.rejoin()) continue;
    break;
  }
}

}  // namespace lazydag::engine::detail
