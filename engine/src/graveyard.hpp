// Graveyard: nodes whose functions ran on a worker or a device thread,
// waiting for a frontend thread to destroy the functions' captures.
//
// The captures were allocated by the frontend (arrays, buffers, shape
// vectors), and freeing them on the worker would hand every allocation
// across threads (contended malloc arenas, the host pool) and take the
// var table's lock for every var their destructors delete. Destroyed in
// batches by the frontend, they stay thread-local.
//
// A lock-free multi-producer stack linked through Node::grave_next: any
// thread buries (a release CAS publishes the node's last writes with it),
// a frontend takes the whole stack at once (acquire). Knows nothing of
// the engine: the caller retains the node before burying it and destroys
// and releases what it takes.
#pragma once

#include <atomic>

#include "node.hpp"

namespace lazydag::engine::detail {

class Graveyard {
 public:
  /// Any thread: adds `n` (the caller's ref passes to the graveyard).
  void bury(Node* n) noexcept {
    Node* head = head_.load(std::memory_order_relaxed);
    do {
      n->grave_next = head;
    } while (!head_.compare_exchange_weak(head, n, std::memory_order_release, std::memory_order_relaxed));
  }
  /// Every node buried so far, newest first, linked by grave_next (their
  /// refs pass to the caller); null when none.
  Node* take_all() noexcept {
    if (head_.load(std::memory_order_relaxed) == nullptr) return nullptr;
    return head_.exchange(nullptr, std::memory_order_acquire);
  }
  [[nodiscard]] bool empty() const noexcept { return head_.load(std::memory_order_acquire) == nullptr; }

 private:
  alignas(64) std::atomic<Node*> head_{nullptr};
};

}  // namespace lazydag::engine::detail
