// The var table: slots for engine variables, handed out and checked by the
// recorder (under the recorder lock), freed by whichever thread drops a
// var's last hold.
//
// A deleted var keeps its slot until no access is pending. CPU nodes take
// no hold: the recorder frees the slot of a deleted var once the nodes the
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
#include <atomic>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "node.hpp"
#include "node_pool.hpp"

namespace lazydag::engine::detail {

class VarTable {
 public:
  VarTable(NodePool& pool, std::uint32_t engine_id) : pool_(pool), engine_id_(engine_id) {}
  VarTable(const VarTable&) = delete;
  VarTable& operator=(const VarTable&) = delete;

  /// A new live var (one hold: its liveness). Recorder lock held.
  Var create(const char* owner = nullptr) {
    std::uint32_t index = 0;
    if (free_ == 0) free_ = returned_.exchange(0, std::memory_order_acquire);
    if (free_ != 0) {
      index = free_ - 1;
      free_ = slot(index).next_free;
    } else {
      if (count_ == std::numeric_limits<std::uint32_t>::max()) throw Error("new_var: out of var slots");
      if (count_ % kChunk == 0) chunks_.push_back(std::make_unique<VarState[]>(kChunk));
      index = count_++;
    }
    VarState& s = slot(index);
    s.handle.index = index;
    s.handle.generation =
        s.handle.generation == std::numeric_limits<std::uint32_t>::max() ? 1 : s.handle.generation + 1;
    s.handle.engine = engine_id_;
    s.alive = true;
    s.owner = owner;
    s.holds.store(1, std::memory_order_relaxed);
    return s.handle;
  }

  /// The live var `v`, or InvalidArgument naming `call` (and the op being
  /// pushed, if any). The message is built only on failure. Recorder lock held.
  VarState* find(Var v, std::string_view call, std::string_view op = {}) {
    bool deleted = false;
    if (v.engine == engine_id_ && v.valid() && v.index < count_) {
      VarState& s = slot(v.index);
      if (s.handle.generation == v.generation && s.alive) return &s;
      deleted = v.generation <= s.handle.generation;
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

  /// One more unfinished access of a live var by a stream-device node.
  /// Recorder lock held.
  static void hold(VarState* s) noexcept { s->holds.fetch_add(1, std::memory_order_relaxed); }

  /// Deletes a live var (recorder lock held): refused from now on, its slot
  /// freed once no access is pending.
  void retire(VarState* s) {
    s->alive = false;
    if (idle(s)) {
      drop_here(s);  // the liveness hold; the last stream access frees it if one is pending
      return;
    }
    busy_.push_back(s);
    if (busy_.size() >= sweep_at_) sweep();
  }

  /// Frees the deleted vars whose accesses are done (recorder lock held).
  /// Swept when their number doubles since the last sweep: amortised O(1)
  /// per deletion.
  void sweep() noexcept {
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

  /// The nodes a var names are done (recorder lock; acquire: after their
  /// last access to it).
  static bool idle(const VarState* s) noexcept {
    if (s->last_writer != nullptr && s->last_writer->state.load(std::memory_order_acquire) != NodeState::kDone) {
      return false;
    }
    for (const Node* r : s->readers) {
      if (r->state.load(std::memory_order_acquire) != NodeState::kDone) return false;
    }
    return true;
  }

  /// Drops a hold; the last one frees the slot. Any thread.
  void drop(VarState* s) noexcept {
    if (s->holds.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    clear(s);
    std::uint32_t head = returned_.load(std::memory_order_relaxed);
    do {
      s->next_free = head;
    } while (!returned_.compare_exchange_weak(head, s->handle.index + 1, std::memory_order_release,
                                              std::memory_order_relaxed));
  }

 private:
  /// The recorder's drop (recorder lock held): a slot freed here goes
  /// straight to the recorder's own free list.
  void drop_here(VarState* s) noexcept {
    if (s->holds.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    clear(s);
    s->next_free = free_;
    free_ = s->handle.index + 1;
  }

  // Dead (the liveness hold is gone) and idle: nobody else can reach it.
  void clear(VarState* s) noexcept {
    if (s->last_writer != nullptr) pool_.release(s->last_writer);
    s->last_writer = nullptr;
    for (Node* r : s->readers) pool_.release(r);
    s->readers.shrink_if_large(64);
    s->prune_at = 8;
    if (s->poison) s->poison.reset();  // its line stays shared with the readers when clean
  }

  static constexpr std::uint32_t kChunk = 4096;
  static constexpr std::size_t kMinSweep = 64;
  VarState& slot(std::uint32_t index) { return chunks_[index / kChunk][index % kChunk]; }

  NodePool& pool_;
  const std::uint32_t engine_id_;                    // stamped on every handle
  std::vector<std::unique_ptr<VarState[]>> chunks_;  // recorder lock
  std::uint32_t count_ = 0;                          // recorder lock
  std::uint32_t free_ = 0;                           // recorder lock: index + 1
  std::atomic<std::uint32_t> returned_{0};           // freed slots, pushed by any thread
  std::vector<VarState*> busy_;                      // recorder lock: deleted, accesses pending
  std::size_t sweep_at_ = kMinSweep;                 // recorder lock
};

}  // namespace lazydag::engine::detail
