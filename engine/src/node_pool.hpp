// Node storage: blocks of nodes recycled through a free list, so recording
// allocates nothing in the steady state. Any thread may drop the last
// reference to a node; recorders take nodes out under the pool's lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "node.hpp"
#include "sync.hpp"

namespace lazydag::engine::detail {

class NodePool {
 public:
  NodePool() = default;
  NodePool(const NodePool&) = delete;
  NodePool& operator=(const NodePool&) = delete;

  /// A clean node with no references. Any thread.
  Node* alloc() {
    std::lock_guard g(mu_);
    if (local_ == nullptr) {
      // Take every returned node at once: a single consumer that exchanges
      // the whole stack has no ABA problem (pushers only CAS the head).
      local_ = returned_.exchange(nullptr, std::memory_order_acquire);
    }
    if (local_ == nullptr) {
      auto block = std::make_unique<Node[]>(kBlock);
      for (std::uint32_t i = 0; i < kBlock; ++i) {
        block[i].free_next = local_;
        local_ = &block[i];
      }
      blocks_.push_back(std::move(block));
    }
    Node* n = local_;
    local_ = n->free_next;
    if (local_ != nullptr) {
      // The next node is most likely on another core's cache (the worker
      // that completed it): ask for its lines now, for writing, so they
      // arrive while this node is recorded instead of stalling the next
      // push.
      const char* p = reinterpret_cast<const char*>(local_);
      for (std::size_t off = 0; off < sizeof(Node); off += 64) __builtin_prefetch(p + off, 1, 3);
    }
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

  /// Drops one reference; the last one recycles the node. Any thread.
  void release(Node* n) noexcept {
    // acq_rel: every access made under a reference happens before the reset.
    if (n->refs.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
    reset(n);
    Node* head = returned_.load(std::memory_order_relaxed);
    do {
      n->free_next = head;
    } while (!returned_.compare_exchange_weak(head, n, std::memory_order_release,
                                              std::memory_order_relaxed));
  }

 private:
  static constexpr std::uint32_t kBlock = 256;

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
    n->in_unrequested = false;
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

  // Taken only to take nodes out (and to list them): a leaf lock, held
  // for a few instructions.
  SpinLock mu_;
  std::vector<std::unique_ptr<Node[]>> blocks_;  // mu_
  Node* local_ = nullptr;                        // mu_
  alignas(64) std::atomic<Node*> returned_{nullptr};  // recycled nodes, pushed by any thread (a line of its own)
};

}  // namespace lazydag::engine::detail
