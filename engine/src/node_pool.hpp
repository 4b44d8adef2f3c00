// Node storage: blocks of nodes recycled through free lists, so recording
// allocates nothing in the steady state. Each thread keeps a cache of free
// nodes in its thread slot (thread_slot.hpp): a node it recycles goes
// there if it took it from there and ran it, and it records with nodes
// from there, so a thread that both records and runs its nodes (small
// nodes run where they are recorded) touches no line another thread writes
// to recycle one. A cache that runs
// dry takes a whole shared free list at once; one that grows past
// 2 * kBatch (a worker recycles what a recorder takes) gives kBatch back
// with one CAS. Threads without a slot use the shared lists a node at a
// time.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "node.hpp"
#include "sync.hpp"
#include "thread_slot.hpp"

namespace lazydag::engine::detail {

class NodePool {
 public:
  NodePool() = default;
  NodePool(const NodePool&) = delete;
  NodePool& operator=(const NodePool&) = delete;

  /// A clean node with no references. Any thread.
  Node* alloc() {
    const int t = thread_slot();
    if (t < 0) return alloc_shared();
    Cache& c = caches_[static_cast<std::size_t>(t)];
    if (c.head == nullptr) c.head = refill();
    Node* n = c.head;
    c.head = n->free_next;
    n->home = t;
    if (c.count != 0) --c.count;
    if (c.head != nullptr) prefetch(c.head);
    return n;
  }

  /// Calls f(node) for every node ever allocated (under the pool's lock:
  /// f must not record).
  template <class F>
  void for_each(F f) {
    std::lock_guard g(mu_);
    for (auto& b : blocks_) {
      for (std::uint32_t i = 0; i < kBlock; ++i) f(&b[i]);
    }
  }

  /// Takes one more reference (the caller holds one already, or holds a
  /// lock that keeps the node from completing).
  static void retain(Node* n) noexcept { n->refs.fetch_add(1, std::memory_order_relaxed); }

  /// A node run by a thread other than the one that took it out: it
  /// will not go back to that thread's cache (release()). Called by the
  /// thread about to run it.
  static void ran_here(Node* n) noexcept {
    if (n->home >= 0 && n->home != thread_slot()) n->home = -1;
  }

  /// Drops one reference; the last one recycles the node. Any thread.
  /// Into the thread's cache only when this thread took it from there and
  /// ran it (or it never ran): a thread that records small nodes and runs
  /// them itself recycles them without touching a shared line. Any other
  /// node goes to the shared stack. (Caching every node where its last
  /// reference was dropped made bench_engine's fan 40% slower: there the
  /// recording thread drops the last references of the nodes the workers
  /// ran, when it links the next writers of their vars; perf showed the
  /// time in link's reference drops and in the workers' idle spin, not
  /// why.)
  void release(Node* n) noexcept {
    // acq_rel: every access made under a reference happens before the reset.
    if (n->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    const int home = n->home;
    reset(n);
    const int t = thread_slot();
    if (t < 0 || home != t) {
      give_back(n, n);
      return;
    }
    Cache& c = caches_[static_cast<std::size_t>(t)];
    n->free_next = c.head;
    c.head = n;
    if (++c.count > 2 * kBatch) {
      // The oldest half would do as well; the first kBatch are at hand.
      Node* last = c.head;
      for (std::uint32_t i = 1; i < kBatch; ++i) last = last->free_next;
      Node* first = c.head;
      c.head = last->free_next;
      c.count -= kBatch;
      give_back(first, last);
    }
  }

 private:
  static constexpr std::uint32_t kBlock = 256;
  static constexpr std::uint32_t kBatch = 32;

  // One thread's free nodes: only the thread holding the slot touches it.
  // `count`: nodes recycled here and not taken out since (at most the
  // list's length; a list taken whole by refill() is not counted).
  struct alignas(64) Cache {
    Node* head = nullptr;
    std::uint32_t count = 0;
  };

  // The node is most likely on another core's cache (the worker that
  // completed it): ask for its lines now, for writing, so they arrive while
  // the node before it is recorded instead of stalling the next push.
  static void prefetch(const Node* n) noexcept {
    const char* p = reinterpret_cast<const char*>(n);
    for (std::size_t off = 0; off < sizeof(Node); off += 64) __builtin_prefetch(p + off, 1, 3);
  }

  // A whole list of free nodes for an empty cache, taken without walking
  // it (its nodes are likely in other cores' caches: alloc() prefetches
  // them one at a time, while the node before is recorded): the return
  // stack (any thread may take it all with one exchange, and pushers only
  // CAS the head, so there is no ABA problem), else the lock holder's
  // list, else a new block, made outside the lock: its pages are faulted
  // in as its nodes are constructed, and two threads recording into a new
  // engine both grow the pool (made under the lock, the other thread's
  // allocations waited behind those faults: lazy recorders=2 in
  // bench_engine spent 19% of its time making blocks and 10% yielding).
  Node* refill() {
    if (Node* all = returned_.exchange(nullptr, std::memory_order_acquire); all != nullptr) return all;
    {
      std::lock_guard g(mu_);
      if (local_ != nullptr) {
        Node* all = local_;
        local_ = nullptr;
        return all;
      }
    }
    auto block = new_block();
    Node* all = &block[0];
    std::lock_guard g(mu_);
    blocks_.push_back(std::move(block));
    return all;
  }

  // A block whose nodes are linked by free_next, first to last (no lock).
  static std::unique_ptr<Node[]> new_block() {
    auto block = std::make_unique<Node[]>(kBlock);
    for (std::uint32_t i = 0; i + 1 < kBlock; ++i) block[i].free_next = &block[i + 1];
    return block;
  }

  // The chain first..last (linked by free_next) onto the shared list.
  void give_back(Node* first, Node* last) noexcept {
    Node* head = returned_.load(std::memory_order_relaxed);
    do {
      last->free_next = head;
    } while (!returned_.compare_exchange_weak(head, first, std::memory_order_release,
                                              std::memory_order_relaxed));
  }

  Node* alloc_shared() {
    std::lock_guard g(mu_);
    Node* n = take_locked();
    n->home = -1;
    if (local_ != nullptr) prefetch(local_);
    return n;
  }

  // mu_ held.
  Node* take_locked() {
    if (local_ == nullptr) {
      // Take every returned node at once: a single consumer that exchanges
      // the whole stack has no ABA problem (pushers only CAS the head).
      local_ = returned_.exchange(nullptr, std::memory_order_acquire);
    }
    if (local_ == nullptr) {
      auto block = new_block();
      local_ = &block[0];
      blocks_.push_back(std::move(block));
    }
    Node* n = local_;
    local_ = n->free_next;
    return n;
  }

  static void reset(Node* n) noexcept {
    // fn was reset when the node ran; edge lists were emptied at completion.
    n->reads.shrink_if_large(16);
    n->writes.shrink_if_large(16);
    n->succs.shrink_if_large(64);
    n->preds.shrink_if_large(64);
    n->name.clear();
    n->error.reset();
    n->write_errors.clear();
    n->t_push = 0;
    n->tag.store(0, std::memory_order_relaxed);
    n->waiters.store(0, std::memory_order_relaxed);
    n->state.store(NodeState::kRecorded, std::memory_order_relaxed);
    n->requested.store(false, std::memory_order_relaxed);
    n->unreq_list = 0xff;
    n->failed = false;
    n->launch_failed = false;
    n->device = Device{};
    n->priority = 0;
    if (n->has_event) n->sdev->release_event(n->event);
    n->has_event = false;
    n->sdev = nullptr;
    n->stream = -1;
    n->bytes = 0;
    n->waits.clear();
  }

  // Taken only to take nodes out of the shared list (and to list them): a
  // leaf lock, held for a few instructions.
  SpinLock mu_;
  std::vector<std::unique_ptr<Node[]>> blocks_;  // mu_
  Node* local_ = nullptr;                        // mu_
  alignas(64) std::atomic<Node*> returned_{nullptr};  // recycled nodes, pushed by any thread (a line of its own)
  std::array<Cache, kThreadSlots> caches_{};            // [slot]
};

}  // namespace lazydag::engine::detail
