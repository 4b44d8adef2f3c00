// The built-in profiler: Chrome trace-event JSON (open it in Perfetto or
// chrome://tracing) with one event per node on a track per worker, the
// frontend's record calls and blocking waits, and flow arrows from producer
// to consumer. LAZYDAG_PROFILE=trace.json profiles a whole run.
#pragma once

#include <cstddef>
#include <string>

namespace lazydag::profiler {

/// Starts recording events from every engine and thread. Thread-safe.
void start();
/// Stops recording; what was recorded stays until dump(). Thread-safe.
void stop();
/// True between start() and stop().
[[nodiscard]] bool running() noexcept;
/// Writes every event recorded so far as Chrome trace JSON and forgets them.
/// Blocks on nothing but a short per-thread lock. Throws lazydag::Error when
/// the file cannot be written.
void dump(const std::string& path);
/// Events buffered and not yet dumped.
[[nodiscard]] std::size_t event_count();

}  // namespace lazydag::profiler
