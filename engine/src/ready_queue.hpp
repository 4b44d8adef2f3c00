// The shared ready queue: nodes whose inputs are done, in the order they
// should start. Priority 0 (nearly every node) is a FIFO ring with O(1) push
// and pop; other priorities go to a heap that is consulted first for positive
// priorities and last for negative ones. A leaf spin lock guards it for a
// few instructions per operation; `size()` is readable without it, so idle
// threads poll an atomic instead of the lock. Chains never come here: a
// completing thread runs its one newly ready successor itself (bypass).
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "sync.hpp"

namespace lazydag::engine::detail {

template <class NodeT>
class ReadyQueue {
 public:
  void push(NodeT* n, int priority, std::uint64_t seq) {
    std::lock_guard lk(mu_);
    if (priority == 0) {
      if (count_ == ring_.size()) grow();
      ring_[(head_ + count_) & (ring_.size() - 1)] = n;
      ++count_;
    } else {
      heap_.push_back(Entry{priority, seq, n});
      std::push_heap(heap_.begin(), heap_.end(), later);
      note_heap();
    }
    // seq_cst: pairs with the idle threads' check of size() after they
    // announce themselves parked (see EngineImpl::notify_idle).
    size_.fetch_add(1, std::memory_order_seq_cst);
  }

  /// push() of k nodes (each by its own priority and seq) under one lock.
  void push_batch(NodeT* const* nodes, std::size_t k) {
    if (k == 0) return;
    {
      std::lock_guard lk(mu_);
      // Room first: the insertions below cannot throw, so an allocation
      // failure leaves the queue as it was.
      while (count_ + k > ring_.size()) grow();
      heap_.reserve(heap_.size() + k);
      for (std::size_t i = 0; i < k; ++i) {
        NodeT* n = nodes[i];
        if (n->priority == 0) {
          ring_[(head_ + count_) & (ring_.size() - 1)] = n;
          ++count_;
        } else {
          heap_.push_back(Entry{n->priority, n->seq, n});
          std::push_heap(heap_.begin(), heap_.end(), later);
        }
      }
      note_heap();
      // seq_cst: as in push().
      size_.fetch_add(k, std::memory_order_seq_cst);
    }
  }

  /// Room for `n` priority-0 entries without allocating (the window bounds
  /// how many nodes can be ready at once). Not thread-safe: at construction.
  void reserve(std::size_t n) {
    std::size_t cap = 64;
    while (cap < n) cap *= 2;
    if (cap > ring_.size()) ring_.resize(cap);
  }

  /// The next node to start, or null when empty.
  NodeT* pop() {
    if (size_.load(std::memory_order_relaxed) == 0) return nullptr;
    std::lock_guard lk(mu_);
    return pop_locked();
  }

  /// Takes up to `max` of the oldest entries at once (their refs pass to the
  /// caller), at most a `ways`-th of those waiting (at least one): a worker
  /// draining a long queue of small nodes takes the lock once per batch,
  /// and leaves the rest to the others. Only one, as pop() chooses it, while
  /// an entry of positive priority waits or the ring is empty. Returns how
  /// many.
  std::size_t pop_batch(NodeT** out, std::size_t max, std::size_t ways) {
    if (size_.load(std::memory_order_relaxed) == 0) return 0;
    std::lock_guard lk(mu_);
    if ((!heap_.empty() && heap_.front().priority > 0) || count_ == 0) {
      out[0] = pop_locked();
      return out[0] != nullptr ? 1 : 0;
    }
    const std::size_t k = std::min(max, std::max<std::size_t>(1, count_ / ways));
    for (std::size_t i = 0; i < k; ++i) {
      out[i] = ring_[head_];
      head_ = (head_ + 1) & (ring_.size() - 1);
    }
    count_ -= k;
    size_.fetch_sub(k, std::memory_order_relaxed);
    return k;
  }

  /// Takes `n` back if it is the newest priority-0 entry (its ref passes to
  /// the caller): a frontend about to run the node it just recorded takes
  /// it out of the workers' sight, so no worker touches it.
  bool remove_newest(NodeT* n) {
    if (size_.load(std::memory_order_relaxed) == 0) return false;
    std::lock_guard lk(mu_);
    if (count_ == 0 || ring_[(head_ + count_ - 1) & (ring_.size() - 1)] != n) return false;
    --count_;
    size_.fetch_sub(1, std::memory_order_relaxed);
    return true;
  }

  [[nodiscard]] std::size_t size() const noexcept { return size_.load(std::memory_order_seq_cst); }
  [[nodiscard]] bool empty() const noexcept { return size() == 0; }
  /// Nodes of nonzero priority waiting: a completing thread bypasses the
  /// queue only when there are none (it would overtake them).
  [[nodiscard]] bool has_priorities() const noexcept {
    return heap_size_.load(std::memory_order_relaxed) != 0;
  }
  /// Nodes of positive priority waiting: they go before the rest of a
  /// worker's batch (pop() returns the highest first).
  [[nodiscard]] bool has_urgent() const noexcept { return top_priority_.load(std::memory_order_relaxed) > 0; }

 private:
  // Heap entries keep their sort key inline: sifts compare contiguous
  // entries instead of chasing node pointers.
  struct Entry {
    int priority;
    std::uint64_t seq;
    NodeT* node;
  };
  // Higher priority first, then older first.
  static bool later(const Entry& a, const Entry& b) {
    return a.priority != b.priority ? a.priority < b.priority : a.seq > b.seq;
  }
  NodeT* pop_locked() {
    NodeT* n = nullptr;
    if (!heap_.empty() && (heap_.front().priority > 0 || count_ == 0)) {
      std::pop_heap(heap_.begin(), heap_.end(), later);
      n = heap_.back().node;
      heap_.pop_back();
      note_heap();
    } else if (count_ != 0) {
      n = ring_[head_];
      head_ = (head_ + 1) & (ring_.size() - 1);
      --count_;
    }
    if (n != nullptr) size_.fetch_sub(1, std::memory_order_relaxed);
    return n;
  }
  // Lock held: the heap's size and top priority, for readers without it.
  void note_heap() noexcept {
    heap_size_.store(heap_.size(), std::memory_order_relaxed);
    top_priority_.store(heap_.empty() ? 0 : heap_.front().priority, std::memory_order_relaxed);
  }
  void grow() {
    std::vector<NodeT*> bigger(std::max<std::size_t>(64, ring_.size() * 2));
    for (std::size_t i = 0; i < count_; ++i) bigger[i] = ring_[(head_ + i) & (ring_.size() - 1)];
    ring_.swap(bigger);
    head_ = 0;
  }

  SpinLock mu_;
  std::vector<NodeT*> ring_;  // power-of-two capacity; grows, never shrinks: no steady-state allocation
  std::size_t head_ = 0;
  std::size_t count_ = 0;
  std::vector<Entry> heap_;
  std::atomic<std::size_t> size_{0};
  std::atomic<std::size_t> heap_size_{0};
  std::atomic<int> top_priority_{0};
};

}  // namespace lazydag::engine::detail
