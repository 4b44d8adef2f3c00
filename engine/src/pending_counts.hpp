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
// The recorder writes only the recorded side and the completers only the
// completed side: one counter that both sides modify moved a cache line
// between the recording core and the worker's core twice per node (a
// tenth of chain_async's samples). The recorder checks its windows against
// a stale copy of the completed counts, a lower bound, so the difference it
// computes is an upper bound; it reloads them only when that bound passes a
// limit.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>

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
    const std::int64_t n = rec_.by_epoch[parity].fetch_add(1, std::memory_order_release) + 1;
    if (bytes != 0) rec_.bytes.fetch_add(bytes, std::memory_order_release);
    if (n % kPeakSample == 0) reload_done();  // samples the peak
  }

  /// Any thread: one node of `parity` completed, costing `bytes`. Returns
  /// the parity's completed count including it. seq_cst: a waitall
  /// registers itself and then compares the counts; the completer adds and
  /// then reads whether a waitall is registered (see recorded_in).
  std::int64_t completed(std::size_t parity, std::size_t bytes) noexcept {
    if (bytes != 0) done_.bytes.fetch_add(bytes, std::memory_order_seq_cst);
    return done_.by_epoch[parity].fetch_add(1, std::memory_order_seq_cst) + 1;
  }

  /// The recorded count of `parity` (the recorder's cache line: read it only
  /// when a waitall may be waiting). A completion counted by completed() was
  /// recorded before, so the completed count never passes it.
  [[nodiscard]] std::int64_t recorded_in(std::size_t parity) const noexcept {
    return rec_.by_epoch[parity].load(std::memory_order_seq_cst);
  }

  // Exact counts (any thread): completed read first, so the difference is
  // never below the number unfinished when the completed count was read.
  [[nodiscard]] std::int64_t unfinished_in(std::size_t parity) const noexcept {
    const std::int64_t d = done_.by_epoch[parity].load(std::memory_order_seq_cst);
    return rec_.by_epoch[parity].load(std::memory_order_seq_cst) - d;
  }
  [[nodiscard]] std::size_t unfinished() const noexcept {
    const std::int64_t d = completed_total();
    return static_cast<std::size_t>(rec_.by_epoch[0].load(std::memory_order_seq_cst) +
                                    rec_.by_epoch[1].load(std::memory_order_seq_cst) - d);
  }
  [[nodiscard]] std::size_t unfinished_bytes() const noexcept {
    const std::size_t d = done_.bytes.load(std::memory_order_seq_cst);
    return rec_.bytes.load(std::memory_order_seq_cst) - d;
  }

  /// Past `factor` times the window (count, or bytes while more than one
  /// node is unfinished: one node is let through however large, so a push
  /// returns before a big op is computed): a frontend stalls. Exact; any
  /// thread.
  [[nodiscard]] bool over_window(std::size_t factor) const noexcept {
    const std::size_t live = unfinished();
    return (limits_.max_pending != 0 && live > factor * limits_.max_pending) ||
           (limits_.max_pending_bytes != 0 && live > 1 && unfinished_bytes() > factor * limits_.max_pending_bytes);
  }

  /// The same from the recorders' copies (any thread): reloads them only
  /// when the upper bound they give is past the window.
  bool recorder_over_window(std::size_t factor) noexcept {
    auto over = [&] {
      const std::int64_t recorded =
          rec_.by_epoch[0].load(std::memory_order_relaxed) + rec_.by_epoch[1].load(std::memory_order_relaxed);
      const auto live = static_cast<std::size_t>(recorded - rec_.seen_done.load(std::memory_order_relaxed));
      return (limits_.max_pending != 0 && live > factor * limits_.max_pending) ||
             (limits_.max_pending_bytes != 0 && live > 1 &&
              rec_.bytes.load(std::memory_order_relaxed) - rec_.seen_done_bytes.load(std::memory_order_relaxed) >
                  factor * limits_.max_pending_bytes);
    };
    if (!over()) return false;  // the upper bound is within the window
    reload_done();
    return over();
  }

  // Statistics.
  [[nodiscard]] std::int64_t recorded_total() const noexcept {
    return rec_.by_epoch[0].load(std::memory_order_relaxed) + rec_.by_epoch[1].load(std::memory_order_relaxed);
  }
  [[nodiscard]] std::int64_t completed_total() const noexcept {
    return done_.by_epoch[0].load(std::memory_order_seq_cst) + done_.by_epoch[1].load(std::memory_order_seq_cst);
  }
  /// The most unfinished nodes seen, sampled every kPeakSample records.
  [[nodiscard]] std::size_t peak() const noexcept { return rec_.peak_unfinished.load(std::memory_order_relaxed); }

 private:
  static constexpr std::uint32_t kPeakSample = 64;

  // Reloads the recorders' copies and samples the peak (any thread; two
  // recorders reloading at once may leave the older copy, still a lower
  // bound).
  void reload_done() noexcept {
    const std::int64_t done = completed_total();
    rec_.seen_done.store(done, std::memory_order_relaxed);
    rec_.seen_done_bytes.store(done_.bytes.load(std::memory_order_seq_cst), std::memory_order_relaxed);
    const auto live = static_cast<std::size_t>(rec_.by_epoch[0].load(std::memory_order_relaxed) +
                                               rec_.by_epoch[1].load(std::memory_order_relaxed) - done);
    std::size_t peak = rec_.peak_unfinished.load(std::memory_order_relaxed);
    while (live > peak && !rec_.peak_unfinished.compare_exchange_weak(peak, live, std::memory_order_relaxed)) {
    }
  }

  struct alignas(64) Recorded {
    std::array<std::atomic<std::int64_t>, 2> by_epoch{};  // written by recorders
    std::atomic<std::size_t> bytes{0};                    // cost recorded
    std::atomic<std::size_t> peak_unfinished{0};
    // Copies of done_'s totals, reloaded when needed: lower bounds.
    std::atomic<std::int64_t> seen_done{0};
    std::atomic<std::size_t> seen_done_bytes{0};
  };
  struct alignas(64) Completed {
    std::array<std::atomic<std::int64_t>, 2> by_epoch{};
    std::atomic<std::size_t> bytes{0};
  };

  const Limits limits_;
  Recorded rec_;
  Completed done_;
};

}  // namespace lazydag::engine::detail
