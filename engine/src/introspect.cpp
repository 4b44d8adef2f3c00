// Looking at the engine from outside: stats(), pending_nodes(), the
// watchdog's report of what a wait is blocked on, and the profiler's event
// for each node that ran while it records. None of it is on a node's path
// unless the profiler is on.
#include <algorithm>
#include <sstream>
#include <string>
#include <unordered_set>
#include <vector>

#include "engine_impl.hpp"
#include "profiler_internal.hpp"
#include "tick_clock.hpp"

namespace lazydag::engine::detail {

namespace {

std::string_view state_name(const Node* n) {
  switch (n->state.load(std::memory_order_acquire)) {
    case NodeState::kRecorded: return n->requested.load(std::memory_order_relaxed) ? "waiting for inputs" : "recorded (lazy)";
    case NodeState::kReady: return "ready";
    case NodeState::kDeferred: return "ready, held by its device's run-ahead bound";
    case NodeState::kRunning: return n->sdev != nullptr ? "launching" : "running";
    case NodeState::kLaunched: return "launched on its stream, not complete";
    case NodeState::kDone: return "done";
  }
  return "?";
}

}  // namespace

// The watchdog's report: the unfinished nodes a wait is blocked on (the
// target's pending ancestors, or every unfinished node for waitall).
std::string EngineImpl::describe_pending(Node* target) {
  std::vector<Node*> nodes;  // one ref each
  if (target != nullptr) {
    std::vector<Node*> stack{target};
    std::unordered_set<const Node*> seen{target};
    NodePool::retain(target);
    while (!stack.empty()) {
      Node* n = stack.back();
      stack.pop_back();
      std::lock_guard g(n->lock);
      if (n->state.load(std::memory_order_acquire) == NodeState::kDone) {
        nodes.push_back(nullptr);
        pool_.release(n);
        continue;
      }
      nodes.push_back(n);
      for (Node* p : n->preds) {
        if (seen.insert(p).second) {
          NodePool::retain(p);
          stack.push_back(p);
        }
      }
    }
    nodes.erase(std::remove(nodes.begin(), nodes.end(), nullptr), nodes.end());
  } else {
    pool_.for_each([&](Node* n) {
      std::lock_guard g(n->lock);  // a live node cannot complete meanwhile
      if (n->live.load(std::memory_order_acquire)) {
        NodePool::retain(n);
        nodes.push_back(n);
      }
    });
  }
  std::sort(nodes.begin(), nodes.end(), [](const Node* a, const Node* b) { return a->seq < b->seq; });
  std::ostringstream os;
  os << "lazydag watchdog: a wait blocked for more than " << options_.watchdog_seconds << " s on "
     << nodes.size() << " unfinished node(s):\n";
  std::size_t shown = 0;
  for (Node* n : nodes) {
    if (++shown > 20) {
      os << "  ... and " << nodes.size() - 20 << " more\n";
      break;
    }
    os << "  #" << n->seq << " '" << n->name.view() << "' on " << n->device.str();
    if (n->stream >= 0) os << " stream " << n->stream;
    os << ": " << state_name(n);
    const std::uint32_t pending = n->pending.load(std::memory_order_relaxed);
    const std::uint32_t inputs = pending - (n->requested.load(std::memory_order_relaxed) ? 0 : 1);
    if (inputs != 0 && n->state.load(std::memory_order_relaxed) == NodeState::kRecorded) {
      os << ", " << inputs << " input(s) pending";
    }
    os << "; reads";
    for (const VarState* v : n->reads) os << " v" << v->index;
    os << "; writes";
    for (const VarState* v : n->writes) os << " v" << v->index;
    os << '\n';
  }
  for (Node* n : nodes) pool_.release(n);
  return os.str();
}

EngineStats EngineImpl::stats() const {
  EngineStats s;
  // Both parities' recorded counts are cumulative: their sum is every node recorded.
  s.nodes_recorded = static_cast<std::uint64_t>(counts_.recorded_total());
  // Nodes run: completions less skipped ones. A node is counted as skipped
  // just before it completes, so while nodes complete the difference may
  // briefly fall short (never below 0); it is exact once they are done.
  const auto completed = static_cast<std::uint64_t>(counts_.completed_total());
  s.nodes_failed = errors_.failed();
  s.nodes_skipped = errors_.skipped();
  s.nodes_run = completed > s.nodes_skipped ? completed - s.nodes_skipped : 0;
  s.nodes_launched = nodes_launched_.load(std::memory_order_relaxed);
  s.in_flight_stalls = devices_.stalls();
  s.unfinished = counts_.unfinished();
  s.peak_unfinished = counts_.peak();
  for (std::size_t k = 0; k < kBlockingCallKinds; ++k) {
    s.blocking_calls[k] = blocking_calls_[k].load(std::memory_order_relaxed);
    s.blocking_waits += s.blocking_calls[k];
  }
  s.blocked_ns = TickClock::to_ns(blocked_ticks_.load(std::memory_order_relaxed));
  return s;
}

std::vector<PendingNode> EngineImpl::pending_nodes() {
  std::vector<PendingNode> out;
  pool_.for_each([&](Node* n) {
    std::lock_guard ng(n->lock);  // a live node cannot complete (and be recycled) meanwhile
    if (!n->live.load(std::memory_order_acquire)) return;
    PendingNode p;
    p.id = n->seq;
    p.name = n->name.str();
    p.device = n->device;
    p.priority = n->priority;
    p.requested = n->requested.load(std::memory_order_relaxed);
    for (const Node* q : n->preds) {
      if (q->state.load(std::memory_order_acquire) != NodeState::kDone) p.preds.push_back(q->seq);
    }
    // A live node's vars are not recycled: their generation is the node's.
    for (const VarState* v : n->reads) p.reads.push_back(v->handle());
    for (const VarState* v : n->writes) p.writes.push_back(v->handle());
    out.push_back(std::move(p));
  });
  std::sort(out.begin(), out.end(), [](const PendingNode& a, const PendingNode& b) { return a.id < b.id; });
  return out;
}

void EngineImpl::trace(const Node* n) const {
  profiler::detail::NodeEvent e;
  e.engine = profile_id_;
  e.id = n->seq;
  e.name = n->name.str();
  e.device = n->device;
  e.worker = n->worker;
  // A node recorded before the profiler started has only run times.
  e.t_push = n->t_push != 0 ? n->t_push : n->t_start;
  e.t_ready = n->t_ready != 0 ? n->t_ready : n->t_start;
  e.t_start = n->t_start;
  e.t_end = n->t_end;
  if (n->sdev != nullptr) {
    e.stream = n->stream;
    e.compute_streams = n->sdev->num_compute_streams();
    e.t_launch_start = n->t_launch_start;
    e.t_launch_end = n->t_launch_end;
  }
  e.ids.reserve(n->reads.size() + n->writes.size() + n->preds.size());
  for (const VarState* v : n->reads) e.ids.push_back(v->index);
  for (const VarState* v : n->writes) e.ids.push_back(v->index);
  for (const Node* p : n->preds) e.ids.push_back(p->seq);
  e.num_reads = static_cast<std::uint16_t>(n->reads.size());
  e.num_writes = static_cast<std::uint16_t>(n->writes.size());
  e.failed = n->failed;
  e.skipped = !n->failed && n->error != nullptr;
  profiler::detail::record(std::move(e));
}

}  // namespace lazydag::engine::detail
