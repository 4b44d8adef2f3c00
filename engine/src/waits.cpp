// Waits: frontend threads that block until a node (or everything recorded
// before them) is done, running ready work meanwhile (their own subgraph
// first); the watchdog; the pending window's stall; naive's run-now.
// What a wait throws is errors.cpp; what the watchdog reports,
// introspect.cpp.
//
// A waiting thread is a worker: it runs the nodes handed to its help list
// (its required subgraph), then anything on the ready queue. With nothing
// to run it spins briefly, then parks on the event count `events_`
// (event_count.hpp). Every event a waiter can wait for (its target done,
// the oldest unfinished node advancing past a waitall, the window
// draining, work handed to it) notifies it after making itself visible; a
// waiter takes the epoch before its last check of its condition, so a
// notification in between makes the park return at once: no wake-up is
// lost.
#include "engine_impl.hpp"
#include "errors.hpp"

#include <lazydag/engine/sync_debug.hpp>

#include <algorithm>
#include <chrono>
#include <iostream>

#include "profiler_internal.hpp"
#include "tick_clock.hpp"

namespace lazydag::engine::detail {

namespace {

// How long a waiter with nothing to run spins (then yields) before parking.
constexpr std::chrono::microseconds kWaitSpin{20};

// The stack of a wait's traversal of its subgraph: the thread's own, kept
// between waits (no allocation per wait).
std::vector<Node*>& traversal_stack() {
  thread_local std::vector<Node*> stack;
  return stack;
}

}  // namespace

// Times one blocking call and accounts for it (sync debug, counters).
class BlockingScope {
 public:
  BlockingScope(std::array<std::atomic<std::uint64_t>, kBlockingCallKinds>& calls,
                std::atomic<std::uint64_t>& blocked_ticks, const CallSite& site)
      : calls_(calls), blocked_ticks_(blocked_ticks), site_(site) {
    detail::sync_debug_enter(site);
    t0_ = TickClock::now();
  }
  ~BlockingScope() {
    const std::uint64_t ticks = TickClock::since(t0_);
    calls_[static_cast<std::size_t>(site_.kind)].fetch_add(1, std::memory_order_relaxed);
    blocked_ticks_.fetch_add(ticks, std::memory_order_relaxed);
    if (sync_debug() == SyncDebug::kOff && !profiler::detail::on()) return;
    const std::uint64_t ns = TickClock::to_ns(ticks);
    detail::sync_debug_exit(site_, ns);
    if (profiler::detail::on()) {
      const std::uint64_t end = profiler::detail::now_ns();
      profiler::detail::record(profiler::detail::FrontendEvent{
          "wait", std::string(to_string(site_.kind)),
          std::string(site_.where.file_name()) + ":" + std::to_string(site_.where.line()), end - ns, end});
    }
  }
  BlockingScope(const BlockingScope&) = delete;
  BlockingScope& operator=(const BlockingScope&) = delete;

 private:
  std::array<std::atomic<std::uint64_t>, kBlockingCallKinds>& calls_;
  std::atomic<std::uint64_t>& blocked_ticks_;
  const CallSite& site_;
  std::uint64_t t0_ = 0;
};

void EngineImpl::wake_waiters() noexcept { events_.notify_all(); }

// A waiter slot (waiter_slots.hpp), or 0 when all are taken: the wait then
// runs untagged (it still helps with the ready queue).
std::uint32_t EngineImpl::register_waiter(WaitMode mode) { return waiters_.acquire(mode); }

void EngineImpl::unregister_waiter(std::uint32_t tag, WaitMode mode) {
  SmallVector<Node*, 16> left;
  waiters_.release(tag, mode, left);
  // Work handed only to this waiter (it was idle then) goes to the queue.
  for (Node* n : left) {
    if (n->state.load(std::memory_order_acquire) == NodeState::kReady) {
      queue_.push(n, n->priority, n->seq);  // the help entry's ref becomes the queue's
      notify_idle();
    } else {
      pool_.release(n);
    }
  }
}

// Requests every unfinished ancestor of `target` and tags it for the
// waiter: ready ones go to its help list now, the others are handed to it
// when they become ready. A node is tagged once, by the first waiter that
// reaches it, and at that point its unfinished ancestors get tagged too
// (edges only point from older to newer nodes), so a later traversal stops
// at any tagged node and every node is traversed O(1) times over the
// engine's life. Tags outlive their waiter only on done nodes: a waiter ends
// when its target is done, after every ancestor. Without a slot (tag 0) the
// traversal stops at requested nodes instead: their ancestors are requested
// already. Iterative: a chain of millions must not recurse.
void EngineImpl::request_subgraph(Node* target, std::uint32_t tag) {
  std::vector<Node*>& stack = traversal_stack();
  stack.clear();
  NodePool::retain(target);
  stack.push_back(target);
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    std::uint32_t none = 0;
    const bool visit = n->state.load(std::memory_order_acquire) != NodeState::kDone &&
                       (tag != 0 ? n->tag.compare_exchange_strong(none, tag, std::memory_order_seq_cst)
                                 : !n->requested.load(std::memory_order_relaxed));
    if (visit) {
      {
        std::lock_guard g(n->lock);
        for (Node* p : n->preds) {
          if (p->state.load(std::memory_order_acquire) != NodeState::kDone &&
              p->tag.load(std::memory_order_relaxed) == 0) {
            NodePool::retain(p);
            stack.push_back(p);
          }
        }
      }
      if (!n->requested.load(std::memory_order_relaxed)) {
        request(n);  // make_ready hands it to the waiter when it is ready
      } else if (tag != 0 && n->state.load(std::memory_order_seq_cst) == NodeState::kReady) {
        // Ready and queued already: this waiter runs it first, and takes it
        // off the queue when it is the newest entry (typically a node
        // recorded just before this wait).
        if (!queue_.remove_newest(n)) NodePool::retain(n);
        Waiter& w = waiters_.at(tag);
        std::lock_guard g(w.lock);
        w.help.push_back(n);
      }
    }
    pool_.release(n);
  }
}

// Clears `tag` from the unfinished nodes of target's subgraph that carry it.
void EngineImpl::untag(Node* target, std::uint32_t tag) {
  std::vector<Node*>& stack = traversal_stack();
  stack.clear();
  NodePool::retain(target);
  stack.push_back(target);
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    std::uint32_t mine = tag;
    if (n->state.load(std::memory_order_acquire) != NodeState::kDone &&
        n->tag.compare_exchange_strong(mine, 0, std::memory_order_seq_cst)) {
      std::lock_guard g(n->lock);
      for (Node* p : n->preds) {
        NodePool::retain(p);
        stack.push_back(p);
      }
    }
    pool_.release(n);
  }
}

// Runs this waiter's share of ready work until done(). Returns false when
// the watchdog expired first (only when `watchdog` and it is on).
template <class Done>
bool EngineImpl::help_until(std::uint32_t tag, Done done, bool watchdog) {
  // A watchdog of a billion seconds or more (infinity too) never fires: the
  // deadline would overflow the clock's nanoseconds.
  const bool timed = watchdog && options_.watchdog_seconds > 0 && options_.watchdog_seconds < 1e9;
  // The clock is read only for a watchdog (a tenth of a short wait's cost
  // went to reading it).
  const auto deadline = timed ? std::chrono::steady_clock::now() +
                                    std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                        std::chrono::duration<double>(options_.watchdog_seconds))
                              : std::chrono::steady_clock::time_point{};
  Waiter* w = tag != 0 ? &waiters_.at(tag) : nullptr;
  // A node wait runs only its own subgraph: an unrelated op may block on
  // something only this thread would do next (a wait must not start it).
  // waitall and the window run anything ready. An untagged node wait (every
  // slot taken) has no help list and runs the queue.
  const bool global = w == nullptr || w->mode != WaitMode::kNode;
  auto set_idle = [&](bool v) {
    if (w != nullptr) w->idle.store(v, std::memory_order_seq_cst);
  };
  for (;;) {
    if (done()) break;
    Node* n = w != nullptr ? pop_help(*w) : nullptr;
    if (n == nullptr && global) n = pop_queue();
    if (n != nullptr) {
      set_idle(false);
      run_chain(n, -1, Bypass{true, global ? 0 : tag});
      drain_graveyard();
      continue;
    }
    // Nothing to run: spin a little (the work we wait for is likely short
    // and running elsewhere), yielding so a device executor or a worker on
    // this core gets it, then park. Captures buried meanwhile are destroyed
    // first, while work for this waiter still also goes to the queue.
    drain_graveyard();
    set_idle(true);
    const bool more = spin_for(kWaitSpin, [&] {
      if (done() || (global && !queue_.empty())) return true;
      if (w == nullptr) return false;
      std::lock_guard g(w->lock);
      return !w->help.empty();
    });
    if (more) continue;
    const std::uint32_t e = events_.prepare();
    bool work = done() || (global && !queue_.empty());
    if (!work && w != nullptr) {
      std::lock_guard g(w->lock);
      work = !w->help.empty();
    }
    if (!work) {
      std::int64_t timeout = -1;
      if (timed) {
        timeout = std::max<std::int64_t>(
            0, std::chrono::duration_cast<std::chrono::nanoseconds>(deadline - std::chrono::steady_clock::now())
                   .count());
      }
      events_.park(e, timeout);
    }
    events_.done();
    if (timed && std::chrono::steady_clock::now() >= deadline && !done()) {
      set_idle(false);
      return false;
    }
  }
  set_idle(false);
  return true;
}

// The caller holds a ref on target.
void EngineImpl::wait_node(Node* target) {
  if (target->state.load(std::memory_order_acquire) == NodeState::kDone) return;
  // Two targets that can run at once, here, with no waiter slot, tag or
  // help list: running them is the whole wait.
  // Lazy: an unrequested CPU node whose only count left is "until
  // requested" (its inputs are done, and its push has dropped its record
  // guard). Requesting it takes `pending` to 0, so this thread owns it and
  // runs it at once, as a completion runs a bypassed successor.
  if (target->sdev == nullptr && !target->async && !target->requested.load(std::memory_order_relaxed) &&
      target->pending.load(std::memory_order_acquire) == 1 && unrequested_.take(target)) {
    if (target->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      run_chain(claim_now(target), -1, Bypass{});
      return;
    }
    // Otherwise some count was left after all; whoever drops it makes the
    // node ready, and the general way below waits for that.
  }
  // Eager: a ready CPU node that is the newest queue entry (typically
  // pushed just before this wait): its inputs are done. Taken off the queue
  // and claimed; if another wait claimed it first (from its help list), the
  // general way below waits for it.
  if (target->sdev == nullptr && !target->async && queue_.remove_newest(target)) {
    if (claim(target)) {
      run_chain(target, -1, Bypass{});  // the queue entry's ref, dropped by finish_node
      return;
    }
    pool_.release(target);  // the queue entry's ref
  }
  const std::uint32_t tag = register_waiter(WaitMode::kNode);
  target->waiters.fetch_add(1, std::memory_order_seq_cst);
  if (tag != 0) waiters_.at(tag).idle.store(true, std::memory_order_seq_cst);  // traversal's first ready node is ours
  request_subgraph(target, tag);
  const bool finished = help_until(
      tag, [&] { return target->state.load(std::memory_order_seq_cst) == NodeState::kDone; }, true);
  target->waiters.fetch_sub(1, std::memory_order_relaxed);
  if (!finished && tag != 0) {
    // Leave no tag of this waiter behind on unfinished nodes: the slot's
    // next owner would be handed them.
    untag(target, tag);
  }
  unregister_waiter(tag, WaitMode::kNode);
  if (!finished) {
    std::string report = describe_pending(target);
    std::cerr << report;
    throw WatchdogTimeout(report);
  }
}

// naive: `n` (one ref owned by the caller, dropped here) runs on this
// thread, and so does whatever its function (or a destructor inside it)
// records, before push returns.
void EngineImpl::run_now_naive(Node* n) {
  struct Drop {
    NodePool& pool;
    Node* n;
    ~Drop() { pool.release(n); }
  } drop{pool_, n};
  wait_node(n);
  const std::uint32_t tag = register_waiter(WaitMode::kAll);
  help_until(tag, [&] { return queue_.empty(); }, /*watchdog=*/false);
  unregister_waiter(tag, WaitMode::kAll);
}

// The window: a frontend that has twice max_pending nodes (or, eager, twice
// max_pending_bytes of cost) unfinished helps until it is down to once.
void EngineImpl::throttle_frontend() {
  const StallHooks hooks = stall_hooks();
  struct Stall {
    const StallHooks& h;
    explicit Stall(const StallHooks& hooks) : h(hooks) {
      if (h.enter != nullptr) h.enter();
    }
    ~Stall() {
      if (h.leave != nullptr) h.leave();
    }
    Stall(const Stall&) = delete;
    Stall& operator=(const Stall&) = delete;
  } stall(hooks);
  const std::uint32_t tag = register_waiter(WaitMode::kThrottle);
  const std::uint8_t mine = UnrequestedLists::mine();
  help_until(tag, [&] { return !over_window(1, mine); },
             /*watchdog=*/false);
  unregister_waiter(tag, WaitMode::kThrottle);
}

// ---- public waits -----------------------------------------------------------

void EngineImpl::wait_to_read(Var v, const CallSite& site) {
  check_not_in_op("wait_to_read");
  BlockingScope scope(blocking_calls_, blocked_ticks_, site);
  VarState* vs = vars_.lookup(v);
  if (vs == nullptr) vars_.check(nullptr, v, "wait_to_read");
  Node* t = nullptr;
  {
    std::lock_guard g(vs->mu);
    vars_.check(vs, v, "wait_to_read");
    t = vs->last_writer;
    if (t != nullptr) NodePool::retain(t);
  }
  if (t == nullptr) {
    drain_graveyard();
    return;
  }
  struct Drop {
    NodePool& pool;
    Node* n;
    ~Drop() { pool.release(n); }
  } drop{pool_, t};
  wait_node(t);
  drain_graveyard();
  if (ErrorPtr e = write_error(t, vs)) {
    e->reported.store(true, std::memory_order_relaxed);
    throw_op_error(*e, 0);
  }
}

void EngineImpl::wait_to_write(Var v, const CallSite& site) {
  check_not_in_op("wait_to_write");
  BlockingScope scope(blocking_calls_, blocked_ticks_, site);
  std::vector<Node*> targets;  // one ref each
  Node* writer = nullptr;
  VarState* vs = vars_.lookup(v);
  if (vs == nullptr) vars_.check(nullptr, v, "wait_to_write");
  {
    std::lock_guard g(vs->mu);
    vars_.check(vs, v, "wait_to_write");
    writer = vs->last_writer;
    if (writer != nullptr) targets.push_back(writer);
    for (Node* r : vs->readers) {
      if (r->state.load(std::memory_order_acquire) != NodeState::kDone) targets.push_back(r);
    }
    for (Node* t : targets) NodePool::retain(t);
  }
  struct Drop {
    NodePool& pool;
    std::vector<Node*>& ts;
    ~Drop() {
      for (Node* t : ts) pool.release(t);
    }
  } drop{pool_, targets};
  for (Node* t : targets) wait_node(t);
  drain_graveyard();
  if (writer != nullptr) {
    if (ErrorPtr e = write_error(writer, vs)) {
      e->reported.store(true, std::memory_order_relaxed);
      throw_op_error(*e, 0);
    }
  }
}

void EngineImpl::waitall(const CallSite& site) {
  check_not_in_op("waitall");
  BlockingScope scope(blocking_calls_, blocked_ticks_, site);
  wait_all_recorded(/*watchdog=*/true);
}

// waitall without the blocking-call accounting: also used by the destructor
// and at exit, which must run what was recorded whatever sync debug says.
void EngineImpl::wait_all_recorded(bool watchdog) {
  std::uint32_t tag = 0;
  std::size_t slot = 0;
  {
    // Under lazy, recorders read the epoch under their list's lock: a node
    // counted in the old parity is in a list requested below.
    slot = waitall_epoch_.fetch_add(1, std::memory_order_seq_cst) & 1;  // later nodes: the other parity
    tag = register_waiter(WaitMode::kAll);
    // Newest first: the oldest nodes become ready last, so workers do not
    // start a chain while this thread is still writing the counts of the
    // nodes it is about to run (both threads on every node's lines). The
    // invariant "requested => ancestors requested" holds again once every
    // list is done. The ready ones are queued 64 at a time under one queue
    // lock.
    BatchedRequests batch(*this);
    unrequested_.take_all([&](Node* n) {
      if (n->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) add_ready(batch.nodes, n);
    });
  }
  const bool finished = help_until(
      tag, [&] { return counts_.unfinished_in(slot) == 0; }, watchdog);
  unregister_waiter(tag, WaitMode::kAll);
  drain_graveyard();
  if (!finished) {
    std::string report = describe_pending(nullptr);
    std::cerr << report;
    throw WatchdogTimeout(report);
  }
  errors_.report_unreported();
}

}  // namespace lazydag::engine::detail
