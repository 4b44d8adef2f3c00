// UnrequestedLists: under the lazy policy, the nodes recorded and not yet
// requested, in one list per thread slot (thread_slot.hpp), each in record
// order under a lock of its own. A recorder appends to its own list and
// its window requests its own oldest nodes, so recording threads share no
// lock; a wait, the window and a waitall take a node off whichever list
// holds it, under that list's lock.
//
// `Node::requested` goes from false to true exactly once, for exactly one
// caller of take(): for a node in a list, under the list's lock, with its
// removal from the list; for a node never in one (naive), by an exchange.
// Until that caller gives up the node's "not requested" count in `pending`
// the node cannot run, so a node in a list, or just taken from one, stays
// alive without a reference: whoever holds the list lock, or has just
// taken the node, may read it.
//
// Lock order: a var's lock, then a list's. Nothing else is taken under a
// list's lock.
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <cstddef>
#include <cstdint>

#include "node.hpp"
#include "sync.hpp"
#include "thread_slot.hpp"

namespace lazydag::engine::detail {

class UnrequestedLists {
 public:
  /// One list per thread slot, and one shared by threads without a slot.
  static constexpr std::size_t kLists = kThreadSlots + 1;
  static constexpr std::uint8_t kNone = 0xff;  // Node::unreq_list of a node in no list
  static_assert(kLists < kNone);

  /// The calling thread's list.
  static std::uint8_t mine() noexcept {
    const int t = thread_slot();
    return static_cast<std::uint8_t>(t >= 0 ? t : kThreadSlots);
  }

  /// Appends n (not yet published) to list `l`, calling `under_lock()`
  /// while the lock is held (the recorder reads the waitall epoch there:
  /// see take_all). Returns the list's length after.
  template <class F>
  std::size_t append(std::uint8_t l, Node* n, F&& under_lock) {
    List& list = lists_[l];
    if (!used(l)) mark_used(l);
    std::lock_guard g(list.mu);
    under_lock();
    n->unreq_list = l;
    n->unreq_prev = list.tail;
    n->unreq_next = nullptr;
    (list.tail != nullptr ? list.tail->unreq_next : list.head) = n;
    list.tail = n;
    const std::size_t count = list.count.load(std::memory_order_relaxed) + 1;
    list.count.store(count, std::memory_order_relaxed);
    return count;
  }

  /// The nodes in every list but `except`'s (kNone: in every list): a sum
  /// of relaxed loads, each list's count maybe a moment old. Any thread.
  [[nodiscard]] std::size_t count_except(std::uint8_t except) const noexcept {
    std::size_t sum = 0;
    std::uint64_t mask = used_.load(std::memory_order_relaxed);
    while (mask != 0) {
      const int l = std::countr_zero(mask);
      mask &= mask - 1;
      if (l != except) sum += lists_[static_cast<std::size_t>(l)].count.load(std::memory_order_relaxed);
    }
    if (kThreadSlots != except && shared_used_.load(std::memory_order_relaxed)) {
      sum += lists_[kThreadSlots].count.load(std::memory_order_relaxed);
    }
    return sum;
  }

  /// Marks n requested and takes it off its list: true for the one caller
  /// that does so, false when it was requested already. The caller holds a
  /// ref on n, or n is in a list whose lock it could take (see above).
  bool take(Node* n) noexcept {
    if (n->unreq_list == kNone) return !n->requested.exchange(true, std::memory_order_acq_rel);
    List& list = lists_[n->unreq_list];
    std::lock_guard g(list.mu);
    if (n->requested.load(std::memory_order_relaxed)) return false;
    unlink(list, n);
    return true;
  }

  /// Takes the oldest nodes of list `l` until at most `keep` are left (at
  /// most out.size() at once); returns how many it put in `out`.
  template <std::size_t N>
  std::size_t take_oldest(std::uint8_t l, std::size_t keep, std::array<Node*, N>& out) noexcept {
    List& list = lists_[l];
    std::lock_guard g(list.mu);
    std::size_t k = 0;
    while (list.count.load(std::memory_order_relaxed) > keep && k < N) {
      Node* n = list.head;
      unlink(list, n);
      out[k++] = n;
    }
    return k;
  }

  /// Takes every node of every list, newest first within a list, and gives
  /// each to f, after its list's lock is released (f may make it ready: it
  /// may run and be recycled at once).
  /// A recorder reads the waitall epoch under its list's lock: a waitall
  /// that has flipped the epoch (seq_cst) before calling this finds every
  /// node counted in the old parity, since a recorder that read the old
  /// parity had appended its node before releasing the lock this takes.
  template <class F>
  void take_all(F&& f) {
    std::uint64_t mask = used_.load(std::memory_order_seq_cst);
    const bool shared = shared_used_.load(std::memory_order_seq_cst);
    auto drain = [&](std::uint8_t l) {
      List& list = lists_[l];
      Node* n = nullptr;
      {
        std::lock_guard g(list.mu);
        n = list.tail;
        // Marked under the lock, so no take() of one of them unlinks it
        // from the chain walked below; the chain is then off the list.
        for (Node* m = n; m != nullptr; m = m->unreq_prev) m->requested.store(true, std::memory_order_relaxed);
        list.head = list.tail = nullptr;
        list.count.store(0, std::memory_order_relaxed);
      }
      while (n != nullptr) {
        Node* older = n->unreq_prev;  // read first: f(n) may recycle n
        f(n);
        n = older;
      }
    };
    while (mask != 0) {
      const int l = std::countr_zero(mask);
      mask &= mask - 1;
      drain(static_cast<std::uint8_t>(l));
    }
    if (shared) drain(static_cast<std::uint8_t>(kThreadSlots));
  }

 private:
  struct alignas(64) List {
    SpinLock mu;
    Node* head = nullptr;  // oldest
    Node* tail = nullptr;
    std::atomic<std::size_t> count{0};  // written under mu, read by count_except without it
  };

  // List lock held.
  static void unlink(List& list, Node* n) noexcept {
    n->requested.store(true, std::memory_order_relaxed);
    (n->unreq_prev != nullptr ? n->unreq_prev->unreq_next : list.head) = n->unreq_next;
    (n->unreq_next != nullptr ? n->unreq_next->unreq_prev : list.tail) = n->unreq_prev;
    list.count.store(list.count.load(std::memory_order_relaxed) - 1, std::memory_order_relaxed);
  }

  bool used(std::uint8_t l) const noexcept {
    return l == kThreadSlots ? shared_used_.load(std::memory_order_relaxed)
                             : (used_.load(std::memory_order_relaxed) >> l & 1) != 0;
  }
  // seq_cst, before the first append's lock: a waitall that does not see
  // the mark loaded it before this store, after its flip of the epoch, so
  // the recorder's load of the epoch, after this store, sees the flip.
  void mark_used(std::uint8_t l) noexcept {
    if (l == kThreadSlots) {
      shared_used_.store(true, std::memory_order_seq_cst);
    } else {
      used_.fetch_or(std::uint64_t{1} << l, std::memory_order_seq_cst);
    }
  }

  std::array<List, kLists> lists_{};
  std::atomic<std::uint64_t> used_{0};   // lists ever appended to (bit per thread slot)
  std::atomic<bool> shared_used_{false};
};

}  // namespace lazydag::engine::detail
