// The var table: slots for engine variables, handed out from a cache per
// thread slot (refilled from a lock-free return stack, else under the
// table's own lock), looked up without a lock and checked under the var's
// lock, freed by whichever thread drops a var's last hold into its cache.
//
// A deleted var keeps its slot until no access is pending. CPU nodes take
// no hold: the var table frees the slot of a deleted var once the nodes the
// var names (its last writer and the readers since) are done, at once or in
// a later sweep of the deleted vars still busy. Every earlier CPU access is
// done by then (each is a predecessor of the last writer, or was done when
// that was recorded), and a done CPU node touches its vars no more. A
// completion therefore never writes the var's line, which the recorder
// writes on every push that names the var: a hold taken by one and dropped
// by the other moved it between the two cores twice per node. Stream-device
// nodes do take a hold per access, dropped at completion: their launch
// edges are satisfied at launch, so an earlier access on another stream may
// report its completion (and its error, into the var's poison) after the
// last writer's.
#pragma once

#include <lazydag/engine/error.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
#include <cstdint>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "node.hpp"
#include "node_pool.hpp"
#include "sync.hpp"
#include "thread_slot.hpp"

namespace lazydag::engine::detail {

class VarTable {
 public:
  VarTable(NodePool& pool, std::uint32_t engine_id)
      : pool_(pool), engine_id_(engine_id), dir_(std::make_unique<std::atomic<VarState*>[]>(kMaxChunks)) {}
  VarTable(const VarTable&) = delete;
  VarTable& operator=(const VarTable&) = delete;
  ~VarTable() {
    for (std::uint32_t c = 0; c * kChunk < count_.load(std::memory_order_relaxed); ++c) {
      delete[] dir_[c].load(std::memory_order_relaxed);
    }
  }

  /// A new live var (one hold: its liveness). Any thread.
  Var create(const char* owner = nullptr) {
    std::uint32_t index = 0;
    const int t = thread_slot();
    if (t >= 0) {
      // The thread's cache first; when dry, the whole return stack (any
      // thread may take it all with one exchange: pushers only CAS the
      // head, so there is no ABA problem), else the locked path.
      Cache& c = caches_[static_cast<std::size_t>(t)];
      if (c.head == 0) c.head = returned_.exchange(0, std::memory_order_acquire);
      if (c.head != 0) {
        index = c.head - 1;
        c.head = slot(index).next_free;
        if (c.count != 0) --c.count;
      } else {
        index = take_locked();
      }
    } else {
      index = take_locked();
    }
    // No lock: a check with a stale handle of this slot may run meanwhile,
    // on atomics. The new generation is stored before `alive` (release),
    // and check() loads `alive` (acquire) before the generation: a check
    // that sees the new var alive sees its generation too, so a stale
    // handle never passes, and it never reads the rest of the var. The var
    // reaches other threads only through the handle returned here.
    VarState& s = slot(index);
    const std::uint32_t g = s.generation.load(std::memory_order_relaxed);
    const std::uint32_t next = g == std::numeric_limits<std::uint32_t>::max() ? 1 : g + 1;
    s.owner = owner;
    s.holds.store(1, std::memory_order_relaxed);
    s.generation.store(next, std::memory_order_relaxed);
    s.alive.store(true, std::memory_order_release);
    return Var{index, next, engine_id_};
  }

  /// The slot `v` names, live or not; null when this engine never made
  /// it. Lock-free: slots are never moved or freed while the engine lives.
  VarState* lookup(Var v) const noexcept {
    if (v.engine != engine_id_ || !v.valid() || v.index >= count_.load(std::memory_order_acquire)) return nullptr;
    return &slot(v.index);
  }

  /// `s` (from lookup(v), its lock held; null allowed) is the live var `v`,
  /// or InvalidArgument naming `call` (and the op being pushed, if any).
  /// The message is built only on failure.
  void check(const VarState* s, Var v, std::string_view call, std::string_view op = {}) const {
    bool deleted = false;
    if (s != nullptr) {
      // `alive` first (see create()).
      const bool alive = s->alive.load(std::memory_order_acquire);
      const std::uint32_t g = s->generation.load(std::memory_order_relaxed);
      if (alive && g == v.generation) return;
      deleted = v.generation <= g;
    }
    std::string where(call);
    if (!op.empty()) where += " '" + std::string(op) + "'";
    if (deleted) throw InvalidArgument(where + ": var #" + std::to_string(v.index) + " has been deleted");
    if (v.valid() && v.engine != 0 && v.engine != engine_id_) {
      throw InvalidArgument(where + ": var #" + std::to_string(v.index) +
                            " belongs to another engine (engine " + std::to_string(v.engine) +
                            ", this is engine " + std::to_string(engine_id_) + ")");
    }
    throw InvalidArgument(where + ": unknown var (#" + std::to_string(v.index) + " generation " +
                          std::to_string(v.generation) + " was never created by this engine)");
  }

  /// One more unfinished access of a live var by a stream-device node (the
  /// var's lock held).
  static void hold(VarState* s) noexcept { s->holds.fetch_add(1, std::memory_order_relaxed); }

  /// Deletes a var whose `alive` the caller cleared under its lock (no
  /// recorder or wait reaches it again): its slot is freed once no access
  /// is pending.
  void retire(VarState* s) {
    // Dead, so idle() needs no lock; a var whose nodes are done (small
    // nodes run where recorded, or finished long ago) is freed without the
    // table's lock.
    if (idle(s)) {
      drop(s);
      return;
    }
    std::lock_guard g(mu_);
    if (idle(s)) {
      drop_here(s);  // the liveness hold; the last stream access frees it if one is pending
      return;
    }
    busy_.push_back(s);
    if (busy_.size() >= sweep_at_) sweep_locked();
  }

  /// Frees the deleted vars whose accesses are done. Swept when their
  /// number doubles since the last sweep: amortised O(1) per deletion.
  void sweep() noexcept {
    std::lock_guard g(mu_);
    sweep_locked();
  }

  /// The nodes a var names are done (acquire: after their last access to
  /// it). Its lock held, or the var dead.
  static bool idle(const VarState* s) noexcept { return every_access(s, done); }

  /// The nodes a var names that are not done all hold it (stream-device
  /// nodes): when it dies, its liveness hold can go at once, and the last
  /// of their completions frees the slot. Its lock held.
  static bool held_by_pending(const VarState* s) noexcept {
    return every_access(s, [](const Node* n) { return n->sdev != nullptr || done(n); });
  }

  /// Drops a hold; the last one frees the slot, into the thread's cache
  /// (past 2 * kBatch, kBatch of them go to the return stack). Any thread.
  void drop(VarState* s) noexcept {
    if (s->holds.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    clear(s);
    const int t = thread_slot();
    if (t < 0) {
      give_back(s->index + 1, s);
      return;
    }
    Cache& c = caches_[static_cast<std::size_t>(t)];
    s->next_free = c.head;
    c.head = s->index + 1;
    if (++c.count > 2 * kBatch) {
      VarState* last = s;
      for (std::uint32_t i = 1; i < kBatch; ++i) last = &slot(last->next_free - 1);
      const std::uint32_t first = c.head;
      c.head = last->next_free;
      c.count -= kBatch;
      give_back(first, last);
    }
  }

 private:
  static constexpr std::uint32_t kBatch = 32;

  static bool done(const Node* n) noexcept { return n->state.load(std::memory_order_acquire) == NodeState::kDone; }
  // pred holds for the var's last writer and every reader since.
  template <class Pred>
  static bool every_access(const VarState* s, Pred pred) noexcept {
    if (s->last_writer != nullptr && !pred(s->last_writer)) return false;
    return std::all_of(s->readers.begin(), s->readers.end(), pred);
  }

  // One thread's free slots (index + 1, linked by next_free): only the
  // thread holding the slot touches it. `count`: slots freed here and not
  // taken out since (a stack taken whole is not counted).
  struct alignas(64) Cache {
    std::uint32_t head = 0;
    std::uint32_t count = 0;
  };

  // The chain first .. last (linked by next_free) onto the return stack.
  void give_back(std::uint32_t first, VarState* last) noexcept {
    std::uint32_t head = returned_.load(std::memory_order_relaxed);
    do {
      last->next_free = head;
    } while (!returned_.compare_exchange_weak(head, first, std::memory_order_release, std::memory_order_relaxed));
  }

  // A slot from the lock holder's list, the return stack or a new chunk.
  std::uint32_t take_locked() {
    std::lock_guard g(mu_);
    if (free_ == 0) free_ = returned_.exchange(0, std::memory_order_acquire);
    if (free_ != 0) {
      const std::uint32_t index = free_ - 1;
      free_ = slot(index).next_free;
      return index;
    }
    const std::uint32_t count = count_.load(std::memory_order_relaxed);
    if (count == kMaxChunks * kChunk) throw Error("new_var: out of var slots");
    if (count % kChunk == 0) dir_[count / kChunk].store(new VarState[kChunk], std::memory_order_release);
    // A slot's index and engine never change: set before the count
    // publishes the slot.
    VarState& fresh = slot(count);
    fresh.index = count;
    fresh.engine = engine_id_;
    count_.store(count + 1, std::memory_order_release);  // publishes the chunk and slot to lookups
    return count;
  }

  void sweep_locked() noexcept {
    std::size_t kept = 0;
    for (VarState* s : busy_) {
      if (idle(s)) {
        drop_here(s);
      } else {
        busy_[kept++] = s;
      }
    }
    busy_.resize(kept);
    sweep_at_ = std::max<std::size_t>(kMinSweep, 2 * kept);
  }

  /// The table's own drop (mu_ held): a slot freed here goes straight to
  /// the free list. Never a var with a buffer to give back (clear() would
  /// call its device under mu_): delete_var_and_free drops the liveness
  /// hold itself, so such a var never reaches busy_.
  void drop_here(VarState* s) noexcept {
    assert(s->release.dev == nullptr);
    if (s->holds.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    clear(s);
    s->next_free = free_;
    free_ = s->index + 1;
  }

  // Dead (the liveness hold is gone) and idle: nobody else can reach it.
  void clear(VarState* s) noexcept {
    if (s->last_writer != nullptr) pool_.release(s->last_writer);
    s->last_writer = nullptr;
    for (Node* r : s->readers) pool_.release(r);
    s->readers.shrink_if_large(64);
    s->prune_at = 8;
    if (s->poison) s->poison.reset();  // its line stays shared with the readers when clean
    if (s->release.dev != nullptr) [[unlikely]] give_back(s);
  }

  // Every access has completed on the device: any of its streams may take
  // the buffer back. Out of line: clear() runs on every var's deletion.
  [[gnu::noinline]] static void give_back(VarState* s) noexcept {
    const VarRelease r = std::exchange(s->release, VarRelease{});
    r.dev->deallocate(r.ptr, r.bytes, r.dev->stream_handle(r.stream));
  }

  // 2^28 slots at most, in chunks that never move: lookups index them
  // without a lock.
  static constexpr std::uint32_t kChunk = 4096;
  static constexpr std::uint32_t kMaxChunks = 65536;
  static constexpr std::size_t kMinSweep = 64;
  VarState& slot(std::uint32_t index) const noexcept {
    return dir_[index / kChunk].load(std::memory_order_acquire)[index % kChunk];
  }

  NodePool& pool_;
  const std::uint32_t engine_id_;                       // stamped on every handle
  const std::unique_ptr<std::atomic<VarState*>[]> dir_;  // chunk pointers, set once each under mu_
  std::atomic<std::uint32_t> count_{0};                 // slots handed out ever (written under mu_)
  // The lock holder's free list, fresh slots and the deleted vars still
  // busy: a leaf lock of its own, taken by no push, and by new_var and
  // delete_var only when the thread's cache is dry or the var is busy.
  SpinLock mu_;
  std::uint32_t free_ = 0;                  // mu_: index + 1
  std::atomic<std::uint32_t> returned_{0};  // freed slots, pushed by any thread
  std::vector<VarState*> busy_;             // mu_: deleted, accesses pending
  std::size_t sweep_at_ = kMinSweep;        // mu_
  std::array<Cache, kThreadSlots> caches_{};  // [thread slot]
};

}  // namespace lazydag::engine::detail
