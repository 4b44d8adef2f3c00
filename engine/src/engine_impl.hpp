// EngineImpl: the engine's parts and the protocol that ties them together.
// Members are implemented by topic: record.cpp (vars, nodes, dependency
// linking, requests, the pending window), schedule.cpp (readiness, bypass,
// the workers, completion), streams.cpp (stream devices: launch edges,
// events, run-ahead bounds), waits.cpp (waiters, helping, the watchdog),
// introspect.cpp (stats, pending nodes, the watchdog report, profiler
// events). docs/architecture.md describes the protocol.
#pragma once

#include <lazydag/engine/engine.hpp>
#include <lazydag/engine/stream.hpp>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device_table.hpp"
#include "errors.hpp"
#include "event_count.hpp"
#include "graveyard.hpp"
#include "node.hpp"
#include "node_pool.hpp"
#include "pending_counts.hpp"
#include "ready_queue.hpp"
#include "unrequested.hpp"
#include "var_table.hpp"
#include "waiter_slots.hpp"
#include "workers.hpp"

namespace lazydag::engine::detail {

StallHooks stall_hooks() noexcept;  // set_stall_hooks's

thread_local inline const EngineImpl* tls_running_engine = nullptr;
// The node whose function this thread is running (push_async's wrapper).
thread_local inline Node* tls_running_node = nullptr;

// Which newly ready successor a completing thread may run itself next:
// none (device threads), any (workers, waitall), or only one tagged for the
// node wait this thread is in (a wait runs its own subgraph, nothing else).
struct Bypass {
  bool on = false;
  std::uint32_t only_tag = 0;  // 0: any
};

// push_or_run's owning function, made only when the node does not run
// inside push (its function is then the borrowed one).
struct Keep {
  Function (*make)(void*) = nullptr;
  void* arg = nullptr;
};

class EngineImpl {
 public:
  explicit EngineImpl(EngineOptions options);
  ~EngineImpl();
  EngineImpl(const EngineImpl&) = delete;
  EngineImpl& operator=(const EngineImpl&) = delete;

  // record.cpp
  Var new_var(const char* owner = nullptr);
  bool delete_var(Var v, bool by_owner = false, const VarRelease* release = nullptr);
  bool delete_var_and_free(Var v, Device device, void* p, std::size_t bytes);
  void push(Function fn, std::span<const Var> reads, std::span<const Var> writes,
            const PushOptions& options, bool async = false, Keep keep = {});
  void push_async(AsyncFunction fn, std::span<const Var> reads, std::span<const Var> writes,
                  const PushOptions& options);
  // schedule.cpp: an async node's Completion was called.
  void async_done(Node* n, std::exception_ptr error) noexcept;
  static Completion make_completion(EngineImpl* e, Node* n) noexcept { return Completion(e, n); }
  // waits.cpp
  void wait_to_read(Var v, const CallSite& site);
  void wait_to_write(Var v, const CallSite& site);
  void waitall(const CallSite& site);
  void wait_all_recorded(bool watchdog);
  void run_everything(const char* when) noexcept;
  // introspect.cpp
  EngineStats stats() const;
  std::vector<PendingNode> pending_nodes();
  // streams.cpp
  StreamDevice& stream_device(Device d);
  void run_on_stream(Node* n, const RunContext& ctx);
  void stream_complete(Node* n, std::exception_ptr async_error, DeviceInterval ran);

  const EngineOptions options_;
  const int num_threads_;
  const std::uint64_t profile_id_;  // tells engines apart in a trace

 private:

  // Nodes made ready together, queued under one queue lock per
  // kReadyBatch (make_ready_many): add() queues a full batch, flush() the
  // rest.
  static constexpr std::size_t kReadyBatch = 64;
  struct ReadyBatch {
    std::array<Node*, kReadyBatch> nodes;  // the first `size` are set
    std::size_t size = 0;
  };

  // ---- record.cpp
  void check_not_in_op(std::string_view call) const;
  // pred -> n, unless pred is done or an edge already; returns whether the
  // edge was made. With `give`, the caller's ref on pred becomes the edge's
  // when it returns true (else the caller still holds it). `shared`: n is
  // in a predecessor's successor list already (set here). The locks of n's
  // vars held.
  bool add_edge(Node* pred, Node* n, bool give, bool& shared);
  // Adds n's edges and makes it the vars' last writer or a reader; returns
  // the refs the vars now hold on n (not yet counted in n->refs). The
  // vars' locks held.
  std::uint32_t link(Node* n, std::span<VarState* const> pure_reads, std::span<VarState* const> writes);
  // Counts n in the current waitall epoch and requests it (eager) or puts
  // it in the lazy window. The vars' locks held.
  void record(Node* n);
  void count_recorded(Node* n);
  std::uint64_t next_seq(std::uint64_t after) noexcept;
  // Gives up n's "not requested" count, unless it was requested already.
  // The caller holds a ref on n (or n is in an unrequested list: see
  // unrequested.hpp). With `batch`, a node made ready is collected there
  // instead of queued at once.
  void request(Node* n, ReadyBatch* batch = nullptr);
  // Gives up the "not requested" count of n, which the caller has taken
  // (UnrequestedLists::take), after requesting its unrequested ancestors.
  void requested_by_window(Node* n, ReadyBatch& batch);
  // The stall's test: past `factor` times the window. Under lazy the nodes
  // in the unrequested lists of threads other than `mine`'s do not count:
  // their own windows bound them, and nothing a stalled thread runs would
  // start them. A completion deciding whether to wake stalled threads
  // passes kNone: it leaves out every list, a test that passes whenever
  // some stalled thread's passes, so none is left parked. (The exact counts
  // are read before the lists': a list grown in between only makes the
  // test pass sooner.)
  [[nodiscard]] bool over_window(std::size_t factor, std::uint8_t mine) const noexcept {
    if (options_.policy != Policy::kLazy) return counts_.over_window(factor);
    return counts_.over_window_less(factor, [&] { return unrequested_.count_except(mine); });
  }

  // ---- schedule.cpp: no lock held
  void make_ready(Node* n, bool pushed = false);
  void add_ready(ReadyBatch& b, Node* n);
  void flush_ready(ReadyBatch& b);
  // Requests made with its `nodes` collect the nodes they make ready and
  // queue them in batches; the last batch when the scope ends, also on a
  // throw.
  class BatchedRequests {
   public:
    explicit BatchedRequests(EngineImpl& e) : e_(e) {}
    ~BatchedRequests() {
      try {
        e_.flush_ready(nodes);
      } catch (...) {  // out of memory queueing them: they stay ready for the waits that need them
        nodes.size = 0;
      }
    }
    BatchedRequests(const BatchedRequests&) = delete;
    BatchedRequests& operator=(const BatchedRequests&) = delete;
    ReadyBatch nodes;

   private:
    EngineImpl& e_;
  };
  void publish_ready(Node* n);
  Node* claim_now(Node* n);
  bool hand_to_waiter(Node* n);
  void note_pushed_last(bool pushed) noexcept;
  void extend_streak() noexcept;
  void end_streak() noexcept;
  void make_ready_many(Node* const* nodes, std::size_t k);
  void run_inline(Node* n);
  bool claim(Node* n);
  Node* pop_queue();
  Node* pop_help(Waiter& w);
  void run_chain(Node* n, int worker, Bypass bypass);
  void run_node(Node* n, int worker);
  Node* finish_node(Node* n, Bypass bypass);
  Node* complete(Node* n, Bypass bypass);
  Node* ready_successor(Node* s, Node* kept, Bypass bypass);
  [[nodiscard]] bool can_bypass(Node* s, Bypass bypass) const;
  void execute(Node* n, const RunContext& ctx);
  void notify_idle();
  void bury(Node* n) noexcept;
  void drain_graveyard() noexcept;
  void runner(int worker);
  void await_recording() const noexcept;

  // ---- streams.cpp
  void device_done(Node* n);
  bool claim_stream(Node* n);
  void launch(Node* n);
  Node* mark_launched(Node* n, Bypass bypass);

  // ---- waits.cpp
  std::uint32_t register_waiter(WaitMode mode);
  void unregister_waiter(std::uint32_t tag, WaitMode mode);
  void request_subgraph(Node* target, std::uint32_t tag);
  void untag(Node* target, std::uint32_t tag);
  template <class Done>
  bool help_until(std::uint32_t tag, Done done, bool watchdog);
  void wait_node(Node* target);
  void run_now_naive(Node* n);
  void throttle_frontend();
  void wake_waiters() noexcept;

  // ---- introspect.cpp
  std::string describe_pending(Node* target);
  void trace(const Node* n) const;

  NodePool pool_;
  VarTable vars_{pool_, static_cast<std::uint32_t>(profile_id_)};
  // Record clocks (next_seq): one per thread slot, written only by the
  // slot's thread; threads without a slot share the atomic.
  struct alignas(64) SlotClock {
    std::uint64_t value = 0;
  };
  std::array<SlotClock, kThreadSlots> clocks_{};
  alignas(64) std::atomic<std::uint64_t> shared_clock_{0};
  // Lazy: the nodes recorded and not yet requested, a list per thread
  // (unrequested.hpp).
  UnrequestedLists unrequested_;

  // Flipped by each waitall (seq_cst; lazy recorders read it under their
  // unrequested list's lock: see UnrequestedLists::take_all).
  std::atomic<std::uint64_t> waitall_epoch_{0};
  // Unfinished nodes and bytes by waitall epoch (pending_counts.hpp); the
  // byte window is eager's only.
  PendingCounts counts_{PendingCounts::Limits{
      options_.max_pending, options_.policy == Policy::kEager ? options_.max_pending_bytes : 0}};

  // Failed and skipped completions: counted (nodes run are the completed
  // count less the skipped), and failures kept for waitall (errors.hpp).
  ErrorLog errors_;

  // Functions that ran on a worker or device thread, waiting to be
  // destroyed by a frontend thread (see bury()).
  Graveyard graveyard_;

  // Scheduling.
  ReadyQueue<Node> queue_;  // one ref per entry
  // pushed_last_: whether the newest node queued was made ready by a push
  // (its frontend may run it itself in a wait next: the workers' grace
  // period) rather than by a completion. streaming_: whether a frontend is
  // streaming ready nodes (schedule.cpp, kStreak), so idle workers let the
  // queue fill. Hints: races only shorten or skip a grace. Both are read
  // by idle workers and written only when they change, on a line of their
  // own; the streak counter, written by recording threads (relaxed loads
  // and stores: with several, an update may be lost, which only shortens
  // or lengthens a streak), on another.
  alignas(64) std::atomic<bool> pushed_last_{false};
  std::atomic<bool> streaming_{false};
  alignas(64) std::atomic<std::uint32_t> streak_{0};
  char streak_pad_[60] = {};
  Workers workers_{num_threads_};

  // Waiting: frontend threads park on `events_`, notified by every event a
  // waiter may be waiting for.
  WaiterSlots waiters_;
  EventCount events_;

  // Counters (relaxed: statistics).
  std::atomic<std::uint64_t> nodes_launched_{0};
  std::array<std::atomic<std::uint64_t>, kBlockingCallKinds> blocking_calls_{};
  std::atomic<std::uint64_t> blocked_ticks_{0};  // TickClock ticks

  // Stream devices: the devices, stream choice, run-ahead bounds.
  DeviceTable devices_{options_.max_in_flight, options_.max_in_flight_bytes};
};

}  // namespace lazydag::engine::detail
