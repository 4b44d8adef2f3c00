// Bad input at the engine's edges: handles of another engine, options out
// of range, devices outside the enumeration, work recorded by running nodes
// while the engine is destroyed, and waits after a watchdog timeout. Each
// is refused at the call site recording nothing, or runs to completion.
#include <doctest/doctest.h>

#include <lazydag/engine/engine.hpp>

#include <atomic>
#include <cmath>
#include <iostream>
#include <limits>
#include <sstream>
#include <string>
#include <thread>

#include "support.hpp"

using namespace lazydag;
using namespace lazydag::engine;
using lazydag::test::all_configs;

namespace {

void nothing(const RunContext&) {}

bool mentions(const std::exception& e, const std::string& what) {
  return std::string(e.what()).find(what) != std::string::npos;
}

// Silences std::cerr for a scope (the watchdog prints its report there).
class QuietCerr {
 public:
  QuietCerr() : old_(std::cerr.rdbuf(sink_.rdbuf())) {}
  ~QuietCerr() { std::cerr.rdbuf(old_); }
  QuietCerr(const QuietCerr&) = delete;
  QuietCerr& operator=(const QuietCerr&) = delete;

 private:
  std::ostringstream sink_;
  std::streambuf* old_;
};

}  // namespace

TEST_SUITE("engine") {
  TEST_CASE("Edges.AVarOfAnotherEngineIsRefused" * doctest::timeout(60)) {
    for (const auto& cfg : all_configs()) {
      CAPTURE(cfg.str());
      Engine a(cfg.options());
      Engine b(cfg.options());
      // Same index and generation in both engines: only the owner tells them apart.
      Var va = a.new_var();
      Var vb = b.new_var();
      REQUIRE(va.index == vb.index);
      REQUIRE(va.generation == vb.generation);
      CHECK_FALSE(va == vb);
      const std::uint64_t before = a.stats().nodes_recorded;
      CHECK_THROWS_AS(a.push(nothing, {vb}, {va}), InvalidArgument);
      CHECK_THROWS_AS(a.push(nothing, {va}, {vb}), InvalidArgument);
      CHECK_THROWS_AS(a.wait_to_read(vb), InvalidArgument);
      CHECK_THROWS_AS(a.wait_to_write(vb), InvalidArgument);
      CHECK_THROWS_AS(a.delete_var(vb), InvalidArgument);
      try {
        a.push(nothing, {vb}, {});
      } catch (const InvalidArgument& e) {
        CHECK(mentions(e, "another engine"));
      }
      CHECK(a.stats().nodes_recorded == before);
      // Both handles still work in their own engine.
      std::atomic<int> ran{0};
      a.push([&](const RunContext&) { ++ran; }, {}, {va});
      b.push([&](const RunContext&) { ++ran; }, {}, {vb});
      a.wait_to_read(va);
      b.wait_to_read(vb);
      CHECK(ran.load() == 2);
      a.delete_var(va);
      b.delete_var(vb);
    }
  }

  TEST_CASE("Edges.OptionsOutOfRangeAreRefusedWithTheRange" * doctest::timeout(60)) {
    auto refused = [](EngineOptions o, const std::string& field) {
      try {
        Engine eng(o);
        FAIL("options with a bad " << field << " were accepted");
      } catch (const InvalidArgument& e) {
        CHECK_MESSAGE(mentions(e, field), e.what());
      }
    };
    EngineOptions o;
    o.num_threads = 100000;
    refused(o, "num_threads");
    o.num_threads = -1;
    refused(o, "num_threads");
    o = {};
    o.policy = static_cast<Policy>(7);
    refused(o, "policy");
    o = {};
    o.max_pending = std::size_t{1} << 40;
    refused(o, "max_pending");
    o = {};
    o.max_in_flight = 0;
    refused(o, "max_in_flight");
    o = {};
    o.watchdog_seconds = -1;
    refused(o, "watchdog_seconds");
    o.watchdog_seconds = std::nan("");
    refused(o, "watchdog_seconds");
    // The largest thread count accepted works.
    o = {};
    o.num_threads = 64;
    Engine eng(o);
    Var v = eng.new_var();
    std::atomic<int> ran{0};
    for (int i = 0; i < 200; ++i) eng.push([&](const RunContext&) { ++ran; }, {}, {eng.new_var()});
    eng.push([&](const RunContext&) { ++ran; }, {}, {v});
    eng.waitall();
    CHECK(ran.load() == 201);
  }

  TEST_CASE("Edges.AHugeWatchdogNeverFiresEarly" * doctest::timeout(60)) {
    for (double seconds : {1e10, 1e300, std::numeric_limits<double>::infinity()}) {
      CAPTURE(seconds);
      EngineOptions o;
      o.policy = Policy::kEager;
      o.num_threads = 2;
      o.watchdog_seconds = seconds;
      Engine eng(o);
      Var a = eng.new_var();
      // A long op on a worker, so this thread's wait parks with its timeout;
      // meanwhile another thread's waits complete, waking every parked
      // waiter, which then checks its deadline.
      std::atomic<bool> started{false};
      std::atomic<bool> helper_done{false};
      eng.push(
          [&](const RunContext&) {
            started = true;
            (void)test::spin_until([&] { return helper_done.load(); });
          },
          {}, {a});
      REQUIRE(test::spin_until([&] { return started.load(); }));
      std::thread helper([&] {
        Var c = eng.new_var();
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
        while (std::chrono::steady_clock::now() < until) {
          eng.push(nothing, {}, {c});
          eng.wait_to_read(c);
        }
        helper_done = true;
      });
      CHECK_NOTHROW(eng.wait_to_read(a));
      helper.join();
      CHECK_NOTHROW(eng.waitall());
    }
  }

  TEST_CASE("Edges.ADeviceOutsideTheEnumerationIsRefused" * doctest::timeout(60)) {
    Engine eng(EngineOptions{});
    Var v = eng.new_var();
    PushOptions o;
    o.device = Device{static_cast<DeviceKind>(9), 0};
    try {
      eng.push(nothing, {}, {v}, o);
      FAIL("an unknown device kind was accepted");
    } catch (const InvalidArgument& e) {
      CHECK_MESSAGE(mentions(e, "device kind"), e.what());
    }
    CHECK_THROWS_AS((void)eng.stream_device(Device{static_cast<DeviceKind>(9), 0}), InvalidArgument);
    o = {};
    o.stream = StreamKind::kCopyIn;  // on the CPU
    CHECK_THROWS_AS(eng.push(nothing, {}, {v}, o), InvalidArgument);
    o.stream = static_cast<StreamKind>(5);
    o.device = Device{DeviceKind::kSim, 0};
    CHECK_THROWS_AS(eng.push(nothing, {}, {v}, o), InvalidArgument);
    CHECK(eng.stats().nodes_recorded == 0);
  }

  TEST_CASE("Edges.DestroyingAnEngineRunsWhatItsNodesRecord" * doctest::timeout(120)) {
    // Each node records another (and that one a third) while the engine is
    // being destroyed: nothing recorded is lost, under every policy.
    for (const auto& cfg : all_configs()) {
      CAPTURE(cfg.str());
      std::atomic<int> ran{0};
      {
        Engine eng(cfg.options());
        for (int i = 0; i < 100; ++i) {
          Var v = eng.new_var();
          eng.push(
              [&eng, &ran, v](const RunContext&) {
                ++ran;
                eng.push(
                    [&eng, &ran, v](const RunContext&) {
                      ++ran;
                      eng.push([&ran](const RunContext&) { ++ran; }, {v}, {});
                    },
                    {v}, {});
              },
              {}, {v});
        }
      }
      CHECK(ran.load() == 300);
    }
  }

  TEST_CASE("Edges.WaitsAfterAWatchdogTimeoutComplete" * doctest::timeout(240)) {
    for (Policy p : {Policy::kLazy, Policy::kEager}) {
      for (int round = 0; round < 8; ++round) {
        CAPTURE(to_string(p));
        CAPTURE(round);
        EngineOptions o;
        o.policy = p;
        o.num_threads = 1 + round % 2;
        o.watchdog_seconds = 0.2;
        Engine eng(o);
        Var a = eng.new_var();
        Var b = eng.new_var();
        test::Gate gate;
        std::atomic<bool> parked{false};
        std::atomic<int> ran{0};
        eng.push(
            [&](const RunContext&) {
              parked = true;
              (void)gate.wait(30.0);
            },
            {}, {a}, {.name = "stuck_op"});
        eng.push([&](const RunContext&) { ++ran; }, {a}, {b}, {.name = "after_stuck"});
        {
          QuietCerr quiet;  // the watchdog's reports; one swap for both threads
          std::jthread helper;  // joined on every way out of the scope
          if (p == Policy::kLazy) {
            // Nothing runs the stuck op until a wait asks for it: another
            // thread's wait does, so that this thread's wait only sleeps.
            helper = std::jthread([&] {
              try {
                eng.wait_to_read(a);
              } catch (const WatchdogTimeout&) {
              }
            });
          }
          REQUIRE(test::spin_until([&] { return parked.load(); }));
          if (round % 2 == 0) {
            CHECK_THROWS_AS(eng.wait_to_read(b), WatchdogTimeout);
          } else {
            CHECK_THROWS_AS(eng.waitall(), WatchdogTimeout);
          }
          gate.open();
        }
        // More work after the timeout: chains through a and b, and fresh vars.
        for (int i = 0; i < 50; ++i) {
          eng.push([&](const RunContext&) { ++ran; }, {b}, {a});
          eng.push([&](const RunContext&) { ++ran; }, {a}, {b});
          eng.push([&](const RunContext&) { ++ran; }, {}, {eng.new_var()});
        }
        // Every later wait returns: a slow machine may need several watchdog
        // periods, a lost node would need them all.
        bool done = false;
        for (int attempt = 0; attempt < 100 && !done; ++attempt) {
          QuietCerr quiet;
          try {
            eng.waitall();
            done = true;
          } catch (const WatchdogTimeout&) {
          }
        }
        CHECK(done);
        CHECK(ran.load() == 151);
        CHECK_NOTHROW(eng.wait_to_read(b));
      }
    }
  }
}
