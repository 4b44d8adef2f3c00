// Device faults and completion attribution. The CompletionLedger (shared by
// the sim and CUDA backends) is tested directly: a completion names its
// launch, a launch whose completion cannot be recorded fails alone and in
// stream order, a fault fails what is pending and nothing later, and an
// error never outlives its launch. Then the same through the engine, with
// faults injected on the emulated device (sim::fault, sim::fail_completion).
#include <doctest/doctest.h>

#include <lazydag/engine/engine.hpp>
#include <lazydag/engine/stream.hpp>

#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "../../engine/src/stream_ledger.hpp"
#include "support.hpp"

using namespace lazydag;
using namespace lazydag::engine;

namespace {

struct Task final : StreamTask {
  int id = 0;
  void run(const RunContext&) noexcept override {}
  void complete(std::exception_ptr, DeviceInterval) noexcept override {}
};

using Ledger = detail::CompletionLedger<int>;

std::string message(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
}

std::exception_ptr error(const std::string& what) { return std::make_exception_ptr(Error(what)); }

// The reported launches' ids and errors ("" for success), in report order.
std::vector<std::pair<int, std::string>> take(Ledger& l, int stream = -1) {
  std::vector<Ledger::Done> done;
  l.take_ready(done, stream);
  std::vector<std::pair<int, std::string>> out;
  for (auto& d : done) out.emplace_back(static_cast<Task*>(d.task)->id, d.error ? message(d.error) : "");
  return out;
}

using Reports = std::vector<std::pair<int, std::string>>;

constexpr Device kSim0{DeviceKind::kSim, 0};

PushOptions on(Device d, StreamKind k, std::string_view name) {
  PushOptions o;
  o.device = d;
  o.stream = k;
  o.name = name;
  return o;
}

// What wait_to_read(v) throws, or "" when it returns.
std::string wait_error(Engine& eng, Var v) {
  try {
    eng.wait_to_read(v);
    return "";
  } catch (const OpError& e) {
    return e.what();
  }
}

}  // namespace

TEST_SUITE("faults") {
  TEST_CASE("Ledger.ACompletionNamesItsLaunchAndAFailedRecordingFailsOnlyItsOwn") {
    Ledger l(2);
    std::vector<Task> t(4);
    for (int i = 0; i < 4; ++i) t[static_cast<std::size_t>(i)].id = i;
    const auto a = l.begin(0, &t[0], 0);
    const auto b = l.begin(0, &t[1], 0);
    const auto c = l.begin(0, &t[2], 0);
    const auto d = l.begin(1, &t[3], 0);
    // b's completion could not be recorded: it fails, but only after a,
    // which the device has not finished yet (counting completions would
    // report a here, with b's error).
    l.fail(b, error("record failed"));
    CHECK(take(l).empty());
    l.signal(c);
    CHECK(take(l).empty());
    l.signal(d);  // another stream does not wait for stream 0
    CHECK(take(l) == Reports{{3, ""}});
    l.signal(a);
    CHECK(take(l) == Reports{{0, ""}, {1, "record failed"}, {2, ""}});
    CHECK(l.pending() == 0);
    // The error went with b: a later launch on that stream is clean.
    const auto e = l.begin(0, &t[1], 0);
    l.signal(e);
    l.signal(b);  // a stale signal for a launch already reported: ignored
    CHECK(take(l) == Reports{{1, ""}});
    CHECK(l.pending() == 0);
  }

  TEST_CASE("Ledger.AFaultFailsWhatIsPendingButNotARunStillExecutingNorLaterLaunches") {
    Ledger l(3);
    std::vector<Task> t(5);
    for (int i = 0; i < 5; ++i) t[static_cast<std::size_t>(i)].id = i;
    const auto a = l.begin(0, &t[0], 0);
    l.signal(a);
    const auto b = l.begin(0, &t[1], 0);
    const auto c = l.begin(1, &t[2], 0);
    l.ran(b);
    // c's run() has not returned: the fault must not complete it under it.
    l.fault(error("device fault"));
    CHECK(take(l) == Reports{{0, ""}, {1, "device fault"}});
    l.signal(c);  // comes after the fault: the fault's error stays
    CHECK(take(l) == Reports{{2, "device fault"}});
    // Sticky: nothing is registered any more.
    CHECK_THROWS_WITH_AS(l.begin(2, &t[3], 0), "device fault", Error);
    CHECK(l.pending() == 0);
    l.fault(error("second fault"));  // the first fault wins
    CHECK(message(l.fault()) == "device fault");
  }

  TEST_CASE("Ledger.CancelForgetsALaunchNotEnqueued") {
    Ledger l(1);
    Task a;
    Task b;
    b.id = 1;
    const auto ta = l.begin(0, &a, 0);
    const auto tb = l.begin(0, &b, 0);
    l.cancel(ta);
    l.signal(tb);
    CHECK(take(l) == Reports{{1, ""}});
  }

  TEST_CASE("Ledger.RandomInterleavingsReportEachLaunchOnceInStreamOrder") {
    std::mt19937 rng(7);
    for (int round = 0; round < 200; ++round) {
      const int streams = 1 + static_cast<int>(rng() % 3);
      Ledger l(streams);
      const int n = 40;
      std::vector<Task> t(static_cast<std::size_t>(n));
      std::vector<std::uint64_t> ticket(static_cast<std::size_t>(n));
      std::vector<int> stream_of(static_cast<std::size_t>(n));
      std::vector<bool> failed(static_cast<std::size_t>(n));
      for (int i = 0; i < n; ++i) {
        t[static_cast<std::size_t>(i)].id = i;
        stream_of[static_cast<std::size_t>(i)] = static_cast<int>(rng() % static_cast<unsigned>(streams));
        ticket[static_cast<std::size_t>(i)] = l.begin(stream_of[static_cast<std::size_t>(i)], &t[static_cast<std::size_t>(i)], i);
      }
      std::vector<int> order(static_cast<std::size_t>(n));
      for (int i = 0; i < n; ++i) order[static_cast<std::size_t>(i)] = i;
      std::shuffle(order.begin(), order.end(), rng);
      Reports reported;
      for (int i : order) {
        if (rng() % 5 == 0) {
          failed[static_cast<std::size_t>(i)] = true;
          l.fail(ticket[static_cast<std::size_t>(i)], error("f" + std::to_string(i)));
        } else {
          l.signal(ticket[static_cast<std::size_t>(i)]);
        }
        for (auto& r : take(l)) reported.push_back(r);
      }
      REQUIRE(reported.size() == static_cast<std::size_t>(n));
      std::vector<int> last(static_cast<std::size_t>(streams), -1);
      for (auto& [id, err] : reported) {
        CHECK(err == (failed[static_cast<std::size_t>(id)] ? "f" + std::to_string(id) : std::string()));
        int& prev = last[static_cast<std::size_t>(stream_of[static_cast<std::size_t>(id)])];
        CHECK(id > prev);  // launch order within a stream
        prev = id;
      }
    }
  }

  TEST_CASE("Sim.ADeviceFaultFailsPendingAndLaterWorkAndNothingHangs") {
    for (const auto& cfg : test::all_configs()) {
      CAPTURE(cfg.str());
      Engine eng(cfg.options());
      Var a = eng.new_var();
      Var b = eng.new_var();
      Var c = eng.new_var();
      Var d = eng.new_var();
      Var h = eng.new_var();
      int a_value = 0;
      bool ran_c = false;
      bool ran_d = false;
      eng.push([&](const RunContext&) { a_value = 42; }, {}, {a}, on(kSim0, StreamKind::kCompute, "before"));
      CHECK(wait_error(eng, a).empty());
      // b faults on the copy-in stream; c waits for it on a compute stream
      // (an event wait on the faulted stream), d for c on the CPU.
      eng.push([](const RunContext& ctx) { sim::fault(ctx, "illegal address"); }, {}, {b},
               on(kSim0, StreamKind::kCopyIn, "faulty"));
      eng.push([&](const RunContext&) { ran_c = true; }, {b}, {c}, on(kSim0, StreamKind::kCompute, "after"));
      eng.push([&](const RunContext&) { ran_d = true; }, {c}, {d}, PushOptions{});
      const std::string err = wait_error(eng, d);
      CHECK(err.find("sim(0): device fault: illegal address") != std::string::npos);
      CHECK_FALSE(ran_c);
      CHECK_FALSE(ran_d);
      CHECK_THROWS_AS(eng.waitall(), OpError);
      // Sticky: a later launch on the device fails with the same fault...
      bool ran_later = false;
      eng.push([&](const RunContext&) { ran_later = true; }, {}, {h}, on(kSim0, StreamKind::kCompute, "later"));
      const std::string later = wait_error(eng, h);
      CHECK(later.find("op 'later' failed") != std::string::npos);
      CHECK(later.find("device fault: illegal address") != std::string::npos);
      CHECK_FALSE(ran_later);
      // ...while what completed before the fault stays, and the CPU works.
      CHECK(wait_error(eng, a).empty());
      CHECK(a_value == 42);
      int cpu = 0;
      eng.push([&](const RunContext&) { cpu = 1; }, {}, {a}, PushOptions{});
      CHECK(wait_error(eng, a).empty());
      CHECK(cpu == 1);
      // Another engine's sim(0) is another device: unaffected.
      Engine other(cfg.options());
      Var o = other.new_var();
      int ov = 0;
      other.push([&](const RunContext&) { ov = 5; }, {}, {o}, on(kSim0, StreamKind::kCompute, "other"));
      CHECK(wait_error(other, o).empty());
      CHECK(ov == 5);
    }
  }

  TEST_CASE("Sim.AFailedCompletionRecordFailsOnlyItsOwnLaunchEvenWhenNodesAreRecycled") {
    for (const auto& cfg : test::all_configs()) {
      CAPTURE(cfg.str());
      Engine eng(cfg.options());
      constexpr int kOps = 300;
      std::vector<Var> vars;
      for (int i = 0; i < 20; ++i) vars.push_back(eng.new_var());
      std::vector<int> values(static_cast<std::size_t>(kOps), 0);
      for (int i = 0; i < kOps; ++i) {
        Var v = vars[static_cast<std::size_t>(i % 20)];
        const bool bad = i % 7 == 3;
        // One stream (copy-in): the failed record sits between good launches.
        eng.push(
            [&values, i, bad](const RunContext& ctx) {
              values[static_cast<std::size_t>(i)] = i + 1;
              if (bad) sim::fail_completion(ctx, "host function " + std::to_string(i));
            },
            {}, {v}, on(kSim0, StreamKind::kCopyIn, "op" + std::to_string(i)));
        if (i % 20 == 19) {
          // Each var's last write decides what its wait reports.
          for (int k = 0; k < 20; ++k) {
            const int last = i - 19 + k;
            const std::string err = wait_error(eng, vars[static_cast<std::size_t>(k)]);
            if (last % 7 == 3) {
              CHECK(err.find("op 'op" + std::to_string(last) + "' failed: sim(0): recording the completion "
                             "failed: host function " + std::to_string(last)) != std::string::npos);
            } else {
              CHECK(err.empty());
            }
          }
        }
      }
      try {
        eng.waitall();
      } catch (const OpError&) {
      }
      for (int i = 0; i < kOps; ++i) CHECK(values[static_cast<std::size_t>(i)] == i + 1);  // every op ran
      CHECK(eng.stats().nodes_failed == static_cast<std::uint64_t>((kOps + 3) / 7));
    }
  }

  TEST_CASE("Sim.InjectionOutsideASimOpIsRefused") {
    CHECK_THROWS_AS(sim::fault(RunContext{}, "x"), InvalidArgument);
    CHECK_THROWS_AS(sim::fail_completion(RunContext{}, "x"), InvalidArgument);
    Engine eng(test::Config{Policy::kEager, 2}.options());
    Var v = eng.new_var();
    eng.push([](const RunContext& ctx) { sim::fault(ctx, "x"); }, {}, {v}, on(Device{}, StreamKind::kCompute, "cpu op"));
    const std::string err = wait_error(eng, v);
    CHECK(err.find("sim::fault: called outside an op running on a sim device") != std::string::npos);
    // A sim op's context used from another thread is refused as well.
    RunContext saved;
    eng.push([&](const RunContext& ctx) { saved = ctx; }, {}, {v}, on(kSim0, StreamKind::kCompute, "keep"));
    CHECK(wait_error(eng, v).empty());
    CHECK_THROWS_AS(sim::fault(saved, "x"), InvalidArgument);
    // and the device is still healthy
    int x = 0;
    eng.push([&](const RunContext&) { x = 3; }, {}, {v}, on(kSim0, StreamKind::kCompute, "fine"));
    CHECK(wait_error(eng, v).empty());
    CHECK(x == 3);
  }
}
