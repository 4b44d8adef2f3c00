// The pending window bounds memory: recording 10 million tiny ops without a
// single wait keeps peak RSS within a stated bound. Its own executable, so
// the process peak is this test's alone.
#include <doctest/doctest.h>

#include <lazydag/engine/engine.hpp>

#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <vector>

using namespace lazydag::engine;

namespace {
long peak_rss_kib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}
}  // namespace

TEST_SUITE("engine") {
  TEST_CASE("Memory.TenMillionOpsWithoutWaitStayBounded" * doctest::timeout(300)) {
    for (Policy p : {Policy::kLazy, Policy::kEager, Policy::kNaive}) {
      CAPTURE(to_string(p));
      EngineOptions o;
      o.policy = p;
      o.num_threads = 2;
      o.max_pending = 4096;
      Engine eng(o);
      std::vector<Var> vars;
      for (int i = 0; i < 64; ++i) vars.push_back(eng.new_var());
      std::vector<std::uint64_t> counts(64, 0);
      const long before = peak_rss_kib();
      // 10 million by default; sanitizer runs ask for fewer (LAZYDAG_MEMORY_OPS).
      const int kOps = std::getenv("LAZYDAG_MEMORY_OPS") != nullptr
                           ? std::atoi(std::getenv("LAZYDAG_MEMORY_OPS"))
                           : 10'000'000;
      for (int i = 0; i < kOps; ++i) {
        std::uint64_t* c = &counts[i % 64];
        eng.push([c](const RunContext&) { ++*c; }, {}, {vars[i % 64]});
      }
      const long grown_kib = peak_rss_kib() - before;
      // Bound: 2 x max_pending nodes of well under 1 KiB, plus allocator slack.
      // Without the window the 10M nodes would need several GiB.
      MESSAGE("policy=" << to_string(p) << " peak_rss_growth_kib=" << grown_kib
                        << " peak_unfinished=" << eng.stats().peak_unfinished);
#if defined(__SANITIZE_THREAD__)
      // ThreadSanitizer keeps shadow memory and a vector clock per atomic
      // the engine synchronises on: a constant factor, still far below an
      // unbounded graph.
      CHECK(grown_kib < 256 * 1024);
#else
      CHECK(grown_kib < 64 * 1024);
#endif
      CHECK(eng.stats().peak_unfinished <= 2 * o.max_pending + 1);
      eng.waitall();
      std::uint64_t total = 0;
      for (auto c : counts) total += c;
      CHECK(total == kOps);
    }
  }
}

TEST_SUITE("engine") {
  // A var deleted while its writer is pending keeps its slot until that
  // writer is done, then the recorder frees it (at deletion, or in a sweep
  // of the deleted vars still busy): a program that makes, writes and drops
  // a var per op reuses a bounded set of slots.
  TEST_CASE("Memory.DeletedBusyVarsAreReused") {
    for (Policy p : {Policy::kLazy, Policy::kEager, Policy::kNaive}) {
      CAPTURE(to_string(p));
      EngineOptions o;
      o.policy = p;
      o.num_threads = 2;
      o.max_pending = 1024;
      Engine eng(o);
      std::atomic<int> ran{0};
      std::uint32_t highest = 0;
      constexpr int kVars = 200'000;
      for (int i = 0; i < kVars; ++i) {
        const Var v = eng.new_var();
        highest = std::max(highest, v.index);
        eng.push([&ran](const RunContext&) { ran.fetch_add(1, std::memory_order_relaxed); }, {}, {v});
        eng.delete_var(v);
        CHECK_THROWS_AS(eng.wait_to_read(v), lazydag::InvalidArgument);
      }
      eng.waitall();
      CHECK(ran.load() == kVars);
      // At most 2 x max_pending nodes are unfinished (the window), each
      // keeping one deleted var busy, and busy vars are swept when their
      // number doubles.
      CHECK(highest < 8 * 1024 + 64);
    }
  }
}
