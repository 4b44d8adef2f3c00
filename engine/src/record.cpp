// Recording: vars, nodes and the dependency edges derived from read and
// write sets; requests (what may run) and the pending window.
//
// There is no recorder lock. A push takes the locks of the vars it names,
// in address order (so two pushes sharing vars are ordered the same way on
// each, and cannot deadlock), and holds them while it links its node and
// makes it the vars' last writer or a reader: pushes on disjoint vars do
// not wait for each other, and a wait takes only the lock of the var it
// waits for. An edge to a predecessor is added under that predecessor's
// node lock, which its completion also takes to mark it done and collect
// its successors, so an edge is either seen by the completion or not added
// at all. Under lazy a node waits in its thread's unrequested list (a lock
// per list, unrequested.hpp) until a wait, the window or a waitall takes
// its request; eager requests each node as it is recorded.
#include "engine_impl.hpp"

#include <algorithm>
#include <string>

#include "profiler_internal.hpp"

namespace lazydag::engine::detail {

namespace {

// The locks of a push's vars, taken in address order (one total order for
// every push) and released when it ends, also on a throw.
class VarLocks {
 public:
  VarLocks() = default;
  VarLocks(const VarLocks&) = delete;
  VarLocks& operator=(const VarLocks&) = delete;
  ~VarLocks() { unlock_all(); }
  // Adds s unless it is there already (before lock_all).
  void add(VarState* s) {
    if (!held_.contains(s)) held_.push_back(s);
  }
  void unlock_all() noexcept {
    for (VarState* s : held_) s->mu.unlock();
    held_.clear();
  }
  void lock_all() noexcept {
    // Insertion sort: a push names a handful of vars.
    for (VarState** i = held_.begin(); i != held_.end(); ++i) {
      for (VarState** j = i; j != held_.begin() && std::less<>()(*j, *(j - 1)); --j) std::swap(*j, *(j - 1));
    }
    for (VarState* s : held_) s->mu.lock();
  }

 private:
  SmallVector<VarState*, 8> held_;
};

}  // namespace

void EngineImpl::check_not_in_op(std::string_view call) const {
  if (tls_running_engine == this) {
    throw InvalidArgument(std::string(call) +
                          " called from inside a running op of the same engine: it would "
                          "wait for itself; record a dependent op instead");
  }
}

Var EngineImpl::new_var(const char* owner) { return vars_.create(owner); }

// The var is refused from now on; its slot is recycled once no access is
// pending (var_table.hpp). With a buffer to release (an owned stream-device
// buffer), whoever recycles the slot gives it back: the last stream
// access's completion, or this call when none is pending; false, nothing
// done, when a pending access is a CPU node (those take no hold, so the
// slot would wait for a sweep, and the buffer with it).
bool EngineImpl::delete_var(Var v, bool by_owner, const VarRelease* release) {
  const std::string_view call =
      release != nullptr ? std::string_view("delete_owned_var_and_free") : std::string_view("delete_var");
  VarState* s = vars_.lookup(v);
  if (s == nullptr) vars_.check(nullptr, v, call);
  {
    std::lock_guard g(s->mu);
    vars_.check(s, v, call);
    if (s->owner != nullptr && !by_owner) {
      throw InvalidArgument("delete_var: var #" + std::to_string(v.index) + " belongs to " + s->owner +
                            ", which deletes it when its last handle goes");
    }
    if (release != nullptr) {
      if (!VarTable::held_by_pending(s)) return false;
      s->release = *release;
      if (s->last_writer != nullptr && s->last_writer->sdev == release->dev) s->release.stream = s->last_writer->stream;
    }
    s->alive.store(false, std::memory_order_relaxed);  // no push or wait takes it after this
  }
  if (release != nullptr) {
    // The liveness hold, at once (acq_rel: the release reaches whoever
    // drops the last hold).
    vars_.drop(s);
  } else {
    vars_.retire(s);
  }
  return true;
}

bool EngineImpl::delete_var_and_free(Var v, Device device, void* p, std::size_t bytes) {
  if (!device.is_stream_device()) {
    throw InvalidArgument("delete_owned_var_and_free: " + device.str() + " is not a stream device");
  }
  const VarRelease release{&devices_.get(device), p, bytes, 0};
  return delete_var(v, /*by_owner=*/true, &release);
}

bool EngineImpl::add_edge(Node* pred, Node* n, bool give, bool& shared) {
  if (n->preds.contains(pred)) return false;
  // Done already: no edge, and no need for its lock, whose line the thread
  // that completed it may still hold (acquire: pairs with the completion's
  // store of kDone, after the node's effects, as the load under the lock).
  if (pred->state.load(std::memory_order_acquire) == NodeState::kDone) return false;
  // Under its lock even when it is not requested: a wait (or the window)
  // may request it, and it may run and complete, while this edge is added.
  std::lock_guard g(pred->lock);
  const NodeState st = pred->state.load(std::memory_order_acquire);
  if (st == NodeState::kDone) return false;
  n->preds.push_back(pred);
  if (!give) NodePool::retain(pred);
  // A launched producer satisfies a launch edge already: n's stream waits
  // for its event (kept alive by the ref above).
  if (launch_edge(pred, n) && st == NodeState::kLaunched) return true;
  pred->succs.push_back(n);
  // Until n is in a predecessor's successor list, whose completion may
  // decrement its count meanwhile, only this recorder touches n->pending: a
  // load and a store then, not a locked add. (This predecessor cannot
  // complete while its lock is held.)
  if (shared) {
    n->pending.fetch_add(1, std::memory_order_relaxed);
  } else {
    n->pending.store(n->pending.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  shared = true;
  return true;
}

std::uint32_t EngineImpl::link(Node* n, std::span<VarState* const> pure_reads,
                               std::span<VarState* const> writes) {
  bool shared = false;     // see add_edge
  std::uint32_t refs = 0;  // the vars' refs on n, stored by push
  for (VarState* s : pure_reads) {
    if (s->last_writer != nullptr) add_edge(s->last_writer, n, false, shared);  // read after write
    if (s->readers.size() >= s->prune_at) {
      // Drop finished readers so a var read forever does not grow forever.
      std::uint32_t kept = 0;
      for (Node* r : s->readers) {
        if (r->state.load(std::memory_order_acquire) == NodeState::kDone) {
          pool_.release(r);
        } else {
          s->readers[kept++] = r;
        }
      }
      s->readers.resize_down(kept);
      s->prune_at = std::max<std::uint32_t>(8, kept * 2);
    }
    s->readers.push_back(n);
    ++refs;
  }
  for (VarState* s : writes) {
    // The var's refs on its last writer and readers, which it drops here,
    // become the edges' refs when the edges are made: a release and a
    // retain fewer per edge.
    if (s->last_writer != nullptr && !add_edge(s->last_writer, n, true, shared)) {  // write after write
      pool_.release(s->last_writer);
    }
    for (Node* r : s->readers) {
      if (!add_edge(r, n, true, shared)) pool_.release(r);  // write after read
    }
    s->readers.clear();
    s->prune_at = 8;
    s->last_writer = n;
    ++refs;
  }
  return refs;
}

void EngineImpl::record(Node* n) {
  n->live.store(true, std::memory_order_release);
  switch (options_.policy) {
    case Policy::kNaive:
      count_recorded(n);
      return;  // requested by the wait in push, or at once when recorded by a running op
    case Policy::kLazy: {
      // Into this thread's list, the epoch read under its lock: a waitall
      // that flips the epoch finds a node counted in the old parity there.
      const std::uint8_t l = UnrequestedLists::mine();
      const std::size_t listed = unrequested_.append(l, n, [&] { count_recorded(n); });
      // The pending window: start this thread's oldest recorded work when
      // it records far ahead, in batches, down to 7/8 of the window (64
      // nodes at most at once): one queue lock and one wake-up per batch,
      // not per push.
      if (options_.max_pending != 0 && listed > options_.max_pending) {
        const std::size_t keep = options_.max_pending - std::min<std::size_t>(options_.max_pending / 8, 63);
        std::array<Node*, 64> oldest{};
        const std::size_t k = unrequested_.take_oldest(l, keep, oldest);
        BatchedRequests batch(*this);
        for (std::size_t i = 0; i < k; ++i) requested_by_window(oldest[i], batch.nodes);
      }
      return;
    }
    case Policy::kEager:
      // Requested from the start (push): no wait or window ever finds it
      // unrequested. A waitall that flips the epoch meanwhile waits for it
      // or not; either is right for a push that races with it.
      count_recorded(n);
      return;
  }
}

// A node's seq: a clock past `after` (the largest clock of the node's
// vars, so past every predecessor's: record order stays a topological
// order) and past the clock of the node its thread recorded before, with
// the thread's slot in the low bits, which makes it unique. Each slot's
// clock is written only by the thread holding the slot (and passes with
// the slot to a later thread), so recording threads share no counter: one
// counter incremented by every push was a tenth of two recording threads'
// time. Threads without a slot share an atomic clock.
std::uint64_t EngineImpl::next_seq(std::uint64_t after) noexcept {
  const int t = thread_slot();
  if (t >= 0) {
    std::uint64_t& c = clocks_[static_cast<std::size_t>(t)].value;
    c = std::max(c, after) + 1;
    return (c << kSeqSlotBits) | static_cast<std::uint64_t>(t);
  }
  std::uint64_t c = shared_clock_.load(std::memory_order_relaxed);
  std::uint64_t next = 0;
  do {
    next = std::max(c, after) + 1;
  } while (!shared_clock_.compare_exchange_weak(c, next, std::memory_order_relaxed));
  return (next << kSeqSlotBits) | static_cast<std::uint64_t>(kThreadSlots);
}

void EngineImpl::count_recorded(Node* n) {
  // seq_cst: see UnrequestedLists::mark_used.
  n->epoch = static_cast<std::uint8_t>(waitall_epoch_.load(std::memory_order_seq_cst) & 1);
  counts_.recorded(n->epoch, n->cost_bytes);
}

// Invariant, once every request under way has returned: a requested node's
// unfinished ancestors are all requested (a wait's traversal without a tag
// stops at requested nodes). Requests keep it: a wait requests a whole
// subgraph, a waitall everything, and the window a node's unrequested
// ancestors with it. Exactly one caller takes a node's request
// (UnrequestedLists::take).
void EngineImpl::request(Node* n, ReadyBatch* batch) {
  if (n->requested.load(std::memory_order_relaxed) || !unrequested_.take(n)) return;
  if (n->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    if (batch == nullptr) {
      make_ready(n);
      return;
    }
    add_ready(*batch, n);
  }
}

// The window's node `n`, taken off its list by this thread: the oldest of
// the thread's list, so its ancestors recorded by this thread are requested
// already; those recorded by other threads (through shared vars) may still
// be in their lists, and are requested first, or n could wait on them with
// nothing to start them. Iterative; each node on the stack holds a ref.
void EngineImpl::requested_by_window(Node* n, ReadyBatch& batch) {
  SmallVector<Node*, 16> stack;
  auto push_unrequested_preds = [&](Node* m) {
    std::lock_guard g(m->lock);
    for (Node* p : m->preds) {
      if (!p->requested.load(std::memory_order_relaxed) &&
          p->state.load(std::memory_order_acquire) != NodeState::kDone) {
        NodePool::retain(p);
        stack.push_back(p);
      }
    }
  };
  push_unrequested_preds(n);
  while (!stack.empty()) {
    Node* p = stack.back();
    stack.pop_back();
    if (!p->requested.load(std::memory_order_relaxed) && unrequested_.take(p)) {
      push_unrequested_preds(p);
      if (p->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) add_ready(batch, p);
    }
    pool_.release(p);
  }
  if (n->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) add_ready(batch, n);
}

void EngineImpl::push_async(AsyncFunction fn, std::span<const Var> reads, std::span<const Var> writes,
                            const PushOptions& options) {
  std::string_view name = options.name.empty() ? std::string_view("op") : options.name;
  if (!fn) throw InvalidArgument("push_async '" + std::string(name) + "': empty function");
  if (options.device.kind != DeviceKind::kCpu) {
    throw InvalidArgument("push_async '" + std::string(name) + "': asynchronous nodes run on a CPU device, not " +
                          options.device.str());
  }
  // The wrapper owns the Completion: a throw, or a return that left it in
  // place, fails the node through it with that reason.
  push(
      [this, f = std::move(fn)](const RunContext& ctx) {
        Completion done = make_completion(this, tls_running_node);
        try {
          f(ctx, done);
        } catch (...) {
          if (done) done(std::current_exception());
          return;
        }
        if (done) {
          done(std::make_exception_ptr(
              Error("an asynchronous op returned without calling or keeping its Completion")));
        }
      },
      reads, writes, options, /*async=*/true);
}

namespace {

// push_or_run's owning function. The node is recorded by now, so a failure
// to make it becomes the node's own (a function that rethrows it).
Function kept(Keep keep) noexcept {
  try {
    Function f = keep.make(keep.arg);
    if (f) return f;
    throw InvalidArgument("push_or_run: keep() returned an empty function");
  } catch (...) {
    return Function([e = std::current_exception()](const RunContext&) { std::rethrow_exception(e); });
  }
}

}  // namespace

void EngineImpl::push(Function fn, std::span<const Var> reads, std::span<const Var> writes,
                      const PushOptions& options, bool async, Keep keep) {
  std::string_view name = options.name.empty() ? std::string_view("op") : options.name;
  if (!fn) throw InvalidArgument("push '" + std::string(name) + "': empty function");
  if (options.device.id < 0) {
    throw InvalidArgument("push '" + std::string(name) + "': device ids are >= 0, got " +
                          options.device.str());
  }
  if (options.stream != StreamKind::kCompute && options.stream != StreamKind::kCopyIn &&
      options.stream != StreamKind::kCopyOut) {
    throw InvalidArgument("push '" + std::string(name) + "': unknown stream kind " +
                          std::to_string(static_cast<int>(options.stream)));
  }
  StreamDevice* sdev = nullptr;
  if (options.device.kind != DeviceKind::kCpu) {
    try {
      sdev = &stream_device(options.device);
    } catch (const BackendUnavailable& e) {
      throw BackendUnavailable("push '" + std::string(name) + "': " + e.what());
    } catch (const InvalidArgument& e) {
      throw InvalidArgument("push '" + std::string(name) + "': " + e.what());
    }
  } else if (options.stream != StreamKind::kCompute) {
    throw InvalidArgument("push '" + std::string(name) + "': copy streams exist only on stream devices");
  }
  const bool in_op = tls_running_engine == this;
  if (!in_op) drain_graveyard();
  // The vars' locks, then validate everything before touching the graph:
  // bad input records nothing. slots: each handle's slot (writes, then
  // reads), null when this engine never made it.
  SmallVector<VarState*, 8> slots;
  VarLocks locks;
  for (std::span<const Var> set : {writes, reads}) {
    for (Var v : set) {
      VarState* s = vars_.lookup(v);
      slots.push_back(s);
      if (s != nullptr) locks.add(s);
    }
  }
  locks.lock_all();
  SmallVector<VarState*, 8> ws;
  SmallVector<VarState*, 8> rs;
  SmallVector<VarState*, 8> pure_reads;
  VarState* const* slot = slots.begin();
  for (Var v : writes) {
    VarState* s = *slot++;
    vars_.check(s, v, "push (write set) of", name);
    if (!ws.contains(s)) ws.push_back(s);
  }
  for (Var v : reads) {
    VarState* s = *slot++;
    vars_.check(s, v, "push (read set) of", name);
    if (rs.contains(s)) continue;
    rs.push_back(s);
    if (!ws.contains(s)) pure_reads.push_back(s);
  }
  if (!options.write_sources.empty()) {
    auto refuse = [&](const std::string& why) {
      throw InvalidArgument("push '" + std::string(name) + "': write_sources " + why);
    };
    if (async) refuse("are for nodes that are not asynchronous");
    if (options.write_sources.size() != writes.size()) refuse("need one mask per write");
    if (reads.size() > 64) refuse("allow at most 64 reads");
    if (rs.size() != reads.size() || ws.size() != writes.size() || pure_reads.size() != rs.size()) {
      refuse("need distinct vars, no var both read and written");
    }
  }
  const bool profiling = profiler::detail::on();
  const std::uint64_t t0 = profiling ? profiler::detail::now_ns() : 0;
  Node* n = pool_.alloc();
  if (keep.make == nullptr) n->fn = std::move(fn);  // else chosen below, before the node can start
  n->name.assign(name);
  // Not stored when 0 (reset() leaves it 0), nor write_errors cleared (reset()
  // did): those lines are the runner's, and a store from the recording core
  // moved them back to it on every push.
  if (profiling) n->t_push = t0;
  n->device = options.device;
  n->priority = options.priority;
  n->sdev = sdev;
  n->bytes = options.bytes;
  n->cost_bytes = sdev == nullptr ? options.cost_bytes : 0;
  n->task.engine = this;
  n->task.node = n;
  n->async = async;
  n->async_started = false;
  n->run_on_failed_input = options.run_on_failed_input && sdev == nullptr;
  n->write_sources.clear();
  for (std::uint64_t m : options.write_sources) n->write_sources.push_back(m);
  n->async_arrivals.store(0, std::memory_order_relaxed);
  // One for "not yet recorded" (dropped below, after the vars' locks: the
  // node cannot become ready while its edges are still being added) and,
  // except under eager, whose nodes are requested as they are recorded,
  // one for "not yet requested".
  const bool eager = options_.policy == Policy::kEager;
  n->pending.store(eager ? 1 : 2, std::memory_order_relaxed);
  if (eager) n->requested.store(true, std::memory_order_relaxed);
  for (VarState* s : rs) {
    n->reads.push_back(s);
    if (sdev != nullptr) VarTable::hold(s);
  }
  for (VarState* s : ws) {
    n->writes.push_back(s);
    if (sdev != nullptr) VarTable::hold(s);
  }
  // The node's refs: the vars' (link) and the unfinished one, dropped by
  // its completion. Stored at once: until the vars' locks are released
  // nobody else can reach the node's count (a completion that reaches it
  // through a successor list cannot make it ready while push holds its
  // record guard in `pending`), so no locked add per ref.
  std::uint64_t after = 0;
  for (const VarState* s : rs) after = std::max(after, s->clock);
  for (const VarState* s : ws) after = std::max(after, s->clock);
  n->seq = next_seq(after);
  for (VarState* s : rs) s->clock = n->seq >> kSeqSlotBits;
  for (VarState* s : ws) s->clock = n->seq >> kSeqSlotBits;
  const std::span<VarState* const> written(ws.begin(), ws.size());
  // Read before link() drops the vars' finished accesses.
  const DeviceTable::StreamUse last_use = sdev != nullptr && options.stream == StreamKind::kCompute
                                              ? DeviceTable::last_use(sdev, written)
                                              : DeviceTable::StreamUse{};
  const std::uint32_t refs = link(n, std::span<VarState* const>(pure_reads.begin(), pure_reads.size()), written);
  n->refs.store(refs + 1, std::memory_order_relaxed);
  if (sdev != nullptr) n->stream = devices_.choose_stream(n, options.stream, last_use);
  record(n);  // the pending window too (lazy)
  if (profiling) {
    profiler::detail::record(
        profiler::detail::FrontendEvent{"record", std::string(name), {}, t0, profiler::detail::now_ns()});
  }
  const bool naive = options_.policy == Policy::kNaive;
  if (naive && in_op) {
    // Recorded by a running op: runs after it, before the outer wait returns.
    request(n);
  }
  // A frontend that outruns the workers stalls (by nodes, and under eager
  // by the bytes they touch).
  const bool throttle = !naive && !in_op && counts_.recorder_over_window(2) &&
                        (options_.policy != Policy::kLazy || over_window(2, UnrequestedLists::mine()));
  const bool run_now = naive && !in_op;
  if (run_now) NodePool::retain(n);
  // Eager, small, on a CPU: if it is ready now, this thread runs it (a
  // hand-over to a worker's core costs more than the work).
  const bool small = options_.policy == Policy::kEager && !in_op && sdev == nullptr && !async &&
                     options.cost_bytes != 0 && options.cost_bytes <= options_.inline_bytes;
  locks.unlock_all();
  if (keep.make != nullptr) {
    // push_or_run: the borrowed function only for a node this thread runs
    // below. `pending` only falls, and only this push's count keeps it
    // above 0: at 1 the decrement below makes the node ready here.
    if (small && n->pending.load(std::memory_order_relaxed) == 1) {
      n->fn = std::move(fn);
    } else {
      n->fn = kept(keep);
    }
  }
  if (n->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {
    if (small) {
      run_inline(n);
    } else {
      make_ready(n, !in_op);
      // A CPU node counts only behind another queued node (a chain's
      // nodes, ready because a worker ran the one before, find the queue
      // empty); a stream device's are launched at once.
      if (!in_op) {
        if (sdev != nullptr) {
          end_streak();
        } else if (queue_.size() >= 2) {
          extend_streak();
        }
      }
    }
  } else if (!in_op) {
    // A node that waits for others: the queued work may be what it waits
    // for, so the workers stop leaving it to the frontend.
    end_streak();
  }
  if (run_now) {
    run_now_naive(n);
  } else if (throttle) {
    throttle_frontend();
  }
}

}  // namespace lazydag::engine::detail
