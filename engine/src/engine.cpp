// The dependency engine: recording nodes into a DAG of read/write vars, lazy
// requests of required subgraphs, the oneTBB scheduler and the waits.
//
// Locking: one mutex (mu_) guards the whole graph: var states, node edges,
// node states, the ready heap and the waiter table. It is held for O(read +
// write set) work per push and per completion and never across user code:
// node functions run, and their captures are destroyed, with mu_ released.
// The only state touched outside mu_ is a var's `poison`, which is written by
// the running writer and read by running readers; the DAG orders those
// accesses and mu_'s hand-over on completion publishes them.
#include <lazydag/engine/engine.hpp>
#include <lazydag/engine/stream.hpp>
#include <lazydag/engine/sync_debug.hpp>

#include <oneapi/tbb/global_control.h>
#include <oneapi/tbb/info.h>
#include <oneapi/tbb/task_arena.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <charconv>
#include <condition_variable>
#include <deque>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_set>

#include "cuda_backend.hpp"
#include "graph_mutex.hpp"
#include "profiler_internal.hpp"
#include "ready_queue.hpp"
#include "sim_device.hpp"
#include "small_vector.hpp"

namespace lazydag::engine {

std::string_view to_string(Policy p) noexcept {
  switch (p) {
    case Policy::kLazy: return "lazy";
    case Policy::kEager: return "eager";
    case Policy::kNaive: return "naive";
  }
  return "unknown";
}

Policy parse_policy(std::string_view name) {
  if (name == "lazy") return Policy::kLazy;
  if (name == "eager") return Policy::kEager;
  if (name == "naive") return Policy::kNaive;
  throw InvalidArgument("unknown engine policy '" + std::string(name) +
                        "' (expected lazy, eager or naive)");
}

std::string Device::str() const {
  switch (kind) {
    case DeviceKind::kCpu: return "cpu(" + std::to_string(id) + ")";
    case DeviceKind::kSim: return "sim(" + std::to_string(id) + ")";
    case DeviceKind::kGpu: return "gpu(" + std::to_string(id) + ")";
  }
  return "device(" + std::to_string(id) + ")";
}

namespace {

std::size_t env_size(const char* name, std::size_t fallback, std::size_t max) {
  const char* s = std::getenv(name);
  if (s == nullptr || *s == '\0') return fallback;
  std::string_view text(s);
  std::size_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value > max) {
    throw InvalidArgument(std::string(name) + "='" + std::string(text) +
                          "' is not an integer in [0, " + std::to_string(max) + "]");
  }
  return value;
}

}  // namespace

EngineOptions EngineOptions::from_env() {
  EngineOptions o;
  if (const char* p = std::getenv("LAZYDAG_ENGINE"); p != nullptr && *p != '\0') {
    o.policy = parse_policy(p);
  }
  o.num_threads = static_cast<int>(env_size("LAZYDAG_NUM_THREADS", 0, 1024));
  if (const char* w = std::getenv("LAZYDAG_WATCHDOG"); w != nullptr && *w != '\0') {
    char* end = nullptr;
    const double v = std::strtod(w, &end);
    if (end == w || *end != '\0' || !(v >= 0)) {
      throw InvalidArgument(std::string("LAZYDAG_WATCHDOG='") + w + "' is not a number of seconds >= 0");
    }
    o.watchdog_seconds = v;
  }
  o.max_pending = env_size("LAZYDAG_MAX_PENDING", o.max_pending,
                           std::numeric_limits<std::uint32_t>::max());
  o.max_in_flight = env_size("LAZYDAG_MAX_IN_FLIGHT", o.max_in_flight,
                             std::numeric_limits<std::uint32_t>::max());
  if (o.max_in_flight == 0) throw InvalidArgument("LAZYDAG_MAX_IN_FLIGHT must be >= 1");
  return o;
}

int default_compute_streams() {
  return static_cast<int>(std::max<std::size_t>(1, env_size("LAZYDAG_STREAMS", 2, 16)));
}

namespace detail {

struct Node;

struct ErrorRecord {
  std::string op_name;
  std::exception_ptr cause;
  std::uint64_t seq = 0;  // of the op that threw: waitall reports the oldest
  bool reported = false;  // a wait has thrown it
};
using ErrorPtr = std::shared_ptr<ErrorRecord>;

struct VarState {
  Var handle;                     // generation 0 while never used
  bool alive = false;             // false once its deletion is recorded
  bool dying = false;             // deleted with accesses pending: freed after the last
  Node* last_writer = nullptr;    // holds a ref; kept after it finishes (its error)
  SmallVector<Node*, 4> readers;  // reads since last_writer, one ref each
  std::uint32_t prune_at = 8;     // readers.size() at which finished readers are dropped
  std::uint32_t next_free = 0;    // index + 1 of the next free slot
  ErrorPtr poison;                // see the file comment
};

// kLaunched: a stream-device node enqueued on its stream, not yet complete.
// kDeferred: a ready stream-device node held back by the run-ahead bound.
enum class NodeState : std::uint8_t { kRecorded, kReady, kDeferred, kRunning, kLaunched, kDone };

class EngineImpl;

// The backend's view of a node launched on a stream device.
struct NodeTask final : StreamTask {
  EngineImpl* engine = nullptr;
  Node* node = nullptr;
  void run(const RunContext& ctx) noexcept override;
  void complete(std::exception_ptr async_error, DeviceInterval ran) noexcept override;
};

struct Node {
  Function fn;
  SmallVector<VarState*, 4> reads;   // every var read, read-modify-writes included
  SmallVector<VarState*, 4> writes;
  SmallVector<Node*, 4> succs;       // no refs: a successor is unfinished, hence alive
  SmallVector<Node*, 4> preds;       // one ref each, dropped at completion
  std::string name;
  ErrorPtr error;  // set at completion when the node failed or was skipped
  std::uint64_t seq = 0;
  Device device;
  int priority = 0;
  std::uint32_t pending = 0;  // unfinished predecessors
  std::uint32_t refs = 0;
  std::uint32_t tag = 0;      // waiter slot + 1 that helps run it; 0 = none
  std::uint32_t waiters = 0;  // waiters whose target this is
  NodeState state = NodeState::kRecorded;
  bool requested = false;
  bool in_unrequested = false;
  bool failed = false;          // its function threw
  Node* live_prev = nullptr;    // unfinished nodes, in record order
  Node* live_next = nullptr;
  Node* unreq_prev = nullptr;   // recorded, not yet requested, in record order
  Node* unreq_next = nullptr;
  Node* free_next = nullptr;
  // Profiler timestamps (ns), set only while the profiler runs.
  std::uint64_t t_push = 0;
  std::uint64_t t_ready = 0;
  std::uint64_t t_start = 0;
  std::uint64_t t_end = 0;
  std::uint64_t t_launch_start = 0;  // stream nodes: the host's part (enqueue)
  std::uint64_t t_launch_end = 0;
  int worker = -1;
  // Stream devices. An edge between two stream-device nodes is satisfied when
  // the producer is launched (the consumer's stream waits for its event);
  // every other edge when the producer is done.
  StreamDevice* sdev = nullptr;     // null: runs on a CPU worker
  int stream = -1;
  std::size_t bytes = 0;            // PushOptions::bytes
  StreamEvent event;                // recorded after it on its stream
  bool has_event = false;           // `event` is to be released with the node
  bool launch_failed = false;       // launch threw: nothing was enqueued
  SmallVector<StreamEvent, 4> waits;  // events of producers on other streams
  NodeTask task;
};

// A launch edge: both ends run in stream order.
inline bool launch_edge(const Node* pred, const Node* succ) {
  return pred->sdev != nullptr && succ->sdev != nullptr;
}

// Scheduler state of one stream device (guarded by the graph mutex).
struct DeviceSlot {
  std::unique_ptr<StreamDevice> device;
  std::uint32_t next_stream = 0;  // round-robin for nodes without a producer
  std::size_t in_flight = 0;
  std::size_t in_flight_bytes = 0;
  std::deque<Node*> held;  // kDeferred nodes, one ref each, oldest first
};

enum class WaitMode : std::uint8_t { kNode, kAll, kThrottle };

struct Waiter {
  std::condition_variable_any cv;
  WaitMode mode = WaitMode::kNode;
  Node* target = nullptr;        // kNode
  std::uint64_t all_before = 0;  // kAll: every node with a smaller seq
  SmallVector<Node*, 8> help;    // kNode: ready nodes of its subgraph, one ref each
  std::uint32_t tag = 0;
  bool available = false;        // asleep (or about to look for work): hand it work
  bool in_use = false;           // pooled: condition variables allocate, waits must not
  // Set (under the graph mutex) by every wake-up: a waiter spinning outside
  // the mutex sees it without sleeping.
  std::atomic<bool> signal{false};
  void wake() {
    signal.store(true, std::memory_order_release);
    cv.notify_one();
  }
};

namespace {

thread_local const EngineImpl* tls_running_engine = nullptr;

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
  auto next = std::make_unique<tbb::global_control>(
      tbb::global_control::max_allowed_parallelism, wanted);
  control = std::move(next);
  current = wanted;
}

[[noreturn]] void throw_op_error(const ErrorRecord& e, std::size_t more) {
  std::string suffix =
      more == 0 ? std::string() : " (and " + std::to_string(more) + " more failed ops)";
  // Rethrow the cause first so that OpError's nested_exception captures it.
  try {
    std::rethrow_exception(e.cause);
  } catch (const std::exception& ex) {
    throw OpError(e.op_name, ex.what() + suffix, e.cause);
  } catch (...) {
    throw OpError(e.op_name, "non-standard exception" + suffix, e.cause);
  }
}

}  // namespace

class EngineImpl {
 public:
  explicit EngineImpl(EngineOptions options);
  ~EngineImpl();
  EngineImpl(const EngineImpl&) = delete;
  EngineImpl& operator=(const EngineImpl&) = delete;

  Var new_var();
  void delete_var(Var v);
  void push(Function fn, std::span<const Var> reads, std::span<const Var> writes,
            const PushOptions& options);
  void wait_to_read(Var v, const CallSite& site);
  void wait_to_write(Var v, const CallSite& site);
  void waitall(const CallSite& site);
  void wait_all_recorded(bool watchdog);
  EngineStats stats() const;
  std::vector<PendingNode> pending_nodes() const;
  StreamDevice& stream_device(Device d);
  // Called by NodeTask: the node's function in stream order, and its completion.
  void run_on_stream(Node* n, const RunContext& ctx);
  void stream_complete(Node* n, std::exception_ptr async_error, DeviceInterval ran);

  const EngineOptions options_;
  const int num_threads_;
  const std::uint64_t profile_id_;  // tells engines apart in a trace

 private:
  using Lock = std::unique_lock<GraphMutex>;
  static constexpr std::uint32_t kVarChunk = 4096;
  static constexpr std::uint32_t kNodeBlock = 256;
  static constexpr std::uint32_t kMaxBatch = 16;
  // How long a wait for a node its device is running spins before sleeping.
  static constexpr std::chrono::microseconds kDeviceWaitSpin{50};

  VarState& slot(std::uint32_t index) { return var_chunks_[index / kVarChunk][index % kVarChunk]; }
  VarState* checked_var(Var v, std::string_view call, std::string_view op = {});
  void check_not_in_op(std::string_view call) const;

  Node* alloc_node();
  void release(Node* n);
  void add_edge(Node* pred, Node* n);
  void link(Node* n, std::span<VarState* const> pure_reads, std::span<VarState* const> writes);
  void record(Node* n);
  void request(Node* n);
  void request_subgraph(Node* target, Waiter& w);
  void make_ready(Node* n);
  Node* pop_ready();
  Node* pop_help(Waiter& w);
  std::uint32_t pop_batch(Node** out);
  void run_batch(Node** batch, std::uint32_t k, int worker, Lock& lk);
  void execute(Node* n, const RunContext& ctx);
  void run_node(Node* n, int worker);
  void finish_node(Node* n);
  bool claim(Node* n);
  void launch(Node* n);
  void mark_launched(Node* n);
  int choose_stream(Node* n, StreamKind kind);
  DeviceSlot& slot_of(const Device& d);
  void complete(Node* n);
  void trace(const Node* n) const;
  void free_var(VarState* s);
  bool var_idle(const VarState* s) const;

  Waiter& register_waiter(WaitMode mode);
  void unregister_waiter(Waiter& w);
  template <class Done>
  bool help_until(Waiter& w, Lock& lk, Done done, bool watchdog = true);
  std::string describe_pending(Node* target) const;
  void untag(Node* target, std::uint32_t tag);
  void wait_node(Node* target, Lock& lk);
  void after_push(Node* n, Lock& lk);
  void spawn_if_needed();
  void flush_spawns(Lock& lk);
  void runner();

  mutable GraphMutex mu_;
  std::vector<std::unique_ptr<VarState[]>> var_chunks_;
  std::uint32_t var_count_ = 0;
  std::uint32_t var_free_ = 0;  // index + 1
  std::vector<std::unique_ptr<Node[]>> node_blocks_;
  Node* node_free_ = nullptr;
  Node* live_head_ = nullptr;
  Node* live_tail_ = nullptr;
  std::size_t live_count_ = 0;
  Node* unreq_head_ = nullptr;
  Node* unreq_tail_ = nullptr;
  std::size_t unreq_count_ = 0;
  ReadyQueue<Node> ready_;  // one ref per entry
  std::vector<std::unique_ptr<Waiter>> waiters_;  // by tag - 1; reused (in_use)
  std::size_t all_waiters_ = 0;
  std::size_t throttle_waiters_ = 0;
  std::vector<ErrorPtr> unreported_;
  int active_runners_ = 0;
  int spawn_ = 0;  // runners to enqueue once mu_ is released
  int continuing_ = 0;  // during complete(): the completing thread pops one ready node itself
  std::condition_variable_any runners_cv_;
  std::uint64_t next_seq_ = 1;
  EngineStats stats_;
  // Blocking-call counters, updated without mu_ (a wait may end by throwing).
  std::array<std::atomic<std::uint64_t>, kBlockingCallKinds> blocking_calls_{};
  std::atomic<std::uint64_t> blocked_ns_{0};

  // Times one blocking call and accounts for it (sync debug, counters).
  class BlockingScope {
   public:
    BlockingScope(EngineImpl& e, const CallSite& site) : e_(e), site_(site) {
      detail::sync_debug_enter(site);
      t0_ = std::chrono::steady_clock::now();
    }
    ~BlockingScope() {
      const auto ns = static_cast<std::uint64_t>(
          std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0_)
              .count());
      e_.blocking_calls_[static_cast<std::size_t>(site_.kind)].fetch_add(1, std::memory_order_relaxed);
      e_.blocked_ns_.fetch_add(ns, std::memory_order_relaxed);
      detail::sync_debug_exit(site_, ns);
      if (profiler::detail::on()) {
        const std::uint64_t end = profiler::detail::now_ns();
        profiler::detail::record(profiler::detail::FrontendEvent{
            "wait", std::string(to_string(site_.kind)),
            std::string(site_.where.file_name()) + ":" + std::to_string(site_.where.line()),
            end - ns, end});
      }
    }
    BlockingScope(const BlockingScope&) = delete;
    BlockingScope& operator=(const BlockingScope&) = delete;

   private:
    EngineImpl& e_;
    const CallSite& site_;
    std::chrono::steady_clock::time_point t0_;
  };
  std::vector<Node*> scratch_;  // traversal stack
  std::unique_ptr<tbb::task_arena> arena_;
  // Stream devices: sim(0..7) then gpu(0..7). `devices_` is written once per
  // slot under devices_mu_ (creation may be slow: CUDA initialisation) and
  // read lock-free after; the slots' scheduling fields are under mu_.
  static constexpr int kMaxStreamDevices = 8;
  std::array<DeviceSlot, 2 * kMaxStreamDevices> slots_;
  std::array<std::atomic<StreamDevice*>, 2 * kMaxStreamDevices> devices_{};
  std::mutex devices_mu_;
};

namespace {
std::atomic<std::uint64_t> g_engine_ids{0};
}  // namespace

EngineImpl::EngineImpl(EngineOptions options)
    : options_(options),
      num_threads_(options.policy == Policy::kNaive ? 0
                   : options.num_threads > 0
                       ? options.num_threads
                       : static_cast<int>(std::max(1U, std::thread::hardware_concurrency()))),
      profile_id_(g_engine_ids.fetch_add(1) + 1) {
  if (options.num_threads < 0) {
    throw InvalidArgument("EngineOptions::num_threads must be >= 0, got " +
                          std::to_string(options.num_threads));
  }
  if (num_threads_ > 0) {
    ensure_tbb_workers(num_threads_);
    // Slot 0 is reserved for an external thread (never used: frontend threads
    // help through the engine's own queues), so the workers take slots
    // 1..num_threads_ and RunContext::worker_index is slot - 1.
    arena_ = std::make_unique<tbb::task_arena>(num_threads_ + 1, 1);
    arena_->initialize();
  }
}

EngineImpl::~EngineImpl() {
  try {
    wait_all_recorded(/*watchdog=*/false);
  } catch (const std::exception& e) {
    std::cerr << "lazydag: engine destroyed with an error no wait collected: " << e.what()
              << '\n';
  }
  {
    Lock lk(mu_);
    runners_cv_.wait(lk, [&] { return active_runners_ == 0; });
  }
  // Joins the emulated executors (a completion may still be leaving mu_).
  for (DeviceSlot& d : slots_) d.device.reset();
}

// ---- stream devices --------------------------------------------------------

DeviceSlot& EngineImpl::slot_of(const Device& d) {
  return slots_[static_cast<std::size_t>((d.kind == DeviceKind::kGpu ? kMaxStreamDevices : 0) + d.id)];
}

StreamDevice& EngineImpl::stream_device(Device d) {
  if (d.kind == DeviceKind::kCpu) {
    throw InvalidArgument("stream_device: " + d.str() + " is not a stream device");
  }
  if (d.id < 0 || d.id >= kMaxStreamDevices) {
    throw InvalidArgument(d.str() + ": device ids are in [0, " + std::to_string(kMaxStreamDevices) +
                          ")");
  }
  const auto i = static_cast<std::size_t>((d.kind == DeviceKind::kGpu ? kMaxStreamDevices : 0) + d.id);
  if (StreamDevice* p = devices_[i].load(std::memory_order_acquire)) return *p;
  std::lock_guard lk(devices_mu_);
  if (StreamDevice* p = devices_[i].load(std::memory_order_acquire)) return *p;
  std::unique_ptr<StreamDevice> dev;
  if (d.kind == DeviceKind::kSim) {
    const auto delay = static_cast<unsigned>(env_size("LAZYDAG_SIM_DELAY_US", 0, 1000000));
    dev = std::make_unique<SimDevice>(d.id, default_compute_streams(), delay);
  } else {
    dev = make_cuda_device(d.id, default_compute_streams());  // throws BackendUnavailable
  }
  StreamDevice* p = dev.get();
  {
    Lock glk(mu_);
    slots_[i].device = std::move(dev);
  }
  devices_[i].store(p, std::memory_order_release);
  return *p;
}

// Compute nodes follow their latest unfinished producer on the same device
// (its stream order then carries the dependency, with no event); nodes with
// none are spread round-robin over the compute streams. Copies use the
// device's copy streams, so that they overlap compute.
int EngineImpl::choose_stream(Node* n, StreamKind kind) {
  StreamDevice* d = n->sdev;
  if (kind == StreamKind::kCopyIn) return d->copy_in_stream();
  if (kind == StreamKind::kCopyOut) return d->copy_out_stream();
  const Node* best = nullptr;
  for (const Node* p : n->preds) {
    if (p->sdev == d && p->stream < d->num_compute_streams() && (best == nullptr || p->seq > best->seq)) {
      best = p;
    }
  }
  if (best != nullptr) return best->stream;
  DeviceSlot& slot = slot_of(d->device());
  return static_cast<int>(slot.next_stream++ % static_cast<std::uint32_t>(d->num_compute_streams()));
}

// A ready node is taken to run (CPU) or to launch (stream device). A stream
// node whose device has its run-ahead bound in flight is held instead and
// made ready again by a completion on that device. Returns false when held.
bool EngineImpl::claim(Node* n) {
  if (n->sdev != nullptr) {
    DeviceSlot& d = slot_of(n->sdev->device());
    if (d.in_flight >= options_.max_in_flight ||
        (d.in_flight != 0 && d.in_flight_bytes + n->bytes > options_.max_in_flight_bytes)) {
      n->state = NodeState::kDeferred;
      ++n->refs;
      d.held.push_back(n);
      ++stats_.in_flight_stalls;
      return false;
    }
    ++d.in_flight;
    d.in_flight_bytes += n->bytes;
    n->waits.clear();
    for (const Node* p : n->preds) {
      // Producers on stream devices are launched (or done) by now; one on
      // another stream is waited for on the device, never on the host.
      if (p->sdev != nullptr && p->state == NodeState::kLaunched && p->has_event &&
          (p->sdev != n->sdev || p->stream != n->stream)) {
        n->waits.push_back(p->event);
      }
    }
  }
  n->state = NodeState::kRunning;
  return true;
}

void EngineImpl::launch(Node* n) {
  try {
    n->sdev->launch(n->stream, std::span<const StreamEvent>(n->waits.begin(), n->waits.size()),
                    n->task, n->event);
    n->has_event = true;
  } catch (...) {
    // Nothing was enqueued: the node fails here, and finish_node completes it.
    auto err = std::make_shared<ErrorRecord>(ErrorRecord{n->name, std::current_exception(), n->seq, false});
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

void EngineImpl::run_node(Node* n, int worker) {
  if (n->sdev == nullptr) {
    execute(n, RunContext{n->device, nullptr, worker, -1, nullptr});
  } else {
    launch(n);
  }
}

// Under mu_, after run_node: a CPU node is done; a stream node is launched
// (unless its completion, which may come first, already said so).
void EngineImpl::finish_node(Node* n) {
  if (n->sdev == nullptr) {
    complete(n);
  } else if (n->launch_failed) {
    if (n->state == NodeState::kRunning) mark_launched(n);
    DeviceSlot& d = slot_of(n->sdev->device());
    --d.in_flight;
    d.in_flight_bytes -= n->bytes;
    complete(n);
  } else if (n->state == NodeState::kRunning) {
    mark_launched(n);
  }
  release(n);  // the runner's ref
}

void EngineImpl::mark_launched(Node* n) {
  n->state = NodeState::kLaunched;
  ++stats_.nodes_launched;
  // Launch-edge successors leave the list now: one may complete, and its
  // node be recycled, before n completes (its stream waits for n's event,
  // but completions are reported in any order across streams).
  std::uint32_t kept = 0;
  for (Node* s : n->succs) {
    if (launch_edge(n, s)) {
      if (--s->pending == 0 && s->requested) make_ready(s);
    } else {
      n->succs[kept++] = s;
    }
  }
  n->succs.resize_down(kept);
}

void EngineImpl::run_on_stream(Node* n, const RunContext& ctx) { execute(n, ctx); }

void EngineImpl::stream_complete(Node* n, std::exception_ptr async_error, DeviceInterval ran) {
  Lock lk(mu_);
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
    auto err = std::make_shared<ErrorRecord>(ErrorRecord{n->name, async_error, n->seq, false});
    for (VarState* v : n->writes) v->poison = err;
    n->error = std::move(err);
    n->failed = true;
  }
  if (n->state == NodeState::kRunning) mark_launched(n);
  DeviceSlot& d = slot_of(n->sdev->device());
  --d.in_flight;
  d.in_flight_bytes -= n->bytes;
  while (!d.held.empty() && d.in_flight < options_.max_in_flight &&
         (d.in_flight == 0 || d.in_flight_bytes + d.held.front()->bytes <= options_.max_in_flight_bytes)) {
    Node* h = d.held.front();
    d.held.pop_front();
    make_ready(h);
    release(h);
  }
  complete(n);
  flush_spawns(lk);
}

void NodeTask::run(const RunContext& ctx) noexcept { engine->run_on_stream(node, ctx); }
void NodeTask::complete(std::exception_ptr async_error, DeviceInterval ran) noexcept {
  engine->stream_complete(node, std::move(async_error), ran);
}

// ---- vars ----------------------------------------------------------------

// `call` names the API, `op` the node being pushed (if any); the message is
// only built on failure, so the check costs nothing on the hot path.
VarState* EngineImpl::checked_var(Var v, std::string_view call, std::string_view op) {
  bool deleted = false;
  if (v.valid() && v.index < var_count_) {
    VarState& s = slot(v.index);
    if (s.handle.generation == v.generation && s.alive) return &s;
    deleted = v.generation <= s.handle.generation;
  }
  std::string where(call);
  if (!op.empty()) where += " '" + std::string(op) + "'";
  if (deleted) {
    throw InvalidArgument(where + ": var #" + std::to_string(v.index) + " has been deleted");
  }
  throw InvalidArgument(where + ": unknown var (#" + std::to_string(v.index) + " generation " +
                        std::to_string(v.generation) + " was never created by this engine)");
}

void EngineImpl::check_not_in_op(std::string_view call) const {
  if (tls_running_engine == this) {
    throw InvalidArgument(std::string(call) +
                          " called from inside a running op of the same engine: it would "
                          "wait for itself; record a dependent op instead");
  }
}

Var EngineImpl::new_var() {
  Lock lk(mu_);
  std::uint32_t index = 0;
  if (var_free_ != 0) {
    index = var_free_ - 1;
    var_free_ = slot(index).next_free;
  } else {
    if (var_count_ == std::numeric_limits<std::uint32_t>::max()) {
      throw Error("new_var: out of var slots");
    }
    if (var_count_ % kVarChunk == 0) {
      var_chunks_.push_back(std::make_unique<VarState[]>(kVarChunk));
    }
    index = var_count_++;
  }
  VarState& s = slot(index);
  s.handle.index = index;
  s.handle.generation = s.handle.generation == std::numeric_limits<std::uint32_t>::max()
                            ? 1
                            : s.handle.generation + 1;
  s.alive = true;
  return s.handle;
}

void EngineImpl::free_var(VarState* s) {
  s->dying = false;
  if (s->last_writer != nullptr) release(s->last_writer);
  s->last_writer = nullptr;
  for (Node* r : s->readers) release(r);
  s->readers.shrink_if_large(64);
  s->prune_at = 8;
  s->poison.reset();
  s->next_free = var_free_;
  var_free_ = s->handle.index + 1;
}

// ---- nodes ---------------------------------------------------------------

Node* EngineImpl::alloc_node() {
  if (node_free_ == nullptr) {
    auto block = std::make_unique<Node[]>(kNodeBlock);
    for (std::uint32_t i = 0; i < kNodeBlock; ++i) {
      block[i].free_next = node_free_;
      node_free_ = &block[i];
    }
    node_blocks_.push_back(std::move(block));
  }
  Node* n = node_free_;
  node_free_ = n->free_next;
  return n;
}

void EngineImpl::release(Node* n) {
  if (--n->refs != 0) return;
  // Recycle. fn was reset when the node ran; edge lists were cleared at completion.
  n->reads.shrink_if_large(16);
  n->writes.shrink_if_large(16);
  n->succs.shrink_if_large(64);
  n->preds.shrink_if_large(64);
  n->name.clear();
  n->error.reset();
  n->tag = 0;
  n->waiters = 0;
  n->state = NodeState::kRecorded;
  n->requested = false;
  n->failed = false;
  n->device = Device{};
  n->priority = 0;
  if (n->has_event) n->sdev->release_event(n->event);
  n->has_event = false;
  n->launch_failed = false;
  n->sdev = nullptr;
  n->stream = -1;
  n->bytes = 0;
  n->waits.clear();
  n->free_next = node_free_;
  node_free_ = n;
}

void EngineImpl::add_edge(Node* pred, Node* n) {
  if (pred->state == NodeState::kDone || n->preds.contains(pred)) return;
  n->preds.push_back(pred);
  ++pred->refs;
  // A launched producer satisfies a launch edge already: n's stream waits
  // for its event (kept alive by the ref above).
  if (launch_edge(pred, n) && pred->state == NodeState::kLaunched) return;
  pred->succs.push_back(n);
  ++n->pending;
}

void EngineImpl::link(Node* n, std::span<VarState* const> pure_reads,
                      std::span<VarState* const> writes) {
  for (VarState* s : pure_reads) {
    if (s->last_writer != nullptr) add_edge(s->last_writer, n);  // read after write
    if (s->readers.size() >= s->prune_at) {
      // Drop finished readers so a var read forever does not grow forever.
      std::uint32_t kept = 0;
      for (Node* r : s->readers) {
        if (r->state == NodeState::kDone) {
          release(r);
        } else {
          s->readers[kept++] = r;
        }
      }
      s->readers.resize_down(kept);
      s->prune_at = std::max<std::uint32_t>(8, kept * 2);
    }
    s->readers.push_back(n);
    ++n->refs;
  }
  for (VarState* s : writes) {
    if (s->last_writer != nullptr) {
      add_edge(s->last_writer, n);  // write after write
      release(s->last_writer);
    }
    for (Node* r : s->readers) {
      add_edge(r, n);  // write after read
      release(r);
    }
    s->readers.clear();
    s->prune_at = 8;
    s->last_writer = n;
    ++n->refs;
  }
}

void EngineImpl::record(Node* n) {
  n->seq = next_seq_++;
  ++n->refs;  // held until completion
  n->live_prev = live_tail_;
  n->live_next = nullptr;
  (live_tail_ != nullptr ? live_tail_->live_next : live_head_) = n;
  live_tail_ = n;
  ++live_count_;
  ++stats_.nodes_recorded;
  stats_.peak_unfinished = std::max(stats_.peak_unfinished, live_count_);
  if (options_.policy == Policy::kNaive) {
    // Requested by the wait in after_push, which tags it first so it goes
    // straight to the recording thread (never via the heap).
    return;
  }
  if (options_.policy == Policy::kLazy) {
    n->in_unrequested = true;
    n->unreq_prev = unreq_tail_;
    n->unreq_next = nullptr;
    (unreq_tail_ != nullptr ? unreq_tail_->unreq_next : unreq_head_) = n;
    unreq_tail_ = n;
    ++unreq_count_;
  } else {
    request(n);
  }
}

void EngineImpl::request(Node* n) {
  n->requested = true;
  if (n->in_unrequested) {
    n->in_unrequested = false;
    (n->unreq_prev != nullptr ? n->unreq_prev->unreq_next : unreq_head_) = n->unreq_next;
    (n->unreq_next != nullptr ? n->unreq_next->unreq_prev : unreq_tail_) = n->unreq_prev;
    --unreq_count_;
  }
  if (n->pending == 0 && n->state == NodeState::kRecorded) make_ready(n);
}

// Requests and tags every unfinished ancestor of target, iteratively (a chain
// of millions must not recurse). A node is tagged once, by the first waiter
// that reaches it; at that point all its unfinished ancestors get tagged too
// (edges only point from older to newer nodes), so a later traversal stops at
// any tagged node and every node is visited O(1) times over the engine's life.
void EngineImpl::request_subgraph(Node* target, Waiter& w) {
  scratch_.clear();
  scratch_.push_back(target);
  while (!scratch_.empty()) {
    Node* n = scratch_.back();
    scratch_.pop_back();
    if (n->state == NodeState::kDone || n->tag != 0) continue;
    n->tag = w.tag;
    if (!n->requested) {
      request(n);  // make_ready hands it to w when it is ready
    } else if (n->state == NodeState::kReady) {
      w.help.push_back(n);
      ++n->refs;
    }
    for (Node* p : n->preds) {
      if (p->state != NodeState::kDone && p->tag == 0) scratch_.push_back(p);
    }
  }
}


// A ready node goes to the waiter that tagged it when that waiter is free to
// run it next (then only there: no worker is woken for it); otherwise onto the
// heap for the workers, and also to a busy tagging waiter, whichever is first.
void EngineImpl::make_ready(Node* n) {
  n->state = NodeState::kReady;
  if (profiler::detail::on()) n->t_ready = profiler::detail::now_ns();
  if (n->tag != 0) {
    Waiter* w = waiters_[n->tag - 1].get();
    if (w->in_use && w->mode == WaitMode::kNode) {
      w->help.push_back(n);
      ++n->refs;
      if (w->available) {
        w->available = false;
        w->wake();
        return;
      }
    }
  }
  ready_.push(n, n->priority, n->seq);
  ++n->refs;
  if (all_waiters_ + throttle_waiters_ != 0) {
    for (auto& wp : waiters_) {
      Waiter* w = wp.get();
      if (w->in_use && w->mode != WaitMode::kNode && w->available) {
        w->available = false;
        w->wake();
        return;
      }
    }
  }
  spawn_if_needed();
}

void EngineImpl::spawn_if_needed() {
  if (continuing_ > 0) {
    --continuing_;  // the thread completing a node takes this one next
    return;
  }
  if (active_runners_ < num_threads_) {
    ++active_runners_;
    ++spawn_;
  }
}

Node* EngineImpl::pop_ready() {
  while (Node* n = ready_.pop()) {
    if (n->state == NodeState::kReady && claim(n)) {
      return n;  // the queue entry's ref passes to the caller
    }
    release(n);  // claimed by a waiter already, or held by its device
  }
  return nullptr;
}

Node* EngineImpl::pop_help(Waiter& w) {
  while (!w.help.empty()) {
    Node* n = w.help.back();
    w.help.pop_back();
    if (n->state == NodeState::kReady && claim(n)) return n;
    release(n);
  }
  return nullptr;
}

void EngineImpl::execute(Node* n, const RunContext& ctx) {
  ErrorPtr err;
  for (VarState* v : n->reads) {
    if (v->poison) {
      err = v->poison;  // skipped: inherits the failure
      break;
    }
  }
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
  if (!err) {
    range_push(n->name.c_str());
    try {
      n->fn(ctx);
    } catch (...) {
      err = std::make_shared<ErrorRecord>(
          ErrorRecord{n->name, std::current_exception(), n->seq, false});
      failed = true;
    }
    range_pop();
  }
  if (profiling) n->t_end = profiler::detail::now_ns();
  for (VarState* v : n->writes) v->poison = err;  // a successful write clears it
  n->fn.reset();  // captures die here, outside mu_: their destructors may record
  tls_running_engine = outer;
  n->error = std::move(err);
  n->failed = failed;
}

void EngineImpl::trace(const Node* n) const {
  profiler::detail::NodeEvent e;
  e.engine = profile_id_;
  e.id = n->seq;
  e.name = n->name;
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
  for (const VarState* v : n->reads) e.ids.push_back(v->handle.index);
  for (const VarState* v : n->writes) e.ids.push_back(v->handle.index);
  for (const Node* p : n->preds) e.ids.push_back(p->seq);
  e.num_reads = static_cast<std::uint16_t>(n->reads.size());
  e.num_writes = static_cast<std::uint16_t>(n->writes.size());
  e.failed = n->failed;
  e.skipped = !n->failed && n->error != nullptr;
  profiler::detail::record(std::move(e));
}

void EngineImpl::complete(Node* n) {
  n->state = NodeState::kDone;
  if (n->t_end != 0) {
    trace(n);
    n->t_push = n->t_ready = n->t_start = n->t_end = n->t_launch_start = n->t_launch_end = 0;
  }
  if (n->failed) {
    ++stats_.nodes_run;
    ++stats_.nodes_failed;
    unreported_.push_back(n->error);
  } else if (n->error) {
    ++stats_.nodes_skipped;
  } else {
    ++stats_.nodes_run;
  }
  (n->live_prev != nullptr ? n->live_prev->live_next : live_head_) = n->live_next;
  (n->live_next != nullptr ? n->live_next->live_prev : live_tail_) = n->live_prev;
  --live_count_;
  for (Node* s : n->succs) {
    // Launch edges were satisfied when n was launched.
    if (!launch_edge(n, s) && --s->pending == 0 && s->requested) make_ready(s);
  }
  n->succs.clear();
  for (Node* p : n->preds) release(p);
  n->preds.clear();
  // A deleted var is recycled when its last recorded access completes.
  for (VarState* v : n->reads) {
    if (v->dying && var_idle(v)) free_var(v);
  }
  for (VarState* v : n->writes) {
    if (v->dying && var_idle(v)) free_var(v);
  }
  if (n->waiters != 0) {
    for (auto& wp : waiters_) {
      if (wp->in_use && wp->target == n) wp->wake();
    }
  }
  if (all_waiters_ != 0) {
    for (auto& wp : waiters_) {
      if (wp->in_use && wp->mode == WaitMode::kAll &&
          (live_head_ == nullptr || live_head_->seq >= wp->all_before)) {
        wp->wake();
      }
    }
  }
  if (throttle_waiters_ != 0 && live_count_ <= options_.max_pending) {
    for (auto& wp : waiters_) {
      if (wp->in_use && wp->mode == WaitMode::kThrottle) wp->wake();
    }
  }
  release(n);  // the unfinished ref (the runner's is dropped by finish_node)
}

// ---- scheduling ----------------------------------------------------------

void EngineImpl::flush_spawns(Lock& lk) {
  if (spawn_ == 0) return;
  int n = spawn_;
  spawn_ = 0;
  lk.unlock();
  for (int i = 0; i < n; ++i) arena_->enqueue([this] { runner(); });
  lk.lock();
}

// Takes several ready nodes at once when many are ready, so that a thread
// takes mu_ once per batch rather than once per node. The batch is at most a
// half share of the heap among the executors (workers + one helping
// frontend), so the other threads always find work; one node at a time when
// few are ready (a dependent chain keeps its latency).
std::uint32_t EngineImpl::pop_batch(Node** out) {
  const std::size_t share =
      std::max<std::size_t>(1, ready_.size() / (2 * static_cast<std::size_t>(num_threads_ + 1)));
  const auto limit = static_cast<std::uint32_t>(std::min<std::size_t>(kMaxBatch, share));
  std::uint32_t k = 0;
  while (k < limit) {
    Node* n = pop_ready();
    if (n == nullptr) break;
    out[k++] = n;
  }
  return k;
}

void EngineImpl::run_batch(Node** batch, std::uint32_t k, int worker, Lock& lk) {
  lk.unlock();
  for (std::uint32_t i = 0; i < k; ++i) run_node(batch[i], worker);
  lk.lock();
  continuing_ = 1;  // this thread pops again right after: no worker for one node
  for (std::uint32_t i = 0; i < k; ++i) finish_node(batch[i]);
  continuing_ = 0;
  flush_spawns(lk);
}

void EngineImpl::runner() {
  const int worker = tbb::this_task_arena::current_thread_index() - 1;
  if (profiler::detail::on()) {
    thread_local bool named = false;
    if (!named) {
      named = true;
      profiler::detail::name_thread("worker " + std::to_string(worker));
    }
  }
  Node* batch[kMaxBatch];
  Lock lk(mu_);
  for (;;) {
    std::uint32_t k = pop_batch(batch);
    if (k == 0) break;
    run_batch(batch, k, worker, lk);
  }
  --active_runners_;
  if (active_runners_ == 0) runners_cv_.notify_all();
}

Waiter& EngineImpl::register_waiter(WaitMode mode) {
  std::size_t i = 0;
  while (i < waiters_.size() && waiters_[i]->in_use) ++i;
  if (i == waiters_.size()) waiters_.push_back(std::make_unique<Waiter>());
  Waiter& w = *waiters_[i];
  w.in_use = true;
  w.mode = mode;
  w.target = nullptr;
  w.all_before = 0;
  w.available = false;
  w.tag = static_cast<std::uint32_t>(i) + 1;
  if (mode == WaitMode::kAll) ++all_waiters_;
  if (mode == WaitMode::kThrottle) ++throttle_waiters_;
  return w;
}

void EngineImpl::unregister_waiter(Waiter& w) {
  w.in_use = false;
  w.target = nullptr;
  if (w.mode == WaitMode::kAll) --all_waiters_;
  if (w.mode == WaitMode::kThrottle) --throttle_waiters_;
  for (Node* n : w.help) release(n);
  w.help.clear();
  // Work may have been handed to this waiter instead of a worker just as it
  // finished: make sure the ready heap has runners.
  for (std::size_t i = 0; i < ready_.size() && active_runners_ < num_threads_; ++i) {
    spawn_if_needed();
  }
}

// Runs this waiter's share of ready work until done(). Returns false when
// the watchdog expired first (only when `watchdog` and it is on).
template <class Done>
bool EngineImpl::help_until(Waiter& w, Lock& lk, Done done, bool watchdog) {
  const bool timed = watchdog && options_.watchdog_seconds > 0;
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          std::chrono::duration<double>(timed ? options_.watchdog_seconds : 0.0));
  bool spun = false;
  for (;;) {
    if (done()) return true;
    if (w.mode == WaitMode::kNode) {
      if (Node* n = pop_help(w); n != nullptr) {
        flush_spawns(lk);
        lk.unlock();
        run_node(n, -1);
        lk.lock();
        // This thread looks at its help list right after: the first node
        // of its subgraph made ready here is not given to a worker.
        w.available = true;
        finish_node(n);
        w.available = false;
        continue;
      }
    } else {
      Node* batch[kMaxBatch];
      if (std::uint32_t k = pop_batch(batch); k != 0) {
        flush_spawns(lk);
        run_batch(batch, k, -1, lk);
        continue;
      }
    }
    flush_spawns(lk);
    if (done()) return true;
    if (!spun && w.mode == WaitMode::kNode && w.target->sdev != nullptr &&
        w.target->state == NodeState::kLaunched) {
      // Its device is running it: spin briefly before sleeping, since
      // waking a sleeping thread costs more than a short op on the device.
      // Any wake-up ends the spin.
      spun = true;
      w.signal.store(false, std::memory_order_relaxed);
      w.available = true;
      lk.unlock();
      const auto until = std::chrono::steady_clock::now() + kDeviceWaitSpin;
      while (!w.signal.load(std::memory_order_acquire) && std::chrono::steady_clock::now() < until) {
        std::this_thread::yield();
      }
      lk.lock();
      w.available = false;
      spun = !w.signal.load(std::memory_order_relaxed);  // woken: it may spin again
      continue;
    }
    spun = false;
    w.available = true;
    if (timed) {
      if (w.cv.wait_until(lk, deadline) == std::cv_status::timeout && !done()) {
        w.available = false;
        return false;
      }
    } else {
      w.cv.wait(lk);
    }
    w.available = false;
  }
}

void EngineImpl::wait_node(Node* target, Lock& lk) {
  if (target->state == NodeState::kDone) return;
  Waiter& w = register_waiter(WaitMode::kNode);
  w.target = target;
  ++target->waiters;
  w.available = true;  // while traversing: the first ready node goes to us
  request_subgraph(target, w);
  w.available = false;
  const bool finished = help_until(w, lk, [&] { return target->state == NodeState::kDone; });
  --target->waiters;
  if (!finished) {
    // Leave no tag of this waiter behind: its nodes go on running on workers.
    untag(target, w.tag);
    unregister_waiter(w);
    std::string report = describe_pending(target);
    lk.unlock();
    std::cerr << report;
    throw WatchdogTimeout(report);
  }
  unregister_waiter(w);
}

void EngineImpl::untag(Node* target, std::uint32_t tag) {
  scratch_.clear();
  scratch_.push_back(target);
  while (!scratch_.empty()) {
    Node* n = scratch_.back();
    scratch_.pop_back();
    if (n->state == NodeState::kDone || n->tag != tag) continue;
    n->tag = 0;
    if (n->state == NodeState::kReady) spawn_if_needed();  // it may have been handed only to us
    for (Node* p : n->preds) scratch_.push_back(p);
  }
}

namespace {
std::string_view state_name(const Node* n) {
  switch (n->state) {
    case NodeState::kRecorded: return n->requested ? "waiting for inputs" : "recorded (lazy)";
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
std::string EngineImpl::describe_pending(Node* target) const {
  std::vector<const Node*> nodes;
  if (target != nullptr) {
    std::vector<const Node*> stack{target};
    std::unordered_set<const Node*> seen{target};
    while (!stack.empty()) {
      const Node* n = stack.back();
      stack.pop_back();
      if (n->state == NodeState::kDone) continue;
      nodes.push_back(n);
      for (const Node* p : n->preds) {
        if (seen.insert(p).second) stack.push_back(p);
      }
    }
    std::sort(nodes.begin(), nodes.end(), [](const Node* a, const Node* b) { return a->seq < b->seq; });
  } else {
    for (const Node* n = live_head_; n != nullptr; n = n->live_next) nodes.push_back(n);
  }
  std::ostringstream os;
  os << "lazydag watchdog: a wait blocked for more than " << options_.watchdog_seconds
     << " s on " << nodes.size() << " unfinished node(s):\n";
  std::size_t shown = 0;
  for (const Node* n : nodes) {
    if (++shown > 20) {
      os << "  ... and " << nodes.size() - 20 << " more\n";
      break;
    }
    os << "  #" << n->seq << " '" << n->name << "' on " << n->device.str();
    if (n->stream >= 0) os << " stream " << n->stream;
    os << ": " << state_name(n);
    if (n->pending != 0) os << ", " << n->pending << " input(s) pending";
    os << "; reads";
    for (const VarState* v : n->reads) os << " v" << v->handle.index;
    os << "; writes";
    for (const VarState* v : n->writes) os << " v" << v->handle.index;
    os << '\n';
  }
  return os.str();
}

// ---- public operations ---------------------------------------------------

void EngineImpl::after_push(Node* n, Lock& lk) {
  if (options_.policy == Policy::kNaive) {
    if (tls_running_engine != this) {
      ++n->refs;
      wait_node(n, lk);
      release(n);
      // Nodes recorded by ops (or their destructors) meanwhile run now too,
      // so that nothing recorded waits for a later waitall.
      Waiter& w = register_waiter(WaitMode::kAll);
      w.all_before = next_seq_;
      help_until(w, lk, [&] { return ready_.empty(); }, /*watchdog=*/false);
      unregister_waiter(w);
    } else {
      request(n);  // recorded by a running op: runs after it, at the next wait
    }
  } else if (options_.max_pending != 0) {
    // The pending window: start the oldest recorded work when the frontend
    // records far ahead, then stall a frontend that outruns the workers.
    while (unreq_count_ > options_.max_pending) request(unreq_head_);
    if (live_count_ > 2 * options_.max_pending && tls_running_engine != this) {
      Waiter& w = register_waiter(WaitMode::kThrottle);
      help_until(w, lk, [&] { return live_count_ <= options_.max_pending; }, /*watchdog=*/false);
      unregister_waiter(w);
    }
  }
  flush_spawns(lk);
}

void EngineImpl::push(Function fn, std::span<const Var> reads, std::span<const Var> writes,
                      const PushOptions& options) {
  std::string_view name = options.name.empty() ? std::string_view("op") : options.name;
  if (!fn) throw InvalidArgument("push '" + std::string(name) + "': empty function");
  if (options.device.id < 0) {
    throw InvalidArgument("push '" + std::string(name) + "': device ids are >= 0, got " +
                          options.device.str());
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
  Lock lk(mu_);
  // Validate everything before touching the graph: bad input records nothing.
  SmallVector<VarState*, 8> ws;
  SmallVector<VarState*, 8> rs;
  SmallVector<VarState*, 8> pure_reads;
  for (Var v : writes) {
    VarState* s = checked_var(v, "push (write set) of", name);
    if (!ws.contains(s)) ws.push_back(s);
  }
  for (Var v : reads) {
    VarState* s = checked_var(v, "push (read set) of", name);
    if (rs.contains(s)) continue;
    rs.push_back(s);
    if (!ws.contains(s)) pure_reads.push_back(s);
  }
  const bool profiling = profiler::detail::on();
  const std::uint64_t t0 = profiling ? profiler::detail::now_ns() : 0;
  Node* n = alloc_node();
  n->fn = std::move(fn);
  n->name.assign(name);
  n->t_push = t0;
  n->device = options.device;
  n->priority = options.priority;
  n->pending = 0;
  n->sdev = sdev;
  n->bytes = options.bytes;
  n->task.engine = this;
  n->task.node = n;
  for (VarState* s : rs) n->reads.push_back(s);
  for (VarState* s : ws) n->writes.push_back(s);
  link(n, std::span<VarState* const>(pure_reads.begin(), pure_reads.size()),
       std::span<VarState* const>(ws.begin(), ws.size()));
  if (sdev != nullptr) n->stream = choose_stream(n, options.stream);
  record(n);
  if (profiling) {
    profiler::detail::record(
        profiler::detail::FrontendEvent{"record", std::string(name), {}, t0, profiler::detail::now_ns()});
  }
  after_push(n, lk);
}

// Deletion needs no node: the var is refused from now on, and its slot is
// recycled at once when no access is pending, otherwise when the last
// pending access completes (see complete()).
void EngineImpl::delete_var(Var v) {
  Lock lk(mu_);
  VarState* s = checked_var(v, "delete_var");
  s->alive = false;
  if (var_idle(s)) {
    free_var(s);
  } else {
    s->dying = true;
  }
}

bool EngineImpl::var_idle(const VarState* s) const {
  if (s->last_writer != nullptr && s->last_writer->state != NodeState::kDone) return false;
  for (const Node* r : s->readers) {
    if (r->state != NodeState::kDone) return false;
  }
  return true;
}

void EngineImpl::wait_to_read(Var v, const CallSite& site) {
  check_not_in_op("wait_to_read");
  BlockingScope scope(*this, site);
  Lock lk(mu_);
  VarState* s = checked_var(v, "wait_to_read");
  Node* t = s->last_writer;
  if (t == nullptr) return;
  ++t->refs;
  wait_node(t, lk);
  ErrorPtr e = t->error;
  release(t);
  flush_spawns(lk);
  if (e) {
    e->reported = true;
    lk.unlock();
    throw_op_error(*e, 0);
  }
}

void EngineImpl::wait_to_write(Var v, const CallSite& site) {
  check_not_in_op("wait_to_write");
  BlockingScope scope(*this, site);
  Lock lk(mu_);
  VarState* s = checked_var(v, "wait_to_write");
  Node* writer = s->last_writer;
  std::vector<Node*> targets;
  if (writer != nullptr) targets.push_back(writer);
  for (Node* r : s->readers) {
    if (r->state != NodeState::kDone) targets.push_back(r);
  }
  for (Node* t : targets) ++t->refs;
  for (Node* t : targets) wait_node(t, lk);
  ErrorPtr e = writer != nullptr ? writer->error : nullptr;
  for (Node* t : targets) release(t);
  flush_spawns(lk);
  if (e) {
    e->reported = true;
    lk.unlock();
    throw_op_error(*e, 0);
  }
}

void EngineImpl::waitall(const CallSite& site) {
  check_not_in_op("waitall");
  BlockingScope scope(*this, site);
  wait_all_recorded(/*watchdog=*/true);
}

// waitall without the blocking-call accounting: also used by the destructor
// and at exit, which must run what was recorded whatever sync debug says.
void EngineImpl::wait_all_recorded(bool watchdog) {
  Lock lk(mu_);
  Waiter& w = register_waiter(WaitMode::kAll);
  w.all_before = next_seq_;
  while (unreq_head_ != nullptr) request(unreq_head_);
  const bool finished =
      help_until(w, lk, [&] { return live_head_ == nullptr || live_head_->seq >= w.all_before; },
                 watchdog);
  unregister_waiter(w);
  if (!finished) {
    std::string report = describe_pending(nullptr);
    lk.unlock();
    std::cerr << report;
    throw WatchdogTimeout(report);
  }
  flush_spawns(lk);
  // Report the oldest failure no wait has reported (deterministic across policies).
  ErrorPtr first;
  std::size_t count = 0;
  for (ErrorPtr& e : unreported_) {
    if (e->reported) continue;
    ++count;
    if (!first || e->seq < first->seq) first = e;
    e->reported = true;
  }
  unreported_.clear();
  if (first) {
    lk.unlock();
    throw_op_error(*first, count - 1);
  }
}

EngineStats EngineImpl::stats() const {
  std::lock_guard<GraphMutex> lk(mu_);
  EngineStats s = stats_;
  s.unfinished = live_count_;
  for (std::size_t k = 0; k < kBlockingCallKinds; ++k) {
    s.blocking_calls[k] = blocking_calls_[k].load(std::memory_order_relaxed);
    s.blocking_waits += s.blocking_calls[k];
  }
  s.blocked_ns = blocked_ns_.load(std::memory_order_relaxed);
  return s;
}

std::vector<PendingNode> EngineImpl::pending_nodes() const {
  std::lock_guard<GraphMutex> lk(mu_);
  std::vector<PendingNode> out;
  out.reserve(live_count_);
  for (const Node* n = live_head_; n != nullptr; n = n->live_next) {
    PendingNode p;
    p.id = n->seq;
    p.name = n->name;
    p.device = n->device;
    p.priority = n->priority;
    p.requested = n->requested;
    for (const Node* q : n->preds) {
      if (q->state != NodeState::kDone) p.preds.push_back(q->seq);
    }
    for (const VarState* v : n->reads) p.reads.push_back(v->handle);
    for (const VarState* v : n->writes) p.writes.push_back(v->handle);
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace detail

// ---- Engine: the public facade ---------------------------------------------

Engine::Engine(EngineOptions options) : impl_(std::make_unique<detail::EngineImpl>(options)) {}
Engine::~Engine() = default;

// The process-wide engine is never destroyed: arrays in static storage may
// outlive any static engine and still delete their vars at exit. What was
// recorded still runs: an exit handler waits for it.
Engine& Engine::get() {
  static Engine* engine = [] {
    auto* e = new Engine();
    std::atexit([] {
      try {
        Engine::get().impl_->wait_all_recorded(/*watchdog=*/false);
      } catch (const std::exception& ex) {
        std::cerr << "lazydag: error no wait collected before exit: " << ex.what() << '\n';
      }
    });
    return e;
  }();
  return *engine;
}

Var Engine::new_var() { return impl_->new_var(); }
void Engine::delete_var(Var v) { impl_->delete_var(v); }
void Engine::push(Function fn, std::span<const Var> reads, std::span<const Var> writes,
                  const PushOptions& options) {
  impl_->push(std::move(fn), reads, writes, options);
}
void Engine::wait_to_read(Var v, const CallSite& site) { impl_->wait_to_read(v, site); }
void Engine::wait_to_write(Var v, const CallSite& site) { impl_->wait_to_write(v, site); }
void Engine::waitall(const CallSite& site) { impl_->waitall(site); }
Policy Engine::policy() const noexcept { return impl_->options_.policy; }
int Engine::num_threads() const noexcept { return impl_->num_threads_; }
std::size_t Engine::max_pending() const noexcept { return impl_->options_.max_pending; }
EngineStats Engine::stats() const { return impl_->stats(); }
std::vector<PendingNode> Engine::pending_nodes() const { return impl_->pending_nodes(); }
StreamDevice& Engine::stream_device(Device d) { return impl_->stream_device(d); }

}  // namespace lazydag::engine
