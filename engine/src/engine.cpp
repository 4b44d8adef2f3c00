// The engine's public facade: names, options from the environment,
// construction and teardown, and Engine's member functions forwarding to
// EngineImpl (its parts: record.cpp, schedule.cpp, streams.cpp, waits.cpp;
// the devices and workers in device_table.* and workers.*).
#include <lazydag/engine/engine.hpp>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <charconv>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <mutex>
#include <sstream>
#include <thread>

#include <unistd.h>

#include "engine_impl.hpp"

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
  return "unknown-kind-" + std::to_string(static_cast<int>(kind)) + "(" + std::to_string(id) + ")";
}

namespace {

constexpr int kMaxThreads = 1024;
constexpr std::size_t kMaxCount = std::numeric_limits<std::uint32_t>::max();

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

namespace {
std::atomic<void (*)()> g_stall_enter{nullptr};
std::atomic<void (*)()> g_stall_leave{nullptr};
}  // namespace

void set_stall_hooks(StallHooks hooks) noexcept {
  g_stall_enter.store(hooks.enter, std::memory_order_release);
  g_stall_leave.store(hooks.leave, std::memory_order_release);
}

StallHooks detail::stall_hooks() noexcept {
  return {g_stall_enter.load(std::memory_order_acquire), g_stall_leave.load(std::memory_order_acquire)};
}

std::size_t default_max_pending_bytes() noexcept {
  static const std::size_t bytes = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    if (l2 <= 0) return std::size_t{1} << 20;
    return std::clamp<std::size_t>(static_cast<std::size_t>(l2), std::size_t{256} << 10, std::size_t{8} << 20);
  }();
  return bytes;
}

EngineOptions EngineOptions::from_env() {
  EngineOptions o;
  if (const char* p = std::getenv("LAZYDAG_ENGINE"); p != nullptr && *p != '\0') {
    o.policy = parse_policy(p);
  }
  o.num_threads = static_cast<int>(env_size("LAZYDAG_NUM_THREADS", 0, kMaxThreads));
  if (const char* w = std::getenv("LAZYDAG_WATCHDOG"); w != nullptr && *w != '\0') {
    char* end = nullptr;
    const double v = std::strtod(w, &end);
    if (end == w || *end != '\0' || !(v >= 0)) {
      throw InvalidArgument(std::string("LAZYDAG_WATCHDOG='") + w + "' is not a number of seconds >= 0");
    }
    o.watchdog_seconds = v;
  }
  o.max_pending = env_size("LAZYDAG_MAX_PENDING", o.max_pending, kMaxCount);
  o.max_in_flight = env_size("LAZYDAG_MAX_IN_FLIGHT", o.max_in_flight, kMaxCount);
  o.inline_bytes = env_size("LAZYDAG_INLINE_BYTES", o.inline_bytes, kMaxCount);
  o.max_pending_bytes = env_size("LAZYDAG_MAX_PENDING_BYTES", o.max_pending_bytes, std::size_t{1} << 50);
  if (o.max_in_flight == 0) throw InvalidArgument("LAZYDAG_MAX_IN_FLIGHT must be >= 1");
  return o;
}

namespace detail {
int default_compute_streams() {
  return static_cast<int>(std::max<std::size_t>(1, env_size("LAZYDAG_STREAMS", 2, 16)));
}

unsigned sim_delay_us() { return static_cast<unsigned>(env_size("LAZYDAG_SIM_DELAY_US", 0, 1000000)); }

namespace {
std::atomic<std::uint64_t> g_engine_ids{0};
}  // namespace

namespace {

// Every field in range, or InvalidArgument naming it and its range.
EngineOptions validated(EngineOptions o) {
  auto refuse = [](const std::string& field, const std::string& value, const std::string& range) {
    throw InvalidArgument("EngineOptions::" + field + " = " + value + " is out of range (" + range + ")");
  };
  if (o.policy != Policy::kLazy && o.policy != Policy::kEager && o.policy != Policy::kNaive) {
    refuse("policy", std::to_string(static_cast<int>(o.policy)), "lazy, eager or naive");
  }
  if (o.num_threads < 0 || o.num_threads > kMaxThreads) {
    refuse("num_threads", std::to_string(o.num_threads),
           "0 for the hardware's concurrency, or 1.." + std::to_string(kMaxThreads));
  }
  if (o.max_pending > kMaxCount) {
    refuse("max_pending", std::to_string(o.max_pending), "0 for unbounded, or 1.." + std::to_string(kMaxCount));
  }
  if (o.max_in_flight == 0 || o.max_in_flight > kMaxCount) {
    refuse("max_in_flight", std::to_string(o.max_in_flight), "1.." + std::to_string(kMaxCount));
  }
  if (!(o.watchdog_seconds >= 0)) {  // also NaN
    std::ostringstream v;
    v << o.watchdog_seconds;
    refuse("watchdog_seconds", v.str(), "0 for off, or a number of seconds > 0; infinity never fires");
  }
  return o;
}

}  // namespace

EngineImpl::EngineImpl(EngineOptions options)
    : options_(validated(options)),
      num_threads_(options.policy == Policy::kNaive ? 0
                   : options.num_threads > 0
                       ? options.num_threads
                       : static_cast<int>(std::max(1U, std::thread::hardware_concurrency()))),
      profile_id_(g_engine_ids.fetch_add(1) + 1) {
  // Every ready node can sit in the queue at once: with the window, at most
  // about 2 x max_pending are unfinished, so the ring never grows after this.
  if (options.max_pending != 0) queue_.reserve(std::min<std::size_t>(2 * options.max_pending + 64, std::size_t{1} << 16));
}

// Runs what was recorded, and what running it and destroying its buried
// captures records in turn, until nothing is left. Reports on stderr.
void EngineImpl::run_everything(const char* when) noexcept {
  for (;;) {
    try {
      wait_all_recorded(/*watchdog=*/false);
    } catch (const std::exception& e) {
      std::cerr << "lazydag: " << when << " with an error no wait collected: " << e.what() << '\n';
    }
    drain_graveyard();
    if (graveyard_.empty() && counts_.unfinished() == 0) break;
  }
}

EngineImpl::~EngineImpl() {
  run_everything("engine destroyed");
  vars_.sweep();  // every node is done: frees the deleted vars' slots and node refs
  workers_.join();
  // Joins the emulated executors (a completion may still be finishing).
  devices_.close();
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
    std::atexit(run_at_exit);
    return e;
  }();
  return *engine;
}

namespace {
std::atomic<bool> g_exiting{false};
}  // namespace

void Engine::run_at_exit() noexcept {
  g_exiting.store(true, std::memory_order_release);
  Engine::get().impl_->run_everything("exiting");
}

bool Engine::exiting() noexcept { return g_exiting.load(std::memory_order_acquire); }

bool Engine::in_node() noexcept { return detail::tls_running_engine != nullptr; }

void Engine::rearm_exit_handler() noexcept {
  (void)get();
  std::atexit(run_at_exit);
}

Var Engine::new_var() { return impl_->new_var(); }
void Engine::delete_var(Var v) { (void)impl_->delete_var(v); }
Var Engine::new_owned_var(const char* owner) {
  if (owner == nullptr || *owner == '\0') throw InvalidArgument("new_owned_var: the owner needs a name");
  return impl_->new_var(owner);
}
void Engine::delete_owned_var(Var v) { (void)impl_->delete_var(v, /*by_owner=*/true); }
bool Engine::delete_owned_var_and_free(Var v, Device device, void* p, std::size_t bytes) {
  return impl_->delete_var_and_free(v, device, p, bytes);
}
void Engine::push(Function fn, std::span<const Var> reads, std::span<const Var> writes,
                  const PushOptions& options) {
  impl_->push(std::move(fn), reads, writes, options);
}
void Engine::push_keeping(Function borrowed, Function (*keep)(void*), void* keep_arg, std::span<const Var> reads,
                          std::span<const Var> writes, const PushOptions& options) {
  impl_->push(std::move(borrowed), reads, writes, options, false, detail::Keep{keep, keep_arg});
}
void Engine::push_async(AsyncFunction fn, std::span<const Var> reads, std::span<const Var> writes,
                        const PushOptions& options) {
  impl_->push_async(std::move(fn), reads, writes, options);
}

Completion& Completion::operator=(Completion&& o) noexcept {
  if (this != &o) {
    if (node_ != nullptr) (*this)(std::make_exception_ptr(Error("an asynchronous op's Completion was dropped")));
    engine_ = o.engine_;
    node_ = o.node_;
    o.node_ = nullptr;
  }
  return *this;
}
Completion::~Completion() {
  if (node_ != nullptr) (*this)(std::make_exception_ptr(Error("an asynchronous op's Completion was dropped")));
}
void Completion::operator()(std::exception_ptr error) noexcept {
  detail::Node* n = node_;
  if (n == nullptr) return;
  node_ = nullptr;
  engine_->async_done(n, std::move(error));
}

void Engine::wait_to_read(Var v, const CallSite& site) { impl_->wait_to_read(v, site); }
void Engine::wait_to_write(Var v, const CallSite& site) { impl_->wait_to_write(v, site); }
void Engine::waitall(const CallSite& site) { impl_->waitall(site); }
Policy Engine::policy() const noexcept { return impl_->options_.policy; }
int Engine::num_threads() const noexcept { return impl_->num_threads_; }
std::size_t Engine::max_pending() const noexcept { return impl_->options_.max_pending; }
std::size_t Engine::inline_bytes() const noexcept { return impl_->options_.inline_bytes; }
std::size_t Engine::max_pending_bytes() const noexcept { return impl_->options_.max_pending_bytes; }
EngineStats Engine::stats() const { return impl_->stats(); }
std::vector<PendingNode> Engine::pending_nodes() const { return impl_->pending_nodes(); }
StreamDevice& Engine::stream_device(Device d) { return impl_->stream_device(d); }

}  // namespace lazydag::engine
