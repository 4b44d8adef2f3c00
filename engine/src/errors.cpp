// Error reporting: which wait throws which failure. A wait_to_read or
// wait_to_write throws the error of the op that wrote the var it waited for
// (that write's own, with write_sources) and marks it reported; waitall
// throws the oldest failure no wait has reported, saying how many others
// there were, and forgets them all (ErrorLog). Failures are collected as
// nodes complete, under a mutex of their own (failures are rare; nothing
// else takes it). How errors propagate between nodes is errors.hpp.
#include <mutex>
#include <string>

#include "errors.hpp"

namespace lazydag::engine::detail {

// The error a wait on var `v` written by done node `t` reports: v's own
// when t computed several results from different inputs (write_sources),
// else t's.
ErrorPtr write_error(const Node* t, const VarState* v) {
  if (!t->write_errors.empty()) {
    for (std::size_t j = 0; j < t->writes.size(); ++j) {
      if (t->writes[j] == v) return t->write_errors[j];
    }
  }
  return t->error;
}

[[noreturn]] void throw_op_error(const ErrorRecord& e, std::size_t more) {
  std::string suffix =
      more == 0 ? std::string() : " (and " + std::to_string(more) + " more failed ops)";
  // Rethrow the cause first so that OpError's nested_exception captures it.
  try {
    std::rethrow_exception(e.cause);
  } catch (const std::exception& ex) {
    throw OpError(e.op_name, ex.what() + suffix, e.cause);
  } catch (...) {
    throw OpError(e.op_name, "non-standard exception" + suffix, e.cause);
  }
}

ErrorLog::Counts& ErrorLog::mine() noexcept {
  static std::atomic<std::size_t> next_shard{0};
  thread_local const std::size_t shard = next_shard.fetch_add(1, std::memory_order_relaxed) % kShards;
  return counts_[shard];
}

void ErrorLog::note(const Node* n) {
  if (n->failed) {
    mine().failed.fetch_add(1, std::memory_order_relaxed);
    std::lock_guard g(mu_);
    unreported_.push_back(n->error);
  } else {
    mine().skipped.fetch_add(1, std::memory_order_relaxed);
  }
}

void ErrorLog::report_unreported() {
  ErrorPtr first;
  std::size_t count = 0;
  {
    std::lock_guard g(mu_);
    for (ErrorPtr& e : unreported_) {
      if (e->reported.exchange(true, std::memory_order_relaxed)) continue;
      ++count;
      if (!first || e->seq < first->seq) first = e;
    }
    unreported_.clear();
  }
  if (first) throw_op_error(*first, count - 1);
}

std::uint64_t ErrorLog::sum(std::atomic<std::uint64_t> Counts::*field) const noexcept {
  std::uint64_t total = 0;
  for (const Counts& c : counts_) total += (c.*field).load(std::memory_order_relaxed);
  return total;
}

}  // namespace lazydag::engine::detail
