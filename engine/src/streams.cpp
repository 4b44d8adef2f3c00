// Stream devices in the scheduler: launch edges (a consumer on a stream
// device becomes ready when its stream-device producers are *launched*; the
// device orders them by stream order and events), claiming through the
// device's run-ahead bound, and completions reported by the device. Which
// stream a node goes to and the bounds themselves are the DeviceTable's
// (device_table.hpp).
#include "engine_impl.hpp"

namespace lazydag::engine::detail {

StreamDevice& EngineImpl::stream_device(Device d) { return devices_.get(d); }

// A claimed stream node either takes a place in its device's run-ahead
// bound, or is held (kDeferred, one ref) until a completion on that device
// frees one. Collects the events of producers on other streams.
bool EngineImpl::claim_stream(Node* n) {
  if (!devices_.admit(n)) return false;
  n->waits.clear();
  // n's own predecessor list changes only at n's completion, so it is read
  // without n's lock. A producer seen kLaunched has published its event.
  for (const Node* p : n->preds) {
    if (launch_edge(p, n) && (p->sdev != n->sdev || p->stream != n->stream) &&
        p->state.load(std::memory_order_acquire) == NodeState::kLaunched && p->has_event) {
      n->waits.push_back(p->event);
    }
  }
  return true;
}

void EngineImpl::launch(Node* n) {
  // Set before the launch: the device may complete the node, and a consumer
  // claim it, before launch() returns; `event` is filled in before the
  // device can run anything.
  n->has_event = true;
  try {
    n->sdev->launch(n->stream, std::span<const StreamEvent>(n->waits.begin(), n->waits.size()),
                    n->task, n->event);
  } catch (...) {
    n->has_event = false;
    // Nothing was enqueued: the node fails here, and finish_node completes it.
    auto err = std::make_shared<ErrorRecord>(n->name.str(), std::current_exception(), n->seq);
    for (VarState* v : n->writes) v->poison = err;
    const EngineImpl* outer = tls_running_engine;
    tls_running_engine = this;
    n->fn.reset();
    tls_running_engine = outer;
    n->error = std::move(err);
    n->failed = true;
    n->launch_failed = true;
  }
}

// kRunning -> kLaunched, once (by the launcher or by an early completion):
// launch-edge successors lose their pending input now. They leave the list:
// one may complete, and be recycled, before n completes (its stream waits
// for n's event, but completions are reported in any order across streams).
Node* EngineImpl::mark_launched(Node* n, Bypass bypass) {
  Node* next = nullptr;
  std::lock_guard g(n->lock);
  NodeState expected = NodeState::kRunning;
  if (!n->state.compare_exchange_strong(expected, NodeState::kLaunched, std::memory_order_seq_cst)) {
    return nullptr;
  }
  nodes_launched_.fetch_add(1, std::memory_order_relaxed);
  std::uint32_t kept = 0;
  for (Node* s : n->succs) {
    if (launch_edge(n, s)) {
      if (s->pending.fetch_sub(1, std::memory_order_acq_rel) == 1) next = ready_successor(s, next, bypass);
    } else {
      n->succs[kept++] = s;
    }
  }
  n->succs.resize_down(kept);
  return next;
}

// n leaves its device's run-ahead bound; held nodes that now fit are ready.
void EngineImpl::device_done(Node* n) {
  SmallVector<Node*, 8> fit;
  devices_.leave(n, fit);
  for (Node* h : fit) {
    make_ready(h);
    pool_.release(h);
  }
}

void EngineImpl::run_on_stream(Node* n, const RunContext& ctx) { execute(n, ctx); }

// On the device's thread (sim executor, CUDA completer): never runs CPU work.
void EngineImpl::stream_complete(Node* n, std::exception_ptr async_error, DeviceInterval ran) {
  if (n->t_end != 0 && ran.end_ns != 0) {
    // The profiler shows the device's interval; the host's is the launch.
    n->t_launch_start = n->t_start;
    n->t_launch_end = n->t_end;
    n->t_start = ran.start_ns;
    n->t_end = ran.end_ns;
  }
  if (async_error && !n->error) {
    // Reported only now: consumers already launched on the device ran on
    // what it left; the waits report this error (and a CUDA context error
    // is sticky, failing them too).
    auto err = std::make_shared<ErrorRecord>(n->name.str(), async_error, n->seq);
    for (VarState* v : n->writes) v->poison = err;
    n->error = std::move(err);
    n->failed = true;
  }
  // The launcher holds its ref until it has seen the state: n stays alive.
  (void)mark_launched(n, Bypass{});
  device_done(n);
  (void)complete(n, Bypass{});
}

void NodeTask::run(const RunContext& ctx) noexcept { engine->run_on_stream(node, ctx); }
void NodeTask::complete(std::exception_ptr async_error, DeviceInterval ran) noexcept {
  engine->stream_complete(node, std::move(async_error), ran);
}

}  // namespace lazydag::engine::detail
