// PendingCounts: how many recorded nodes (and how many bytes of their
// cost) are unfinished, for waitall and the pending window. Knows nothing
// of nodes or of the engine: the recorder reports each node recorded, the
// completing threads each node completed.
//
// Nodes are counted by the parity of the waitall epoch they were recorded
// in: recorded minus completed. A waitall flips the epoch
// and waits until the old parity's completed count equals its recorded
// count: every node recorded before it is then done. (Nodes recorded after
// a second, concurrent waitall's flip share that parity: the first waitall
// may wait for them too, never too little.)
//
// The counts are sharded by thread slot (thread_slot.hpp): each thread
// adds to its own shard, a line no other thread writes (threads without a
// slot share one more shard), and readers sum the shards in use. One
// counter that every recording and completing thread modified moved its
// cache line between the cores on every node: with two threads recording
// on disjoint vars, the recorded count's add led the profile (22% of the
// samples). A shard's bit in `used_` is set before the shard is first
// written.
//
// Exact sums (unfinished_in and the rest) read the completed counts of the
// shards in use first, then the mask again, then the recorded counts of
// those shards: a completion that is seen was recorded before it (the
// node's publication orders the two), in a shard whose bit was set before
// that, so the mask read after it has the bit and the recorded count read
// after it has the node. The difference is therefore never below the
// number of nodes unfinished when the completed counts were read. Every
// add and load of the counts is seq_cst: a waitall registers itself and
// then sums; a completer adds and then reads whether a waitall is
// registered, and sums only then. Whichever completion comes last in the
// single order of those operations sees every other one.
//
// The recorder checks its windows against its own shard's exact recorded
// count plus copies of the others' recorded counts and of the completed
// sum, reloaded when the estimate passes a limit and every kReload of its
// own records. With one recording thread the estimate is an upper bound;
// with several, each may pass the window by what the others recorded since
// its last reload (at most kReload of theirs, each) before it stalls.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "thread_slot.hpp"

namespace lazydag::engine::detail {

class PendingCounts {
 public:
  /// The window: at most `max_pending` unfinished nodes and
  /// `max_pending_bytes` unfinished bytes of cost (0: unbounded).
  struct Limits {
    std::size_t max_pending = 0;
    std::size_t max_pending_bytes = 0;
  };

  explicit PendingCounts(Limits limits) : limits_(limits) {}
  PendingCounts(const PendingCounts&) = delete;
  PendingCounts& operator=(const PendingCounts&) = delete;

  /// A recorder (any thread): one node recorded in epoch parity `parity`,
  /// costing `bytes`.
  void recorded(std::size_t parity, std::size_t bytes) noexcept {
    Shard& s = mine();
    const std::int64_t n = s.rec[parity].fetch_add(1, std::memory_order_seq_cst) + 1;
    if (bytes != 0) s.rec_bytes.fetch_add(bytes, std::memory_order_seq_cst);
    if (&s == &shards_[kShared]) {
      if (n % kReload == 0) sample_peak(totals());
    } else if (++s.since_reload == kReload) {
      reload(s);  // samples the peak too
    }
  }

  /// Any thread: one node of `parity` completed, costing `bytes`.
  void completed(std::size_t parity, std::size_t bytes) noexcept {
    Shard& s = mine();
    if (bytes != 0) s.done_bytes.fetch_add(bytes, std::memory_order_seq_cst);
    s.done[parity].fetch_add(1, std::memory_order_seq_cst);
  }

  // Exact counts (any thread; see the file comment).
  [[nodiscard]] std::int64_t unfinished_in(std::size_t parity) const noexcept {
    const Totals t = totals();
    return t.rec[parity] - t.done[parity];
  }
  [[nodiscard]] std::size_t unfinished() const noexcept {
    const Totals t = totals();
    return static_cast<std::size_t>(t.rec[0] + t.rec[1] - t.done[0] - t.done[1]);
  }
  [[nodiscard]] std::size_t unfinished_bytes() const noexcept {
    const Totals t = totals();
    return t.rec_bytes - t.done_bytes;
  }

  /// Past `factor` times the window (count, or bytes while more than one
  /// node is unfinished: one node is let through however large, so a push
  /// returns before a big op is computed): a frontend stalls. Exact; any
  /// thread.
  [[nodiscard]] bool over_window(std::size_t factor) const noexcept {
    const Totals t = totals();
    return past(static_cast<std::size_t>(t.rec[0] + t.rec[1] - t.done[0] - t.done[1]),
                t.rec_bytes - t.done_bytes, factor);
  }

  /// The same for the unfinished nodes less those `less()` counts (read
  /// after the exact counts), at least 0.
  template <class Less>
  [[nodiscard]] bool over_window_less(std::size_t factor, Less&& less) const noexcept {
    const Totals t = totals();
    const std::int64_t live = t.rec[0] + t.rec[1] - t.done[0] - t.done[1] - static_cast<std::int64_t>(less());
    return past(static_cast<std::size_t>(std::max<std::int64_t>(live, 0)), t.rec_bytes - t.done_bytes, factor);
  }

  /// The same from the recording thread's estimate (see the file comment):
  /// reloads it only when it is past the window.
  bool recorder_over_window(std::size_t factor) noexcept {
    Shard& s = mine();
    if (&s == &shards_[kShared]) return over_window(factor);  // the shared shard keeps no copies
    auto over = [&] {
      const std::int64_t own = s.rec[0].load(std::memory_order_relaxed) + s.rec[1].load(std::memory_order_relaxed);
      const std::size_t own_bytes = s.rec_bytes.load(std::memory_order_relaxed);
      return past(static_cast<std::size_t>(own + s.seen_others - s.seen_done),
                  own_bytes + s.seen_others_bytes - s.seen_done_bytes, factor);
    };
    if (!over()) return false;
    reload(s);
    return over();
  }

  // Statistics.
  [[nodiscard]] std::int64_t recorded_total() const noexcept {
    const Totals t = totals();
    return t.rec[0] + t.rec[1];
  }
  [[nodiscard]] std::int64_t completed_total() const noexcept {
    const Totals t = totals();
    return t.done[0] + t.done[1];
  }
  /// The most unfinished nodes seen, sampled every kReload records of a
  /// thread and whenever a recorder's estimate passes a window.
  [[nodiscard]] std::size_t peak() const noexcept { return peak_.load(std::memory_order_relaxed); }

 private:
  static constexpr std::uint32_t kReload = 64;
  static constexpr std::size_t kShared = kThreadSlots;  // the shard of threads without a slot

  struct alignas(64) Shard {
    std::array<std::atomic<std::int64_t>, 2> rec{};
    std::array<std::atomic<std::int64_t>, 2> done{};
    std::atomic<std::size_t> rec_bytes{0};
    std::atomic<std::size_t> done_bytes{0};
    // The owning thread's alone (unused in the shared shard, whose
    // recorders use exact sums): its bit is in used_; records since its
    // last reload; the copies its estimate uses.
    bool in_mask = false;
    std::uint32_t since_reload = 0;
    std::int64_t seen_others = 0;
    std::int64_t seen_done = 0;
    std::size_t seen_others_bytes = 0;
    std::size_t seen_done_bytes = 0;
  };

  struct Totals {
    std::array<std::int64_t, 2> rec{};
    std::array<std::int64_t, 2> done{};
    std::size_t rec_bytes = 0;
    std::size_t done_bytes = 0;
  };

  Shard& mine() noexcept {
    const int t = thread_slot();
    if (t < 0) return shards_[kShared];
    Shard& s = shards_[static_cast<std::size_t>(t)];
    if (!s.in_mask) {
      used_.fetch_or(std::uint64_t{1} << t, std::memory_order_seq_cst);
      s.in_mask = true;
    }
    return s;
  }

  template <class F>
  void each(std::uint64_t mask, F f) const noexcept {
    for (; mask != 0; mask &= mask - 1) f(shards_[static_cast<std::size_t>(std::countr_zero(mask))]);
    f(shards_[kShared]);
  }

  // Completed first, then the mask again, then recorded (file comment).
  Totals totals() const noexcept {
    Totals t;
    each(used_.load(std::memory_order_seq_cst), [&](const Shard& s) {
      t.done[0] += s.done[0].load(std::memory_order_seq_cst);
      t.done[1] += s.done[1].load(std::memory_order_seq_cst);
      t.done_bytes += s.done_bytes.load(std::memory_order_seq_cst);
    });
    each(used_.load(std::memory_order_seq_cst), [&](const Shard& s) {
      t.rec[0] += s.rec[0].load(std::memory_order_seq_cst);
      t.rec[1] += s.rec[1].load(std::memory_order_seq_cst);
      t.rec_bytes += s.rec_bytes.load(std::memory_order_seq_cst);
    });
    return t;
  }

  [[nodiscard]] bool past(std::size_t live, std::size_t live_bytes, std::size_t factor) const noexcept {
    return (limits_.max_pending != 0 && live > factor * limits_.max_pending) ||
           (limits_.max_pending_bytes != 0 && live > 1 && live_bytes > factor * limits_.max_pending_bytes);
  }

  // The owner's copies of the others' recorded counts and of the completed
  // sum (a slot's shard only: the shared one has several owners and keeps
  // none), and a sample of the peak.
  void reload(Shard& s) noexcept {
    s.since_reload = 0;
    const Totals t = totals();
    const std::int64_t own = s.rec[0].load(std::memory_order_relaxed) + s.rec[1].load(std::memory_order_relaxed);
    s.seen_others = t.rec[0] + t.rec[1] - own;
    s.seen_done = t.done[0] + t.done[1];
    s.seen_others_bytes = t.rec_bytes - s.rec_bytes.load(std::memory_order_relaxed);
    s.seen_done_bytes = t.done_bytes;
    sample_peak(t);
  }

  void sample_peak(const Totals& t) noexcept {
    const auto live = static_cast<std::size_t>(t.rec[0] + t.rec[1] - t.done[0] - t.done[1]);
    std::size_t peak = peak_.load(std::memory_order_relaxed);
    while (live > peak && !peak_.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
    }
  }

  const Limits limits_;
  std::array<Shard, kThreadSlots + 1> shards_{};
  alignas(64) std::atomic<std::uint64_t> used_{0};  // bit per slot whose shard was written
  alignas(64) std::atomic<std::size_t> peak_{0};
};

}  // namespace lazydag::engine::detail
