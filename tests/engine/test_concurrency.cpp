// Several frontend threads pushing and waiting at once, on shared and on
// disjoint vars, with deletes and new vars in flight.
#include <doctest/doctest.h>

#include <lazydag/engine/engine.hpp>

#include <atomic>
#include <thread>

#include "support.hpp"

using namespace lazydag;
using namespace lazydag::engine;
using lazydag::test::all_configs;

TEST_SUITE("engine") {
  TEST_CASE("Concurrency.FrontendThreadsOnSharedAndDisjointVars" * doctest::timeout(180)) {
    for (const auto& cfg : all_configs()) {
      CAPTURE(cfg.str());
      Engine eng(cfg.options(/*max_pending=*/256));
      constexpr int kThreads = 4;
      constexpr int kOps = 2000;
      Var shared = eng.new_var();
      std::uint64_t shared_value = 0;  // written only by ops on `shared`
      std::vector<std::uint64_t> own_values(kThreads, 0);
      std::atomic<int> wrong_reads{0};
      std::vector<std::thread> threads;
      for (int t = 0; t < kThreads; ++t) {
        threads.emplace_back([&, t] {
          Var own = eng.new_var();
          std::uint64_t& mine = own_values[t];
          for (int i = 1; i <= kOps; ++i) {
            eng.push([&mine](const RunContext&) { ++mine; }, {own}, {own}, {.name = "own_inc"});
            if (i % 4 == 0) {
              eng.push([&shared_value](const RunContext&) { ++shared_value; }, {shared},
                       {shared}, {.name = "shared_inc"});
            }
            if (i % 250 == 0) {
              eng.wait_to_read(own);
              if (mine != static_cast<std::uint64_t>(i)) wrong_reads.fetch_add(1);
              eng.wait_to_read(shared);
            }
            if (i % 500 == 0) {
              // a short-lived var created, used and deleted while work is pending
              Var tmp = eng.new_var();
              eng.push([](const RunContext&) {}, {own}, {tmp});
              eng.delete_var(tmp);
            }
          }
          eng.wait_to_read(own);
          eng.delete_var(own);
        });
      }
      for (auto& th : threads) th.join();
      eng.wait_to_read(shared);
      CHECK(wrong_reads.load() == 0);
      CHECK(shared_value == kThreads * kOps / 4);
      for (auto v : own_values) CHECK(v == kOps);
      eng.waitall();
      CHECK(eng.stats().unfinished == 0);
    }
  }

  TEST_CASE("Concurrency.ThreadsWaitingOnOneVarAllReturn" * doctest::timeout(120)) {
    for (const auto& cfg : all_configs()) {
      CAPTURE(cfg.str());
      Engine eng(cfg.options());
      Var v = eng.new_var();
      std::uint64_t value = 0;
      for (int i = 0; i < 20000; ++i) {
        eng.push([&value](const RunContext&) { ++value; }, {v}, {v});
      }
      std::atomic<int> ok{0};
      std::vector<std::thread> threads;
      for (int t = 0; t < 4; ++t) {
        threads.emplace_back([&] {
          eng.wait_to_read(v);
          if (value == 20000) ok.fetch_add(1);
        });
      }
      for (auto& th : threads) th.join();
      CHECK(ok.load() == 4);
    }
  }

  // A wait on a node just pushed may run it on the waiting thread without
  // the waiter machinery (lazy: its inputs done; eager: the newest queue
  // entry). Other threads wait on the same var meanwhile, so the owner's
  // claim races with their help lists and the workers: every round's node
  // runs once, and every wait sees its write.
  TEST_CASE("Concurrency.WaitsRacingOnAJustPushedNode" * doctest::timeout(180)) {
    for (const auto& cfg : all_configs()) {
      CAPTURE(cfg.str());
      Engine eng(cfg.options());
      Var v = eng.new_var();
      constexpr int kRounds = 3000;
      std::atomic<std::uint64_t> value{0};
      std::atomic<int> round{0};
      std::atomic<int> stale{0};
      std::vector<std::thread> readers;
      for (int t = 0; t < 3; ++t) {
        readers.emplace_back([&] {
          for (int seen = 0; seen < kRounds;) {
            const int r = round.load(std::memory_order_acquire);
            if (r == seen) {
              std::this_thread::yield();
              continue;
            }
            eng.wait_to_read(v);  // round r's node was recorded before `round` said r
            if (value.load(std::memory_order_relaxed) < static_cast<std::uint64_t>(r)) stale.fetch_add(1);
            seen = r;
          }
        });
      }
      const std::thread::id me = std::this_thread::get_id();
      std::atomic<int> ran_here{0};
      for (int i = 1; i <= kRounds; ++i) {
        eng.push(
            [&](const RunContext&) {
              value.fetch_add(1, std::memory_order_relaxed);
              if (std::this_thread::get_id() == me) ran_here.fetch_add(1, std::memory_order_relaxed);
            },
            {v}, {v});
        round.store(i, std::memory_order_release);
        eng.wait_to_read(v);
        CHECK(value.load(std::memory_order_relaxed) == static_cast<std::uint64_t>(i));
      }
      for (auto& th : readers) th.join();
      eng.waitall();
      CHECK(stale.load() == 0);
      CHECK(value.load() == kRounds);
      CHECK(eng.stats().nodes_run == kRounds);
      // Under lazy a node waits unrequested until a wait asks for it, and
      // the recorder's own wait, right after the push, usually comes first.
      if (cfg.policy == Policy::kLazy) CHECK(ran_here.load() > 0);
    }
  }

  TEST_CASE("Concurrency.OpsMayRecordMoreOps" * doctest::timeout(60)) {
    for (const auto& cfg : all_configs()) {
      CAPTURE(cfg.str());
      Engine eng(cfg.options());
      Var a = eng.new_var();
      Var b = eng.new_var();
      std::atomic<int> inner_ran{0};
      eng.push(
          [&](const RunContext&) {
            // recording from a running op is allowed (waiting is not)
            eng.push([&](const RunContext&) { inner_ran.fetch_add(1); }, {a}, {b});
          },
          {}, {a}, {.name = "outer"});
      eng.waitall();
      eng.waitall();  // the inner node was recorded during the first waitall
      CHECK(inner_ran.load() == 1);
    }
  }
}
