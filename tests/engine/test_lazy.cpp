// Laziness and the waits: required subgraphs only, waitall, long chains,
// the pending window, wait_to_write, engine lifetime and options.
#include <doctest/doctest.h>

#include <lazydag/engine/engine.hpp>

#include <atomic>
#include <cstdlib>
#include <latch>
#include <thread>

#include "support.hpp"

using namespace lazydag;
using namespace lazydag::engine;
using lazydag::test::all_configs;

namespace {
// Lazy, two workers, a pending window of `max_pending` nodes.
EngineOptions lazy_with_window(std::size_t max_pending) {
  EngineOptions o;
  o.policy = Policy::kLazy;
  o.num_threads = 2;
  o.max_pending = max_pending;
  return o;
}
}  // namespace

TEST_SUITE("engine") {
  TEST_CASE("Lazy.WaitToReadRunsOnlyTheRequiredSubgraph" * doctest::timeout(120)) {
    for (const auto& cfg : all_configs()) {
      if (cfg.policy == Policy::kNaive) continue;  // naive runs each op inside push
      CAPTURE(cfg.str());
      Engine eng(cfg.options());
      Var x = eng.new_var();
      Var a = eng.new_var();
      Var y = eng.new_var();
      test::Gate gate;
      std::atomic<bool> unrelated_started{false};
      eng.push(
          [&](const RunContext&) {
            unrelated_started = true;
            REQUIRE(gate.wait());
          },
          {}, {x}, {.name = "parked"});
      int av = 0;
      int yv = 0;
      eng.push([&](const RunContext&) { av = 20; }, {}, {a}, {.name = "a"});
      eng.push([&](const RunContext&) { yv = av + 1; }, {a}, {y}, {.name = "y"});
      eng.wait_to_read(y);  // must return although "parked" never finishes
      CHECK(yv == 21);
      if (cfg.policy == Policy::kLazy) {
        CHECK_FALSE(unrelated_started.load());
        CHECK(eng.stats().unfinished == 1);
      }
      gate.open();
      eng.waitall();
      CHECK(unrelated_started.load());
    }
  }

  TEST_CASE("Lazy.WaitallRunsWorkNobodyReads" * doctest::timeout(60)) {
    for (const auto& cfg : all_configs()) {
      CAPTURE(cfg.str());
      Engine eng(cfg.options());
      std::atomic<int> ran{0};
      std::vector<Var> vars;
      for (int i = 0; i < 100; ++i) {
        vars.push_back(eng.new_var());
        eng.push([&](const RunContext&) { ran.fetch_add(1); }, {}, {vars.back()});
      }
      for (int i = 1; i < 100; ++i) {
        eng.push([&](const RunContext&) { ran.fetch_add(1); }, {vars[i - 1]}, {vars[i]});
      }
      eng.waitall();
      CHECK(ran.load() == 199);
      CHECK(eng.stats().unfinished == 0);
      CHECK(eng.stats().nodes_run == 199);
    }
  }

  TEST_CASE("Lazy.MillionNodeChainResolvesWithoutRecursion" * doctest::timeout(120)) {
    // Every policy: lazy keeps the whole chain pending (unbounded window), so
    // the request walks a million predecessors iteratively.
    for (Policy p : {Policy::kLazy, Policy::kEager, Policy::kNaive}) {
      CAPTURE(to_string(p));
      EngineOptions o;
      o.policy = p;
      o.num_threads = 2;
      o.max_pending = 0;
      Engine eng(o);
      Var v = eng.new_var();
      std::uint64_t value = 0;
      constexpr int kChain = 1'000'000;
      for (int i = 0; i < kChain; ++i) {
        eng.push([&value](const RunContext&) { ++value; }, {v}, {v}, {.name = "inc"});
      }
      if (p == Policy::kLazy) CHECK(eng.stats().unfinished == kChain);
      eng.wait_to_read(v);
      CHECK(value == kChain);
    }
  }

  TEST_CASE("Lazy.PendingWindowStartsTheOldestWork" * doctest::timeout(60)) {
    Engine eng(lazy_with_window(64));
    std::atomic<int> ran{0};
    std::vector<Var> vars;
    for (int i = 0; i < 1000; ++i) {
      vars.push_back(eng.new_var());
      eng.push([&](const RunContext&) { ran.fetch_add(1); }, {}, {vars.back()});
    }
    // Beyond the window the oldest nodes were started without any wait.
    CHECK(test::spin_until([&] { return ran.load() >= 1000 - 64; }));
    auto pending = eng.pending_nodes();
    std::size_t unrequested = 0;
    for (const auto& n : pending) unrequested += n.requested ? 0 : 1;
    CHECK(unrequested <= 64);
    CHECK(eng.stats().peak_unfinished <= 2 * 64 + 1);
    eng.waitall();
    CHECK(ran.load() == 1000);
  }

  // Each recording thread has a window of its own. When one starts its
  // oldest nodes, the nodes they read that another thread recorded (and
  // whose window keeps them unrequested) are started too: else they wait
  // for work that nothing starts.
  TEST_CASE("Lazy.WindowStartsWhatOtherThreadsRecordedFirst" * doctest::timeout(60)) {
    Engine eng(lazy_with_window(64));
    Var shared = eng.new_var();
    std::atomic<int> writes{0};
    std::atomic<int> reads{0};
    // Ten writes by another thread: within its window, so not started.
    std::thread([&] {
      for (int i = 0; i < 10; ++i) eng.push([&](const RunContext&) { writes.fetch_add(1); }, {}, {shared});
    }).join();
    std::vector<Var> sinks;
    for (int i = 0; i < 100; ++i) sinks.push_back(eng.new_var());
    for (int i = 0; i < 100; ++i) {
      eng.push([&](const RunContext&) { reads.fetch_add(1); }, {shared}, {sinks[static_cast<std::size_t>(i)]});
    }
    // This thread's window started its oldest reads, and with them the
    // writes they read, without any wait.
    CHECK(test::spin_until([&] { return reads.load() >= 100 - 64; }));
    CHECK(writes.load() == 10);
    eng.waitall();
    CHECK(reads.load() == 100);
  }

  // A recorder held back by the window (twice max_pending unfinished)
  // waits until the unfinished nodes are down to max_pending, not counting
  // those other threads' windows keep unrequested: nothing it runs would
  // start them, and those threads may be waiting for it. They stay
  // unrequested (lazy) until a wait needs them.
  TEST_CASE("Lazy.StalledRecorderDoesNotWaitForOtherThreadsWindows" * doctest::timeout(60)) {
    Engine eng(lazy_with_window(8));
    std::atomic<int> others_ran{0};
    std::vector<std::thread> others;
    // All alive until the end, so each has a list of its own (a list goes
    // with a thread slot, which passes to a later thread at exit).
    std::latch all_recorded(4);
    std::latch done(1);
    for (int t = 0; t < 3; ++t) {
      others.emplace_back([&] {
        Var v = eng.new_var();
        for (int i = 0; i < 8; ++i) eng.push([&](const RunContext&) { others_ran.fetch_add(1); }, {}, {v});
        all_recorded.count_down();
        done.wait();
      });
    }
    all_recorded.arrive_and_wait();  // 24 unrequested nodes, 8 per window
    CHECK(others_ran.load() == 0);
    std::atomic<int> mine_ran{0};
    std::atomic<bool> recorded{false};
    std::thread recorder([&] {
      Var mine = eng.new_var();
      for (int i = 0; i < 200; ++i) eng.push([&](const RunContext&) { mine_ran.fetch_add(1); }, {}, {mine});
      recorded = true;
    });
    const bool finished = test::spin_until([&] { return recorded.load(); });
    if (!finished) eng.waitall();  // starts everything: lets the recorder finish, to report
    recorder.join();
    CHECK(finished);
    CHECK(others_ran.load() == 0);
    CHECK(test::spin_until([&] { return mine_ran.load() >= 200 - 8; }));  // its window started its oldest
    done.count_down();
    for (auto& t : others) t.join();
    eng.waitall();
    CHECK(others_ran.load() == 24);
    CHECK(eng.stats().unfinished == 0);
  }

  TEST_CASE("Lazy.WaitToWriteWaitsForPendingReads" * doctest::timeout(60)) {
    for (const auto& cfg : all_configs()) {
      CAPTURE(cfg.str());
      Engine eng(cfg.options());
      Var v = eng.new_var();
      std::atomic<int> reads_done{0};
      eng.push([](const RunContext&) {}, {}, {v}, {.name = "init"});
      for (int i = 0; i < 16; ++i) {
        Var sink = eng.new_var();
        eng.push([&](const RunContext&) { reads_done.fetch_add(1); }, {v}, {sink},
                 {.name = "reader"});
      }
      eng.wait_to_write(v);
      CHECK(reads_done.load() == 16);
      eng.waitall();
    }
  }

  TEST_CASE("Lazy.WaitOnAFreshVarDoesNotDependOnUnrelatedWork" * doctest::timeout(60)) {
    EngineOptions o;
    o.policy = Policy::kLazy;
    o.num_threads = 1;
    o.max_pending = 0;
    Engine eng(o);
    Var x = eng.new_var();
    for (int i = 0; i < 100000; ++i) eng.push([](const RunContext&) {}, {x}, {x});
    Var fresh = eng.new_var();
    eng.wait_to_read(fresh);  // nothing written: returns at once, runs nothing
    CHECK(eng.stats().nodes_run == 0);
    eng.waitall();
    CHECK(eng.stats().nodes_run == 100000);
  }

  TEST_CASE("Lazy.DestroyingAnEngineRunsWhatWasRecorded" * doctest::timeout(60)) {
    for (const auto& cfg : all_configs()) {
      CAPTURE(cfg.str());
      std::atomic<int> ran{0};
      {
        Engine eng(cfg.options());
        Var v = eng.new_var();
        for (int i = 0; i < 500; ++i) {
          eng.push([&](const RunContext&) { ran.fetch_add(1); }, {v}, {v});
        }
      }
      CHECK(ran.load() == 500);
    }
  }

  TEST_CASE("Lazy.DeleteVarRunsAfterEveryEarlierAccess" * doctest::timeout(60)) {
    for (const auto& cfg : all_configs()) {
      CAPTURE(cfg.str());
      Engine eng(cfg.options());
      Var v = eng.new_var();
      Var out = eng.new_var();
      auto storage = std::make_shared<std::vector<int>>(1000, 3);
      std::weak_ptr<std::vector<int>> alive = storage;
      int sum = 0;
      eng.push(
          [storage](const RunContext&) {
            for (int& x : *storage) x += 1;
          },
          {v}, {v});
      eng.push(
          [storage, &sum](const RunContext&) {
            for (int x : *storage) sum += x;
          },
          {v}, {out});
      storage.reset();
      eng.delete_var(v);
      CHECK_THROWS_AS(eng.push([](const RunContext&) {}, {v}, {}), InvalidArgument);
      eng.wait_to_read(out);
      CHECK(sum == 4000);
      eng.waitall();
      CHECK(alive.expired());  // captures are released once their node ran
      // The slot is reused with a new generation; the old handle stays dead.
      Var w = eng.new_var();
      CHECK_THROWS_AS(eng.wait_to_read(v), InvalidArgument);
      eng.push([](const RunContext&) {}, {}, {w});
      eng.waitall();
    }
  }

  TEST_CASE("Lazy.DefaultEngineAndOptionsFromEnvironment" * doctest::timeout(60)) {
    Engine& e = Engine::get();
    CHECK(&e == &Engine::get());
    Var v = e.new_var();
    int x = 0;
    e.push([&](const RunContext&) { x = 5; }, {}, {v});
    e.wait_to_read(v);
    CHECK(x == 5);
    e.delete_var(v);

    ::setenv("LAZYDAG_ENGINE", "eager", 1);
    ::setenv("LAZYDAG_NUM_THREADS", "3", 1);
    ::setenv("LAZYDAG_MAX_PENDING", "77", 1);
    EngineOptions o = EngineOptions::from_env();
    CHECK(o.policy == Policy::kEager);
    CHECK(o.num_threads == 3);
    CHECK(o.max_pending == 77);
    Engine custom(o);
    CHECK(custom.num_threads() == 3);
    ::setenv("LAZYDAG_ENGINE", "fast", 1);
    CHECK_THROWS_AS((void)EngineOptions::from_env(), InvalidArgument);
    ::setenv("LAZYDAG_ENGINE", "lazy", 1);
    ::setenv("LAZYDAG_NUM_THREADS", "two", 1);
    CHECK_THROWS_AS((void)EngineOptions::from_env(), InvalidArgument);
    ::unsetenv("LAZYDAG_ENGINE");
    ::unsetenv("LAZYDAG_NUM_THREADS");
    ::unsetenv("LAZYDAG_MAX_PENDING");
  }
}

TEST_SUITE("engine") {
  TEST_CASE("Lazy.RunContextNamesTheDeviceAndWorker" * doctest::timeout(60)) {
    for (const auto& cfg : all_configs()) {
      CAPTURE(cfg.str());
      Engine eng(cfg.options());
      std::atomic<int> bad{0};
      std::atomic<int> on_workers{0};
      std::vector<Var> vars;
      for (int i = 0; i < 200; ++i) {
        vars.push_back(eng.new_var());
        eng.push(
            [&](const RunContext& ctx) {
              if (!(ctx.device == Device{}) || ctx.stream != nullptr ||
                  ctx.worker_index < -1 || ctx.worker_index >= eng.num_threads()) {
                bad.fetch_add(1);
              }
              if (ctx.worker_index >= 0) on_workers.fetch_add(1);
            },
            {}, {vars.back()});
      }
      eng.waitall();
      CHECK(bad.load() == 0);
      if (cfg.policy == Policy::kNaive) CHECK(on_workers.load() == 0);  // all on the caller
    }
  }
}
