// Per-thread slots: a small process-wide number for each thread that
// records or completes nodes, so pools can keep a cache per thread in a
// fixed array (no thread_local keyed by engine, nothing to unregister when
// an engine goes away). A thread holds its slot until it exits; the slot,
// with whatever its caches hold, then passes to a later thread.
#pragma once

namespace lazydag::engine::detail {

inline constexpr int kThreadSlots = 64;

/// The calling thread's slot in [0, kThreadSlots), or -1: all taken when it
/// first asked (it never gets one then), or the thread is exiting (its
/// slot is given back). Lock-free after the first call.
int thread_slot() noexcept;

}  // namespace lazydag::engine::detail
