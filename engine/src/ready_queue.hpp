// The ready queue: nodes whose inputs are done, in the order they should
// start. Priority 0 (nearly every node) is a FIFO with O(1) push and pop;
// other priorities go to a heap that is consulted first for positive
// priorities and last for negative ones.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <vector>

namespace lazydag::engine::detail {

template <class NodeT>
class ReadyQueue {
 public:
  void push(NodeT* n, int priority, std::uint64_t seq) {
    if (priority == 0) {
      fifo_.push_back(n);
    } else {
      heap_.push_back(Entry{priority, seq, n});
      std::push_heap(heap_.begin(), heap_.end(), later);
    }
  }

  /// The next node to start, or null when empty.
  NodeT* pop() {
    if (!heap_.empty() && (heap_.front().priority > 0 || fifo_.empty())) {
      std::pop_heap(heap_.begin(), heap_.end(), later);
      NodeT* n = heap_.back().node;
      heap_.pop_back();
      return n;
    }
    if (fifo_.empty()) return nullptr;
    NodeT* n = fifo_.front();
    fifo_.pop_front();
    return n;
  }

  [[nodiscard]] std::size_t size() const noexcept { return fifo_.size() + heap_.size(); }
  [[nodiscard]] bool empty() const noexcept { return fifo_.empty() && heap_.empty(); }

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

  std::deque<NodeT*> fifo_;  // ready order, which is record order for nodes ready together
  std::vector<Entry> heap_;
};

}  // namespace lazydag::engine::detail
