// Sync debugging: the registry of blocking call sites, the once-per-site
// warning and the summary printed at exit.
#include <lazydag/engine/sync_debug.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>
#include <tuple>

namespace lazydag::engine {

std::string_view to_string(BlockingCall c) noexcept {
  constexpr std::string_view names[] = {"wait_to_read", "wait_to_write", "waitall",
                                        "item",         "to_vector",     "print"};
  return names[static_cast<int>(c)];
}

SyncDebug parse_sync_debug(std::string_view name) {
  if (name == "off" || name.empty()) return SyncDebug::kOff;
  if (name == "warn") return SyncDebug::kWarn;
  if (name == "error") return SyncDebug::kError;
  throw InvalidArgument("unknown sync-debug mode '" + std::string(name) +
                        "' (expected off, warn or error)");
}

namespace {

SyncDebug initial_mode() {
  const char* s = std::getenv("LAZYDAG_SYNC_DEBUG");
  if (s == nullptr) return SyncDebug::kOff;
  try {
    return parse_sync_debug(s);
  } catch (const Error& e) {
    std::cerr << "lazydag: " << e.what() << "; sync debugging stays off\n";
    return SyncDebug::kOff;
  }
}

std::atomic<SyncDebug>& mode() {
  static std::atomic<SyncDebug> m{initial_mode()};
  return m;
}

using Key = std::tuple<std::string, std::uint32_t, std::string, BlockingCall>;

struct Registry {
  std::mutex mu;
  std::map<Key, BlockingSite> sites;
  bool summary_registered = false;
};

// Never destroyed: blocking calls may happen during static destruction.
Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

thread_local const ForeignCallSite* tls_foreign_site = nullptr;

// Where a blocking call was made: the innermost ForeignCallSite of this
// thread, else the C++ source location.
struct Where {
  std::string file;
  std::uint32_t line;
  std::string function;
};
Where where_of(const CallSite& site) {
  if (const ForeignCallSite* f = tls_foreign_site) return {f->file(), f->line(), f->function()};
  return {site.where.file_name(), site.where.line(), site.where.function_name()};
}

Key key_of(const CallSite& site) {
  Where w = where_of(site);
  return {std::move(w.file), w.line, std::move(w.function), site.kind};
}

std::string describe(const CallSite& site) {
  const Where w = where_of(site);
  std::ostringstream os;
  os << to_string(site.kind) << "() at " << w.file << ':' << w.line << " in " << w.function;
  return os.str();
}

}  // namespace

ForeignCallSite::ForeignCallSite(std::string file, std::uint32_t line, std::string function)
    : file_(std::move(file)), line_(line), function_(std::move(function)), outer_(tls_foreign_site) {
  tls_foreign_site = this;
}
ForeignCallSite::~ForeignCallSite() { tls_foreign_site = outer_; }

void set_sync_debug(SyncDebug m) noexcept { mode().store(m, std::memory_order_relaxed); }
SyncDebug sync_debug() noexcept { return mode().load(std::memory_order_relaxed); }

std::vector<BlockingSite> blocking_sites() {
  Registry& r = registry();
  std::vector<BlockingSite> out;
  {
    std::lock_guard lk(r.mu);
    for (const auto& [k, v] : r.sites) out.push_back(v);
  }
  std::sort(out.begin(), out.end(), [](const BlockingSite& a, const BlockingSite& b) {
    return a.blocked_seconds > b.blocked_seconds;
  });
  return out;
}

void clear_blocking_sites() {
  Registry& r = registry();
  std::lock_guard lk(r.mu);
  r.sites.clear();
}

std::string blocking_report() {
  std::ostringstream os;
  auto sites = blocking_sites();
  os << "lazydag sync-debug: " << sites.size() << " blocking call site(s)\n";
  for (const auto& s : sites) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%10.6f s", s.blocked_seconds);
    os << "  " << buf << "  " << s.count << " x " << to_string(s.kind) << "() at " << s.file << ':'
       << s.line << " in " << s.function << '\n';
  }
  return os.str();
}

namespace detail {

void sync_debug_enter(const CallSite& site) {
  const SyncDebug m = sync_debug();
  if (m == SyncDebug::kOff) return;
  if (m == SyncDebug::kError) {
    throw BlockingCallError("blocking call " + describe(site) +
                            " refused (sync debug is 'error'): keep values on the device and "
                            "read them rarely, or wait outside the hot loop");
  }
  Registry& r = registry();
  bool first = false;
  {
    std::lock_guard lk(r.mu);
    auto [it, inserted] = r.sites.try_emplace(key_of(site));
    if (inserted) {
      Where w = where_of(site);
      it->second = BlockingSite{std::move(w.file), w.line, std::move(w.function), site.kind, 0, 0.0};
      first = true;
    }
    ++it->second.count;
    if (!r.summary_registered) {
      r.summary_registered = true;
      std::atexit([] {
        if (!blocking_sites().empty()) std::cerr << blocking_report();
      });
    }
  }
  if (first) std::cerr << "lazydag sync-debug: blocking " << describe(site) << '\n';
}

void sync_debug_exit(const CallSite& site, std::uint64_t ns) {
  if (sync_debug() == SyncDebug::kOff) return;
  Registry& r = registry();
  std::lock_guard lk(r.mu);
  auto it = r.sites.find(key_of(site));
  if (it != r.sites.end()) it->second.blocked_seconds += static_cast<double>(ns) * 1e-9;
}

}  // namespace detail
}  // namespace lazydag::engine
