// Sync debugging: every blocking call a frontend makes (wait_to_read, item,
// to_vector, printing, waitall) attributed to its source location, reported
// once per site (warn) or refused (error). Process-wide.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <lazydag/engine/engine.hpp>

namespace lazydag::engine {

enum class SyncDebug : std::uint8_t {
  kOff,    ///< count only (EngineStats)
  kWarn,   ///< report each call site once on stderr, and a summary at exit
  kError,  ///< throw BlockingCallError from the blocking call, before it blocks
};

/// "off", "warn", "error"; throws InvalidArgument on anything else.
[[nodiscard]] SyncDebug parse_sync_debug(std::string_view name);
/// Sets the mode; the initial one comes from LAZYDAG_SYNC_DEBUG. Thread-safe.
void set_sync_debug(SyncDebug mode) noexcept;
[[nodiscard]] SyncDebug sync_debug() noexcept;

/// One call site seen while sync debugging was on.
struct BlockingSite {
  std::string file;
  std::uint32_t line = 0;
  std::string function;
  BlockingCall kind = BlockingCall::kWaitToRead;
  std::uint64_t count = 0;
  double blocked_seconds = 0;
};

/// Every site seen while the mode was warn or error, most blocked time first.
[[nodiscard]] std::vector<BlockingSite> blocking_sites();
/// Forgets the sites (the exit summary then reports only later ones).
void clear_blocking_sites();
/// The summary printed at exit in warn mode.
[[nodiscard]] std::string blocking_report();

/// A call site named by a frontend in another language (the Python module
/// names the Python file, line and function): while one is in scope on a
/// thread, that thread's blocking calls are attributed to it instead of to
/// their C++ source location. Scopes nest; the innermost wins.
class ForeignCallSite {
 public:
  ForeignCallSite(std::string file, std::uint32_t line, std::string function);
  ~ForeignCallSite();
  ForeignCallSite(const ForeignCallSite&) = delete;
  ForeignCallSite& operator=(const ForeignCallSite&) = delete;

  [[nodiscard]] const std::string& file() const noexcept { return file_; }
  [[nodiscard]] std::uint32_t line() const noexcept { return line_; }
  [[nodiscard]] const std::string& function() const noexcept { return function_; }

 private:
  std::string file_;
  std::uint32_t line_;
  std::string function_;
  const ForeignCallSite* outer_;
};

namespace detail {
/// Called by the engine's waits: throws BlockingCallError in error mode,
/// registers (and in warn mode reports once) the site otherwise.
void sync_debug_enter(const CallSite& site);
/// Adds the time a call at `site` blocked.
void sync_debug_exit(const CallSite& site, std::uint64_t ns);
}  // namespace detail

}  // namespace lazydag::engine
