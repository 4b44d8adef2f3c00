// Failing ops poison what they write; waits rethrow with the op's name; bad
// input is refused at the call site and records nothing.
#include <doctest/doctest.h>

#include <lazydag/engine/engine.hpp>

#include <atomic>
#include <functional>
#include <iostream>
#include <sstream>
#include <stdexcept>

#include "support.hpp"

using namespace lazydag;
using namespace lazydag::engine;
using lazydag::test::all_configs;

namespace {
void nothing(const RunContext&) {}
}  // namespace

TEST_SUITE("engine") {
  TEST_CASE("Errors.PoisonPropagatesAndIsRethrownWithTheOpName" * doctest::timeout(60)) {
    for (const auto& cfg : all_configs()) {
      CAPTURE(cfg.str());
      Engine eng(cfg.options());
      Var a = eng.new_var();
      Var b = eng.new_var();
      Var c = eng.new_var();
      Var d = eng.new_var();
      std::atomic<bool> dependent_ran{false};
      eng.push([](const RunContext&) { throw std::runtime_error("disk on fire"); }, {}, {a},
               {.name = "explode"});
      eng.push([&](const RunContext&) { dependent_ran = true; }, {a}, {b}, {.name = "uses_a"});
      eng.push([&](const RunContext&) { dependent_ran = true; }, {b}, {c}, {.name = "uses_b"});
      eng.push(nothing, {}, {d}, {.name = "fine"});
      try {
        eng.wait_to_read(c);
        FAIL("wait_to_read on a poisoned var must throw");
      } catch (const OpError& e) {
        CHECK(e.op_name() == "explode");
        CHECK(std::string(e.what()).find("disk on fire") != std::string::npos);
        CHECK(std::string(e.what()).find("explode") != std::string::npos);
        // the original exception is nested and carried
        CHECK_THROWS_WITH_AS(std::rethrow_exception(e.cause()), "disk on fire",
                             std::runtime_error);
        CHECK_THROWS_AS(e.rethrow_nested(), std::runtime_error);
      }
      CHECK_FALSE(dependent_ran.load());
      CHECK_NOTHROW(eng.wait_to_read(d));
      // Reported once by wait_to_read: waitall has nothing left to report.
      CHECK_NOTHROW(eng.waitall());
      CHECK_THROWS_AS(eng.wait_to_read(a), OpError);  // still poisoned
      EngineStats s = eng.stats();
      CHECK(s.nodes_failed == 1);
      CHECK(s.nodes_skipped == 2);

      // A successful write that does not read the poisoned var clears it...
      eng.push(nothing, {}, {b}, {.name = "overwrite_b"});
      CHECK_NOTHROW(eng.wait_to_read(b));
      // ...while a read-modify-write of a poisoned var stays poisoned.
      eng.push([&](const RunContext&) { dependent_ran = true; }, {a}, {a}, {.name = "rmw_a"});
      CHECK_THROWS_AS(eng.wait_to_read(a), OpError);
      CHECK_FALSE(dependent_ran.load());
    }
  }

  TEST_CASE("Errors.WaitallReportsFailuresNobodyRead" * doctest::timeout(60)) {
    for (const auto& cfg : all_configs()) {
      CAPTURE(cfg.str());
      Engine eng(cfg.options());
      for (int i = 0; i < 5; ++i) {
        Var v = eng.new_var();
        eng.push(nothing, {}, {v});
      }
      Var bad1 = eng.new_var();
      Var bad2 = eng.new_var();
      eng.push([](const RunContext&) { throw std::logic_error("first"); }, {}, {bad1},
               {.name = "bad1"});
      eng.push([](const RunContext&) { throw 42; }, {}, {bad2}, {.name = "bad2"});
      try {
        eng.waitall();
        FAIL("waitall must report the unread failures");
      } catch (const OpError& e) {
        CHECK(e.op_name() == "bad1");  // the oldest, whatever order they ran in
        CHECK(std::string(e.what()).find("1 more") != std::string::npos);
      }
      CHECK_NOTHROW(eng.waitall());  // reported once
      // The non-standard exception is carried too.
      try {
        eng.wait_to_read(bad2);
        FAIL("bad2 is poisoned");
      } catch (const OpError& e) {
        CHECK(e.op_name() == "bad2");
        CHECK_THROWS_AS(std::rethrow_exception(e.cause()), int);
      }
    }
  }

  TEST_CASE("Errors.NoWaitHangsAfterFailures" * doctest::timeout(60)) {
    for (const auto& cfg : all_configs()) {
      CAPTURE(cfg.str());
      Engine eng(cfg.options());
      std::vector<Var> vars;
      for (int i = 0; i < 32; ++i) vars.push_back(eng.new_var());
      for (int i = 0; i < 2000; ++i) {
        Var r = vars[(i * 7) % 32];
        Var w = vars[(i * 13 + 5) % 32];
        bool fail = i % 97 == 0;
        eng.push(
            [fail](const RunContext&) {
              if (fail) throw std::runtime_error("injected");
            },
            {r}, {w});
      }
      for (Var v : vars) {
        try {
          eng.wait_to_write(v);
        } catch (const OpError&) {
        }
      }
      try {
        eng.waitall();
      } catch (const OpError&) {
      }
      CHECK(eng.stats().unfinished == 0);
      CHECK(eng.stats().nodes_failed >= 1);
    }
  }

  TEST_CASE("Errors.BadInputIsRefusedAndRecordsNothing" * doctest::timeout(60)) {
    for (const auto& cfg : all_configs()) {
      CAPTURE(cfg.str());
      Engine eng(cfg.options());
      Var good = eng.new_var();
      Var gone = eng.new_var();
      eng.delete_var(gone);
      Var unknown{12345, 1};
      Var null_var{};
      auto recorded = [&] { return eng.stats().nodes_recorded; };
      const auto before = recorded();

      CHECK_THROWS_WITH_AS(eng.push(Function{}, {}, {good}, {.name = "empty"}),
                           doctest::Contains("empty function"), InvalidArgument);
      CHECK_THROWS_AS(eng.push(std::function<void(const RunContext&)>{}, {}, {good}),
                      InvalidArgument);
      CHECK_THROWS_WITH_AS(eng.push(nothing, {good}, {gone}, {.name = "w_gone"}),
                           doctest::Contains("deleted"), InvalidArgument);
      CHECK_THROWS_WITH_AS(eng.push(nothing, {gone}, {good}), doctest::Contains("deleted"),
                           InvalidArgument);
      CHECK_THROWS_WITH_AS(eng.push(nothing, {unknown}, {good}), doctest::Contains("unknown var"),
                           InvalidArgument);
      CHECK_THROWS_AS(eng.push(nothing, {}, {null_var}), InvalidArgument);
      CHECK_THROWS_WITH_AS(eng.wait_to_read(gone), doctest::Contains("deleted"), InvalidArgument);
      CHECK_THROWS_AS(eng.wait_to_write(unknown), InvalidArgument);
      CHECK_THROWS_AS(eng.delete_var(gone), InvalidArgument);
      Device negative{DeviceKind::kCpu, -1};
      CHECK_THROWS_AS(eng.push(nothing, {}, {good}, {.device = negative, .name = "elsewhere"}),
                      InvalidArgument);
      CHECK(recorded() == before);  // nothing recorded by any refused call

      // A var of another engine is unknown here (no accidental aliasing).
      Engine other_engine(cfg.options());
      for (int i = 0; i < 10; ++i) (void)other_engine.new_var();
      Var foreign = other_engine.new_var();
      CHECK_THROWS_AS(eng.wait_to_read(foreign), InvalidArgument);

      // The engine is unaffected.
      int x = 0;
      eng.push([&](const RunContext&) { x = 9; }, {}, {good});
      eng.wait_to_read(good);
      CHECK(x == 9);
    }
  }

  TEST_CASE("Errors.WaitingFromInsideAnOpIsRefused" * doctest::timeout(60)) {
    for (const auto& cfg : all_configs()) {
      CAPTURE(cfg.str());
      Engine eng(cfg.options());
      Var a = eng.new_var();
      Var b = eng.new_var();
      eng.push([&](const RunContext&) { eng.wait_to_read(a); }, {}, {b}, {.name = "nested_wait"});
      try {
        eng.wait_to_read(b);
        FAIL("the nested wait must fail the op");
      } catch (const OpError& e) {
        CHECK(e.op_name() == "nested_wait");
        CHECK(std::string(e.what()).find("inside a running op") != std::string::npos);
      }
    }
  }

  TEST_CASE("Errors.WatchdogTurnsAHangIntoAReport" * doctest::timeout(60)) {
    // eager: the stuck op starts on the only worker at once, so the wait
    // below is a waiter that sleeps (not one running the stuck op itself)
    for (Policy p : {Policy::kEager}) {
      CAPTURE(to_string(p));
      EngineOptions o;
      o.policy = p;
      o.num_threads = 1;
      o.watchdog_seconds = 0.3;
      Engine eng(o);
      Var a = eng.new_var();
      Var b = eng.new_var();
      test::Gate gate;
      std::atomic<bool> parked{false};
      eng.push(
          [&](const RunContext&) {
            parked = true;
            (void)gate.wait(30.0);
          },
          {}, {a}, {.name = "stuck_op"});
      REQUIRE(test::spin_until([&] { return parked.load(); }));
      eng.push(nothing, {a}, {b}, {.name = "after_stuck"});
      std::ostringstream err;
      auto* old = std::cerr.rdbuf(err.rdbuf());
      std::string report;
      try {
        eng.wait_to_read(b);
      } catch (const WatchdogTimeout& e) {
        report = e.what();
      }
      std::cerr.rdbuf(old);
      CHECK(report.find("'stuck_op'") != std::string::npos);
      CHECK(report.find("running") != std::string::npos);
      CHECK(report.find("'after_stuck'") != std::string::npos);
      CHECK(report.find("1 input(s) pending") != std::string::npos);
      gate.open();
      // the engine is intact: the work finishes and the var reads normally
      CHECK_NOTHROW(eng.wait_to_read(b));
      eng.waitall();
    }
  }
}
