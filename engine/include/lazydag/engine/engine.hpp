// The engine's public API: variables, recorded nodes, waits and policies.
// No TBB or CUDA header is included here; the scheduler lives in engine/src.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <initializer_list>
#include <memory>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <lazydag/engine/error.hpp>
#include <lazydag/engine/function.hpp>

namespace lazydag::engine {

/// When recorded nodes run. Results never depend on the policy; only timing does.
enum class Policy : std::uint8_t {
  kLazy,   ///< run only what a wait needs (plus the pending window's overflow)
  kEager,  ///< dispatch each node as soon as its inputs are ready (the default)
  kNaive,  ///< run each node synchronously inside push(): the reference
};

/// "lazy", "eager" or "naive".
[[nodiscard]] std::string_view to_string(Policy p) noexcept;
/// Parses a policy name; throws InvalidArgument on anything else.
[[nodiscard]] Policy parse_policy(std::string_view name);

/// Kinds of device a node can run on. The CPU runs nodes on the engine's
/// workers; the others are stream devices (see stream.hpp): `kSim` emulates
/// a GPU on the host (a FIFO executor per stream, memory of its own), `kGpu`
/// is a CUDA device.
enum class DeviceKind : std::uint8_t { kCpu, kSim, kGpu };

/// Kinds of stream a node on a stream device asks for.
enum class StreamKind : std::uint8_t {
  kCompute,  ///< chosen by the scheduler among the compute streams
  kCopyIn,   ///< the device's host->device (and peer-in) copy stream
  kCopyOut,  ///< the device's device->host copy stream
};

/// A device: a kind and an ordinal.
struct Device {
  DeviceKind kind = DeviceKind::kCpu;
  int id = 0;
  friend bool operator==(const Device&, const Device&) = default;
  /// "cpu(0)", "sim(1)", "gpu(0)".
  [[nodiscard]] std::string str() const;
  /// True for the devices whose nodes run in stream order (sim, gpu).
  [[nodiscard]] bool is_stream_device() const noexcept { return kind != DeviceKind::kCpu; }
};

class StreamDevice;

/// A handle to an engine variable. Plain value; the engine checks it on
/// every use (a stale or foreign handle is an InvalidArgument, never UB).
struct Var {
  std::uint32_t index = 0;
  std::uint32_t generation = 0;  ///< 0 only in the default (invalid) handle
  std::uint32_t engine = 0;      ///< the engine that made it (its id, never 0)
  [[nodiscard]] bool valid() const noexcept { return generation != 0; }
  friend bool operator==(const Var&, const Var&) = default;
};

/// What a node's function is told when it runs.
struct RunContext {
  Device device;
  void* stream = nullptr;  ///< the stream handle on stream devices; null on the CPU
  int worker_index = -1;   ///< CPU engine worker running the node; -1 elsewhere
  int stream_index = -1;   ///< the node's stream on a stream device; -1 on the CPU
  StreamDevice* stream_device = nullptr;  ///< the node's stream device; null on the CPU
  /// Nodes pushed with PushOptions::run_on_failed_input: why an input
  /// failed (the node runs anyway, and its writes fail with this error
  /// unless it is an async node, whose Completion decides); null otherwise.
  std::exception_ptr failed_input;
};

/// Per-node options for push().
struct PushOptions {
  Device device{};
  int priority = 0;       ///< among ready nodes, higher starts first
  std::string_view name;  ///< shown in errors, graphs and traces ("op" if empty)
  /// Stream devices only: which stream. Compute nodes reuse the stream of
  /// their latest unfinished producer on the same device, others are spread
  /// round-robin over the compute streams.
  StreamKind stream = StreamKind::kCompute;
  /// Stream devices only: device memory the node brings into flight (counted
  /// against EngineOptions::max_in_flight_bytes).
  std::size_t bytes = 0;
  /// CPU nodes: run even when an input failed (RunContext::failed_input says
  /// why) instead of being skipped. For work other processes take part in,
  /// such as a collective, which must be issued on every rank.
  bool run_on_failed_input = false;
  /// Nodes that compute several results from different inputs (a fused
  /// group of elementwise ops): for each write, in order, the reads it is
  /// computed from (bit k: reads[k]). A failed read then fails only the
  /// writes computed from it, each with that read's error, as separate ops
  /// would; the node still runs while any write is computable. Empty: a
  /// failed read fails every write (the node is skipped). When given: one
  /// mask per write, at most 64 reads, no var twice, reads and writes
  /// disjoint, not push_async; InvalidArgument otherwise.
  std::span<const std::uint64_t> write_sources{};
  /// CPU nodes: the bytes the node reads and writes, a hint of its cost
  /// (0: unknown). Under the eager policy a node at most
  /// EngineOptions::inline_bytes large that is ready when recorded runs on
  /// the recording thread before push returns: handing it to a worker
  /// would cost more than running it. Its failure is reported by waits as
  /// any node's; push still never throws for it.
  std::size_t cost_bytes = 0;
};

/// EngineOptions::max_pending_bytes' default: one core's L2 cache as the C
/// library reports it (sysconf), kept within 256 KiB..8 MiB; 1 MiB when
/// it reports none. docs/architecture.md, "The window in bytes", gives the
/// measurement behind it.
[[nodiscard]] std::size_t default_max_pending_bytes() noexcept;

/// Engine construction options. from_env() reads LAZYDAG_ENGINE
/// (lazy|eager|naive), LAZYDAG_NUM_THREADS, LAZYDAG_MAX_PENDING,
/// LAZYDAG_MAX_PENDING_BYTES, LAZYDAG_INLINE_BYTES, LAZYDAG_MAX_IN_FLIGHT
/// and LAZYDAG_WATCHDOG (seconds).
struct EngineOptions {
  Policy policy = Policy::kEager;
  /// CPU workers; 0 = the hardware's concurrency (measured against one
  /// fewer on 2 cores: docs/benchmarks.md, "How many workers"; a waiting
  /// frontend thread helps, idle workers leave their core).
  int num_threads = 0;
  /// Recorded nodes kept unstarted before the oldest is started (lazy: per
  /// recording thread); the engine also stalls a frontend that has twice
  /// this many nodes unfinished. 0 = unbounded.
  std::size_t max_pending = 16384;
  /// Eager: the PushOptions::cost_bytes of unfinished nodes a frontend may
  /// run ahead by; past twice this, with more than one node unfinished, it
  /// helps until it is down to this or to one node (one node is always let
  /// through, however large: push returns before a big op is computed).
  /// LAZYDAG_MAX_PENDING_BYTES; 0 = unbounded. Recorded work whose buffers
  /// outgrow the caches is slower than waiting for each op.
  std::size_t max_pending_bytes = default_max_pending_bytes();
  /// Debugging aid: a wait that blocks longer than this many seconds fails
  /// with WatchdogTimeout listing the pending nodes it waits for, instead of
  /// hanging. 0 = off; 1e9 or more (or infinity) never fires. From
  /// LAZYDAG_WATCHDOG.
  double watchdog_seconds = 0;
  /// Run-ahead bound per stream device: nodes launched and not yet complete
  /// (LAZYDAG_MAX_IN_FLIGHT). A ready node waits while its device is full.
  std::size_t max_in_flight = 1024;
  /// ... and the PushOptions::bytes of those nodes (one node is always let
  /// through, however large).
  std::size_t max_in_flight_bytes = std::size_t{4} << 30;
  /// Eager: CPU nodes whose PushOptions::cost_bytes is at most this, ready
  /// when recorded, run on the recording thread (LAZYDAG_INLINE_BYTES;
  /// 0 = never). docs/architecture.md gives the measurement behind it.
  std::size_t inline_bytes = std::size_t{128} << 10;

  /// Defaults overridden by the environment; throws InvalidArgument on a
  /// malformed value. (Engine's constructor checks every field: num_threads
  /// in 0..1024, max_pending and max_in_flight up to 2^32 - 1, max_in_flight
  /// >= 1, watchdog_seconds >= 0, a policy of the enumeration.)
  [[nodiscard]] static EngineOptions from_env();
};

/// Called on a recording thread around the window's stall (push helping
/// until the frontend is back within max_pending / max_pending_bytes), the
/// one place where recording blocks: a language binding releases its
/// interpreter lock there (the Python module does). Process-wide; `enter`
/// and `leave` are called in pairs on the stalled thread and must not
/// throw. Null functions: nothing is called.
struct StallHooks {
  void (*enter)() = nullptr;
  void (*leave)() = nullptr;
};
void set_stall_hooks(StallHooks hooks) noexcept;

/// The kinds of blocking call a frontend makes. The engine's own waits are
/// the first three; the NDArray blockers name themselves.
enum class BlockingCall : std::uint8_t { kWaitToRead, kWaitToWrite, kWaitall, kItem, kToVector, kPrint };
inline constexpr std::size_t kBlockingCallKinds = 6;
/// "wait_to_read", "item", ...
[[nodiscard]] std::string_view to_string(BlockingCall c) noexcept;

/// A blocking call and where in the program it was made.
struct CallSite {
  BlockingCall kind = BlockingCall::kWaitToRead;
  std::source_location where;
};

/// Counters since construction (consistent snapshot).
struct EngineStats {
  std::uint64_t nodes_recorded = 0;
  std::uint64_t nodes_run = 0;      ///< functions that ran (and returned or threw); counted as each node completes: exact once waitall() returns, while a node a wait_to_read() just saw done may be counted a moment later
  std::uint64_t nodes_failed = 0;   ///< functions that threw
  std::uint64_t nodes_skipped = 0;  ///< not run because an input was poisoned
  std::uint64_t nodes_launched = 0;  ///< nodes enqueued on a stream device
  std::uint64_t in_flight_stalls = 0;  ///< ready stream nodes held back by the run-ahead bound
  std::size_t unfinished = 0;       ///< recorded and not yet done
  std::size_t peak_unfinished = 0;  ///< most unfinished, sampled every 64 records of each recording thread and at each window check
  std::uint64_t blocking_waits = 0;  ///< blocking calls of every kind
  /// Blocking calls by kind (index: BlockingCall).
  std::array<std::uint64_t, kBlockingCallKinds> blocking_calls{};
  std::uint64_t blocked_ns = 0;  ///< time frontend threads spent inside blocking calls
};

/// One unfinished node as seen by pending_nodes().
struct PendingNode {
  std::uint64_t id = 0;  ///< unique per engine; larger than its predecessors' ids and than those of the nodes its thread recorded before it
  std::string name;
  Device device;
  int priority = 0;
  bool requested = false;  ///< scheduled to run (false: still lazily recorded)
  std::vector<std::uint64_t> preds;  ///< ids of unfinished predecessors
  std::vector<Var> reads;
  std::vector<Var> writes;
};

namespace detail {
class EngineImpl;
struct Node;
}  // namespace detail

/// Finishes a node recorded by Engine::push_async: the node is done (its
/// writes visible to later nodes and waits) only once this is called, from
/// any thread. Move-only; call it once. One destroyed without being called
/// fails its node ("dropped"), so nothing waits forever on a lost handle.
class Completion {
 public:
  Completion() noexcept = default;
  Completion(Completion&& o) noexcept : engine_(o.engine_), node_(o.node_) { o.node_ = nullptr; }
  Completion& operator=(Completion&& o) noexcept;
  Completion(const Completion&) = delete;
  Completion& operator=(const Completion&) = delete;
  ~Completion();
  /// Marks the node done; with an error, failed (its writes are poisoned
  /// and waits that read them throw OpError naming the node).
  void operator()(std::exception_ptr error = nullptr) noexcept;
  /// Still to be called.
  explicit operator bool() const noexcept { return node_ != nullptr; }

 private:
  friend class detail::EngineImpl;
  Completion(detail::EngineImpl* e, detail::Node* n) noexcept : engine_(e), node_(n) {}
  detail::EngineImpl* engine_ = nullptr;
  detail::Node* node_ = nullptr;
};

/// The function of an asynchronous node: starts the work and returns; the
/// work calls (or a thread it hands `done` to calls) done() when it ends.
/// Leaving `done` in place and returning, or throwing, fails the node. The
/// function object, and so everything it captured, lives until the node
/// completes: the started work may use its captures.
using AsyncFunction = std::function<void(const RunContext&, Completion& done)>;

/// A dependency engine. All member functions are thread-safe and may be
/// called from several frontend threads at once. Waits may not be called
/// from inside a running node (InvalidArgument).
class Engine {
 public:
  /// Starts the workers. Throws InvalidArgument on bad options.
  explicit Engine(EngineOptions options = EngineOptions::from_env());
  /// Blocks until every recorded node has run; errors nobody collected are
  /// reported on stderr (a destructor cannot throw).
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  /// The process-wide engine, created on first use from the environment.
  /// It lives until the process ends; at exit it runs what was recorded.
  [[nodiscard]] static Engine& get();

  /// Registers the process-wide engine's exit handler once more (std::atexit
  /// runs handlers and static destructors in reverse order of
  /// registration). Static objects constructed after the engine, such as a
  /// library's function-local statics made by a node's first call into it,
  /// are otherwise destroyed before the handler runs what is still
  /// recorded, which may call into them. Code that constructs such statics
  /// calls this after constructing them (ops::cpu::prepare_matmul does,
  /// after oneDNN's first call). Each run of the handler runs what was
  /// recorded until then; a library that registers its own handler just
  /// before this one can stop using its statics after the re-registered run.
  static void rearm_exit_handler() noexcept;

  /// True once the exit handler has started running what is still
  /// recorded: libraries that cannot be started during exit (oneDNN's
  /// first call) take another path.
  [[nodiscard]] static bool exiting() noexcept;

  /// True on a thread while it runs a node (of any engine).
  [[nodiscard]] static bool in_node() noexcept;

  /// A new variable. Non-blocking.
  [[nodiscard]] Var new_var();

  /// Records the deletion of `v`: it runs after every earlier access of `v`.
  /// Any later use of `v` throws InvalidArgument. Throws InvalidArgument for
  /// a var that is unknown, deleted, of another engine, or owned (below).
  /// Non-blocking.
  void delete_var(Var v);
  /// A new variable owned by a handle that deletes it itself, such as an
  /// NDArray's storage: delete_var refuses it, naming `owner` (a string
  /// with static storage, e.g. "an NDArray"), so deleting it behind the
  /// owner's back is an error at that call, not a failure later. Non-blocking.
  [[nodiscard]] Var new_owned_var(const char* owner);
  /// delete_var for a var from new_owned_var (what its owner calls).
  void delete_owned_var(Var v);
  /// delete_owned_var for the var of a buffer `p` of `bytes` on the stream
  /// device `device`, which is given back too, without recording a node:
  /// `StreamDevice::deallocate` runs once every access recorded on `v` has
  /// completed on the device, on the thread that completes the last one
  /// (a backend thread, or whichever thread finishes a failed launch), or
  /// in this call when none is pending; waitall returns after it. Returns
  /// false, having done nothing, when an access still pending (a read or a
  /// write) runs on the CPU: the caller then records the free as a node and
  /// calls delete_owned_var. Throws InvalidArgument as delete_var does, or for a
  /// device that is not a stream device. Non-blocking.
  bool delete_owned_var_and_free(Var v, Device device, void* p, std::size_t bytes);

  /// Records one node reading `reads` and writing `writes` (a var in both is
  /// a read-modify-write; duplicates coalesce) and returns without running
  /// it, except under the naive policy, where it runs before push returns.
  /// An exception from `fn` is not thrown here: it poisons `writes` and is
  /// rethrown as OpError by the waits. Throws InvalidArgument (an empty
  /// function, an unknown or deleted var), recording nothing.
  void push(Function fn, std::span<const Var> reads, std::span<const Var> writes,
            const PushOptions& options = {});
  void push(Function fn, std::initializer_list<Var> reads, std::initializer_list<Var> writes,
            const PushOptions& options = {}) {
    push(std::move(fn), std::span<const Var>(reads.begin(), reads.size()),
         std::span<const Var>(writes.begin(), writes.size()), options);
  }

  /// As push, for a node that is often small enough to run on the
  /// recording thread (PushOptions::cost_bytes at most
  /// EngineOptions::inline_bytes, under eager), without making a function
  /// that owns what it uses when it does. push_or_run calls `run` at most
  /// once, only before it returns, when this thread runs the node there: it
  /// may borrow what the caller holds. Otherwise it calls `keep()` once,
  /// before it returns and before the node can start, and the node runs the
  /// Function that returns, which must own what it uses. An exception from
  /// keep() is the node's failure (the waits report it), not thrown here.
  /// Throws InvalidArgument as push does, recording nothing and calling
  /// neither.
  template <class Run, class Keep>
  void push_or_run(Run& run, Keep& keep, std::span<const Var> reads, std::span<const Var> writes,
                   const PushOptions& options = {}) {
    push_keeping(Function([r = &run](const RunContext& c) { (*r)(c); }),
                 [](void* k) -> Function { return (*static_cast<Keep*>(k))(); },
                 const_cast<void*>(static_cast<const void*>(&keep)), reads, writes, options);
  }

  /// As push, for work that ends later than its function returns (a
  /// non-blocking MPI call, an I/O request): `fn` starts it on a CPU worker
  /// and the node is done when the Completion it is given is called. No
  /// worker waits for it meanwhile. CPU devices only (InvalidArgument).
  void push_async(AsyncFunction fn, std::span<const Var> reads, std::span<const Var> writes,
                  const PushOptions& options = {});
  void push_async(AsyncFunction fn, std::initializer_list<Var> reads, std::initializer_list<Var> writes,
                  const PushOptions& options = {}) {
    push_async(std::move(fn), std::span<const Var>(reads.begin(), reads.size()),
               std::span<const Var>(writes.begin(), writes.size()), options);
  }

  /// Blocks until the last write of `v` recorded so far is done, running
  /// only its required subgraph (the calling thread helps). Throws OpError
  /// if that write failed or was skipped, InvalidArgument on a bad var.
  /// The call site is counted and, in sync-debug mode, reported or refused
  /// (BlockingCallError), see sync_debug.hpp.
  void wait_to_read(Var v, std::source_location where = std::source_location::current()) {
    wait_to_read(v, CallSite{BlockingCall::kWaitToRead, where});
  }
  void wait_to_read(Var v, const CallSite& site);

  /// As wait_to_read, and also waits for every read of `v` recorded since.
  void wait_to_write(Var v, std::source_location where = std::source_location::current()) {
    wait_to_write(v, CallSite{BlockingCall::kWaitToWrite, where});
  }
  void wait_to_write(Var v, const CallSite& site);

  /// Blocks until everything recorded before the call is done, helping to
  /// run it. Throws OpError for the first failure no wait has reported yet.
  void waitall(std::source_location where = std::source_location::current()) {
    waitall(CallSite{BlockingCall::kWaitall, where});
  }
  void waitall(const CallSite& site);

  [[nodiscard]] Policy policy() const noexcept;
  [[nodiscard]] int num_threads() const noexcept;
  [[nodiscard]] std::size_t max_pending() const noexcept;
  /// EngineOptions::inline_bytes.
  [[nodiscard]] std::size_t inline_bytes() const noexcept;
  /// EngineOptions::max_pending_bytes.
  [[nodiscard]] std::size_t max_pending_bytes() const noexcept;
  [[nodiscard]] EngineStats stats() const;

  /// The stream device `d`, created on first use (its streams and executors).
  /// Thread-safe. Throws InvalidArgument for the CPU or a bad id, and
  /// BackendUnavailable when the device cannot be used here (no CUDA build,
  /// no driver, no such GPU), saying why.
  [[nodiscard]] StreamDevice& stream_device(Device d);

  /// The unfinished nodes and their dependency edges, in record order.
  [[nodiscard]] std::vector<PendingNode> pending_nodes() const;

 private:
  static void run_at_exit() noexcept;
  void push_keeping(Function borrowed, Function (*keep)(void*), void* keep_arg, std::span<const Var> reads,
                    std::span<const Var> writes, const PushOptions& options);
  std::unique_ptr<detail::EngineImpl> impl_;
};

}  // namespace lazydag::engine
