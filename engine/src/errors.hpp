// Error propagation, the part on the path of every node (inline: execute()
// calls it for each node). A failed op's error poisons the vars it writes;
// a node that reads a poisoned var is skipped (or, with
// run_on_failed_input, runs with the cause) and inherits the error, so it
// poisons its own writes in turn; a successful write clears the poison.
// With write_sources each write fails only with the error of a read it is
// computed from. The reporting side (which wait throws what, ErrorLog) is
// errors.cpp.
#pragma once

#include <array>
#include <atomic>
#include <bit>
#include <cstdint>
#include <mutex>
#include <vector>

#include "node.hpp"

namespace lazydag::engine::detail {

/// What a node's inputs bring it: the error it inherits (null: it runs),
/// and with write_sources which reads failed.
struct InputFailure {
  ErrorPtr error;
  std::uint64_t failed_reads = 0;  // with write_sources: bit k, reads[k] failed
  bool per_write = false;          // write_sources and some read failed
};

static inline InputFailure input_failure(const Node* n) {
  InputFailure f;
  for (std::size_t k = 0; k < n->reads.size(); ++k) {
    if (ErrorPtr p = n->reads[k]->poison) {
      if (!f.error) f.error = p;  // skipped: inherits the failure
      if (n->write_sources.empty()) break;
      f.failed_reads |= std::uint64_t{1} << k;
    }
  }
  // With write_sources, each write computed from a failed read fails with
  // that read's error; the node runs if any write is still computable.
  f.per_write = f.error && !n->write_sources.empty();
  if (f.per_write) {
    bool computable = false;
    for (std::uint64_t m : n->write_sources) computable = computable || (m & f.failed_reads) == 0;
    if (computable) f.error = nullptr;
  }
  return f;
}

/// After `n` ran (or was skipped) with outcome `err`: the poison of its
/// writes. `failed`: its own function threw.
static inline void poison_writes(Node* n, const ErrorPtr& err, const InputFailure& input, bool failed) {
  if (input.per_write && !failed) {
    n->write_errors.assign(n->writes.size(), nullptr);
    for (std::size_t j = 0; j < n->writes.size(); ++j) {
      if (const std::uint64_t m = n->write_sources[j] & input.failed_reads; m != 0) {
        n->write_errors[j] = n->reads[static_cast<std::size_t>(std::countr_zero(m))]->poison;
      }
      n->writes[j]->poison = n->write_errors[j];
    }
  } else {
    // A successful write clears it. Stored only when it changes: the var's
    // line is the recorder's too, and a store of null over null moved it to
    // this core on every node.
    for (VarState* v : n->writes) {
      if (v->poison != err) v->poison = err;
    }
  }
}

/// The failures and skips of completed nodes: counted (sharded, relaxed:
/// statistics), and each failure of a node's own kept until a waitall
/// reports it (a mutex of its own: failures are rare, nothing else takes
/// it). Knows nothing of the engine; any thread.
class ErrorLog {
 public:
  /// A node that failed (n->failed: its own function threw) or was
  /// skipped (an input's error), as it completes.
  void note(const Node* n);
  /// waitall's report: throws OpError for the oldest failure no wait has
  /// reported (deterministic across policies), saying how many others
  /// there were; then none are kept.
  void report_unreported();
  [[nodiscard]] std::uint64_t failed() const noexcept { return sum(&Counts::failed); }
  [[nodiscard]] std::uint64_t skipped() const noexcept { return sum(&Counts::skipped); }

 private:
  // One cache line per shard; a thread keeps to one shard.
  struct alignas(64) Counts {
    std::atomic<std::uint64_t> failed{0};
    std::atomic<std::uint64_t> skipped{0};
  };
  static constexpr std::size_t kShards = 8;
  Counts& mine() noexcept;
  [[nodiscard]] std::uint64_t sum(std::atomic<std::uint64_t> Counts::*field) const noexcept;

  std::array<Counts, kShards> counts_;
  std::mutex mu_;
  std::vector<ErrorPtr> unreported_;  // mu_
};

/// The error a wait on var `v` written by done node `t` reports.
ErrorPtr write_error(const Node* t, const VarState* v);

/// Throws OpError for `e`, nesting its cause; `more` other failures are
/// mentioned in the message.
[[noreturn]] void throw_op_error(const ErrorRecord& e, std::size_t more);

}  // namespace lazydag::engine::detail
