// The engine's graph records: vars (VarState), nodes (Node) and the error a
// failed node leaves on the vars it writes. Who may touch which field, and
// under what, is written next to each field; docs/architecture.md has the
// whole protocol.
#pragma once

#include <lazydag/engine/engine.hpp>
#include <lazydag/engine/stream.hpp>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <exception>
#include <memory>
#include <string>
#include <string_view>

#include "small_vector.hpp"
#include "sync.hpp"
#include "thread_slot.hpp"

namespace lazydag::engine::detail {

struct Node;
class EngineImpl;

struct ErrorRecord {
  std::string op_name;
  std::exception_ptr cause;
  std::uint64_t seq = 0;  // of the op that threw: waitall reports the oldest
  std::atomic<bool> reported{false};  // a wait has thrown it
  ErrorRecord(std::string name, std::exception_ptr c, std::uint64_t s)
      : op_name(std::move(name)), cause(std::move(c)), seq(s) {}
};
using ErrorPtr = std::shared_ptr<ErrorRecord>;

// A node's name, stored without an allocation per record: up to kInline
// characters in the node itself (a fused node's name lists its ops, often
// past std::string's 15), longer ones in a heap buffer the node keeps for
// its next records. Nodes are pooled: a std::string allocated whenever a
// long name landed on a node that had only held short ones.
class NodeName {
 public:
  static constexpr std::size_t kInline = 79;
  NodeName() = default;
  NodeName(const NodeName&) = delete;
  NodeName& operator=(const NodeName&) = delete;
  void assign(std::string_view s) {
    char* d = inline_;
    if (s.size() > kInline) {
      if (s.size() > heap_cap_) {
        heap_ = std::make_unique<char[]>(s.size() + 1);
        heap_cap_ = s.size();
      }
      d = heap_.get();
    }
    if (!s.empty()) std::memcpy(d, s.data(), s.size());
    d[s.size()] = '\0';
    size_ = s.size();
  }
  void clear() noexcept {
    inline_[0] = '\0';
    size_ = 0;
  }
  [[nodiscard]] const char* c_str() const noexcept { return size_ > kInline ? heap_.get() : inline_; }
  [[nodiscard]] std::string_view view() const noexcept { return {c_str(), size_}; }
  [[nodiscard]] std::string str() const { return std::string(view()); }

 private:
  char inline_[kInline + 1] = {};
  std::size_t size_ = 0;
  std::unique_ptr<char[]> heap_;
  std::size_t heap_cap_ = 0;
};

// Fields marked [var] belong to the var's lock `mu`: recorders take the
// locks of every var a push names (in address order), waits the lock of the
// var they wait for; the others say what orders them.
// A node's seq is its record clock shifted left by this, or'ed with its
// recording thread's slot (kThreadSlots for a thread without one).
inline constexpr int kSeqSlotBits = 7;
static_assert(kThreadSlots < (1 << kSeqSlotBits));

// A buffer to give back to its stream device (on `stream`) with a var.
struct VarRelease {
  StreamDevice* dev = nullptr;  // null: none
  void* ptr = nullptr;
  std::size_t bytes = 0;
  int stream = 0;
};

struct VarState {
  SpinLock mu;
  std::uint32_t index = 0;        // the slot's; set once, with `engine`
  std::uint32_t engine = 0;
  // The generation and liveness of its current var: set by new_var without
  // the lock, generation first (a stale handle's check may read them
  // meanwhile, `alive` first: var_table.hpp), `alive` cleared by
  // delete_var under it.
  std::atomic<std::uint32_t> generation{0};  // 0 while never used
  std::atomic<bool> alive{false};
  /// The current var's handle.
  [[nodiscard]] Var handle() const noexcept {
    return Var{index, generation.load(std::memory_order_relaxed), engine};
  }
  const char* owner = nullptr;    // new_owned_var: only delete_owned_var deletes it (set by new_var)
  Node* last_writer = nullptr;    // [var] holds a ref; kept after it finishes (its error)
  SmallVector<Node*, 4> readers;  // [var] reads since last_writer, one ref each
  std::uint32_t prune_at = 8;     // [var] readers.size() at which finished readers are dropped
  std::uint64_t clock = 0;        // [var] the largest record clock of a node that named it (seq >> kSeqSlotBits)
  std::uint32_t next_free = 0;    // free stack link: index + 1 of the next free slot
  // 1 while alive, + 1 per unfinished access by a stream-device node.
  // Whoever takes it to 0 (the var table, once the var is dead and the CPU
  // nodes it names are done; or the completion of the last stream access)
  // frees the slot; nobody else can reach a var that is dead and idle.
  std::atomic<std::uint32_t> holds{0};
  // Written by the running writer, read by running readers of that version:
  // the DAG orders them (a reader starts after its writer's completion
  // released `pending`; the next writer after every reader's). On a cache
  // line of its own: the running nodes read it while recorders write
  // the fields above for the next pushes.
  alignas(64) ErrorPtr poison;
  // A stream-device buffer deleted with the var (delete_var_and_free): set
  // under the lock as the var dies (once per var, so sharing the line that
  // running readers load costs nothing), given back by whoever frees the
  // slot.
  VarRelease release;
};

// kLaunched: a stream-device node enqueued on its stream, not yet complete.
// kDeferred: a ready stream-device node held back by the run-ahead bound.
enum class NodeState : std::uint8_t { kRecorded, kReady, kDeferred, kRunning, kLaunched, kDone };

// The backend's view of a node launched on a stream device.
struct NodeTask final : StreamTask {
  EngineImpl* engine = nullptr;
  Node* node = nullptr;
  void run(const RunContext& ctx) noexcept override;
  void complete(std::exception_ptr async_error, DeviceInterval ran) noexcept override;
};

// Fields grouped by writer: the recorder's, the shared atomics and edge
// lists, then the runner's. (Aligning the groups to cache lines made no
// difference measurable on the 2-core machine and cost 80 bytes a node.)
struct Node {
  // Written by the recorder before the node is published, then read-only
  // until it is recycled ([imm]).
  Function fn;                        // [imm] until run; reset by the thread that runs it
  SmallVector<VarState*, 4> reads;    // [imm] every var read, read-modify-writes included
  SmallVector<VarState*, 4> writes;   // [imm]
  NodeName name;                      // [imm]
  std::uint64_t seq = 0;              // [imm] unique per engine, > its predecessors' and its thread's earlier nodes' (EngineImpl::next_seq)
  Device device;                      // [imm]
  int priority = 0;                   // [imm]
  StreamDevice* sdev = nullptr;       // [imm] null: runs on a CPU worker
  int stream = -1;                    // [imm]
  std::size_t bytes = 0;              // [imm] PushOptions::bytes
  std::size_t cost_bytes = 0;         // [imm] PushOptions::cost_bytes (CPU nodes; 0 on stream devices)
  std::uint8_t epoch = 0;             // [imm] waitall epoch parity it is counted in
  bool async = false;                 // [imm] push_async: done when its Completion is called
  bool run_on_failed_input = false;   // [imm] PushOptions::run_on_failed_input
  SmallVector<std::uint64_t, 2> write_sources;  // [imm] PushOptions::write_sources (empty: none)
  bool async_started = false;         // by its runner, before arriving: the function ran
  // Set once: under eager by push, which counts no "until requested" in
  // `pending`; under the other policies by the request that gives that
  // count up (UnrequestedLists::take, unrequested.hpp).
  std::atomic<bool> requested{false};
  std::uint8_t unreq_list = 0xff;     // [imm] lazy: the unrequested list it was recorded in (0xff: none)
  Node* unreq_prev = nullptr;         // that list's lock: recorded, not yet requested, in record order
  Node* unreq_next = nullptr;
  Node* free_next = nullptr;          // node pool (its lock)
  int home = -1;                      // node pool: the thread slot that took it from its cache and, if it ran, ran it (-1: none)

  // Guarded by `lock`: the successor list (appended by recorders, consumed
  // once by the completion) and the predecessor list (appended by the
  // recorder while recording this node, cleared by its completion; readers
  // of a node that is not their own take the lock).
  SpinLock lock;
  SmallVector<Node*, 4> succs;        // no refs: a successor is unfinished, hence alive
  SmallVector<Node*, 4> preds;        // one ref each, dropped at completion

  // Unfinished predecessors + 1 until requested (not under eager) + 1
  // until recorded. The thread that takes it to 0 (acq_rel) makes the node
  // ready: it has seen every predecessor's effects, each of which released
  // on this counter.
  std::atomic<std::uint32_t> pending{0};
  std::atomic<std::uint32_t> refs{0};
  std::atomic<NodeState> state{NodeState::kRecorded};
  std::atomic<std::uint32_t> tag{0};      // waiter slot + 1 that runs it first; 0 = none
  std::atomic<std::uint32_t> waiters{0};  // node waits whose target this is
  // Async nodes: the runner's return and the Completion each arrive once;
  // the second completes the node (acq_rel: it sees the first's writes).
  std::atomic<std::uint8_t> async_arrivals{0};
  // Recorded and not done: stored (release) once the node's edges and
  // fields are set, cleared under `lock` by its completion; read under
  // `lock` (acquire) by introspection.
  std::atomic<bool> live{false};

  // Written by the thread that runs (or launches, or completes) the node
  // before its completion stores kDone (release); read after kDone is seen.
  ErrorPtr error;       // set when the node failed or was skipped
  // With write_sources, when some writes failed through their inputs and
  // the node ran: write j's error (null for those computed), else empty.
  std::vector<ErrorPtr> write_errors;
  Node* grave_next = nullptr;       // Graveyard (graveyard.hpp)
  bool failed = false;  // its function threw
  bool run_here = false;  // claimed by claim_now without a ref (cleared by finish_node)
  bool launch_failed = false;  // stream node: launch threw, nothing was enqueued
  // Profiler timestamps (ns), set only while the profiler runs.
  std::uint64_t t_push = 0;
  std::uint64_t t_ready = 0;
  std::uint64_t t_start = 0;
  std::uint64_t t_end = 0;
  std::uint64_t t_launch_start = 0;  // stream nodes: the host's part (enqueue)
  std::uint64_t t_launch_end = 0;
  int worker = -1;

  // Stream devices. An edge between two stream-device nodes is satisfied
  // when the producer is launched (the consumer's stream waits for its
  // event); every other edge when the producer is done. `event` and
  // `has_event` are written by the launcher before kLaunched is stored.
  StreamEvent event;
  bool has_event = false;
  SmallVector<StreamEvent, 4> waits;  // by the thread that claims it: producers on other streams
  NodeTask task;
};

// A launch edge: both ends run in stream order on devices of one backend,
// so the consumer's stream can wait for the producer's event. An edge
// between a sim and a gpu node is a completion edge: one backend's event
// means nothing to the other's streams.
inline bool launch_edge(const Node* pred, const Node* succ) {
  return pred->sdev != nullptr && succ->sdev != nullptr && pred->device.kind == succ->device.kind;
}

}  // namespace lazydag::engine::detail
