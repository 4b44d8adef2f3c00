// Per-thread slots: a small process-wide number for each thread that
// records or completes nodes, so pools can keep a cache per thread in a
// fixed array (no thread_local keyed by engine, nothing to unregister when
// an engine goes away). A thread holds its slot until it exits; the slot,
// with whatever its caches hold, then passes to a later thread.
#pragma once

namespace lazydag::engine::detail {

inline constexpr int kThreadSlots = 64;

// The calling thread's slot; -1: not asked yet; -2: none (all taken when
// it first asked, or the thread is exiting). Constant-initialised and
// trivially destructible: read inline, with no TLS wrapper call, on every
// allocation, release and count, and readable by thread_local destructors.
extern constinit thread_local int t_thread_slot;

/// First call on a thread: takes a free slot (-1 when none).
int take_thread_slot() noexcept;

/// The calling thread's slot in [0, kThreadSlots), or -1: all taken when it
/// first asked (it never gets one then), or the thread is exiting (its
/// slot is given back). One thread-local load after the first call.
inline int thread_slot() noexcept {
  const int s = t_thread_slot;
  if (s >= 0) return s;
  return s == -2 ? -1 : take_thread_slot();
}

}  // namespace lazydag::engine::detail
