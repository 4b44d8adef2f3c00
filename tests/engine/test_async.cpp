// push_async: nodes done when their Completion is called, from another
// thread, in any order; errors, dropped completions and skipped nodes; and
// a stress against the sequential result under every configuration.
#include <doctest/doctest.h>

#include "support.hpp"

#include <deque>
#include <mutex>
#include <random>
#include <thread>

using namespace lazydag;
using namespace lazydag::test;

namespace {

// A thread that calls the completions handed to it, in an order of its
// choosing (random, seeded): what a communication thread does.
class Completer {
 public:
  explicit Completer(std::uint32_t seed) : rng_(seed), thread_([this] { loop(); }) {}
  ~Completer() {
    stop_.store(true);
    thread_.join();
  }
  void give(engine::Completion c, std::function<void()> work = {}) {
    std::lock_guard g(mu_);
    items_.push_back({std::move(c), std::move(work)});
  }

 private:
  struct Item {
    engine::Completion done;
    std::function<void()> work;
  };
  void loop() {
    for (;;) {
      Item item;
      {
        std::lock_guard g(mu_);
        if (items_.empty()) {
          if (stop_.load()) return;
        } else {
          const std::size_t i = std::uniform_int_distribution<std::size_t>(0, items_.size() - 1)(rng_);
          item = std::move(items_[i]);
          items_.erase(items_.begin() + static_cast<std::ptrdiff_t>(i));
        }
      }
      if (!item.done) {
        std::this_thread::yield();
        continue;
      }
      if (item.work) item.work();
      item.done();
    }
  }
  std::mt19937 rng_;
  std::mutex mu_;
  std::deque<Item> items_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace

TEST_CASE("an async node is done only when its completion is called" * doctest::timeout(120)) {
  for (const auto& cfg : all_configs()) {
    CAPTURE(cfg.str());
    engine::Engine eng(cfg.options());
    Completer completer(1);
    const engine::Var v = eng.new_var();
    int value = 0;
    std::atomic<bool> started{false};
    eng.push_async(
        [&](const engine::RunContext&, engine::Completion& done) {
          started = true;
          completer.give(std::move(done), [&] { value = 41; });
        },
        {}, {v}, {.name = "async write"});
    int seen = -1;
    eng.push([&](const engine::RunContext&) { seen = value + 1; }, {v}, {v});
    eng.wait_to_read(v);
    CHECK(started);
    CHECK(value == 41);
    CHECK(seen == 42);
    eng.waitall();
  }
}

TEST_CASE("async nodes: errors, drops, throws, inline completion, skips" * doctest::timeout(120)) {
  for (const auto& cfg : all_configs()) {
    CAPTURE(cfg.str());
    engine::Engine eng(cfg.options());
    Completer completer(2);
    // a failure reported through the completion poisons the writes
    const engine::Var a = eng.new_var();
    eng.push_async([&](const engine::RunContext&, engine::Completion& done) {
      completer.give(std::move(done));  // completed without error by the completer...
    }, {}, {a});
    const engine::Var b = eng.new_var();
    eng.push_async([](const engine::RunContext&, engine::Completion& done) {
      done(std::make_exception_ptr(Error("MPI_ERR_TRUNCATE: message truncated")));
    }, {a}, {b}, {.name = "allreduce #3"});
    bool ran_after = false;
    eng.push([&](const engine::RunContext&) { ran_after = true; }, {b}, {b});
    try {
      eng.wait_to_read(b);
      FAIL("a failed async node was read without an error");
    } catch (const OpError& e) {
      CHECK(std::string(e.what()).find("allreduce #3") != std::string::npos);
      CHECK(std::string(e.what()).find("MPI_ERR_TRUNCATE") != std::string::npos);
    }
    CHECK_FALSE(ran_after);
    // a dropped completion, a throw, and a return that keeps nothing all fail
    const engine::Var c = eng.new_var();
    eng.push_async([](const engine::RunContext&, engine::Completion& done) {
      engine::Completion lost = std::move(done);
    }, {}, {c});
    CHECK_THROWS_AS(eng.wait_to_read(c), OpError);
    const engine::Var d = eng.new_var();
    eng.push_async([](const engine::RunContext&, engine::Completion&) { throw InvalidArgument("bad start"); }, {}, {d});
    CHECK_THROWS_AS(eng.wait_to_read(d), OpError);
    const engine::Var e = eng.new_var();
    eng.push_async([](const engine::RunContext&, engine::Completion&) {}, {}, {e});
    CHECK_THROWS_AS(eng.wait_to_read(e), OpError);
    // skipped: a poisoned input means the function never runs
    bool started = false;
    eng.push_async([&](const engine::RunContext&, engine::Completion& done) {
      started = true;
      done();
    }, {d}, {e});
    CHECK_THROWS_AS(eng.wait_to_read(e), OpError);
    CHECK_FALSE(started);
    // a successful write clears the error
    eng.push_async([](const engine::RunContext&, engine::Completion& done) { done(); }, {}, {e});
    eng.wait_to_read(e);
    CHECK_THROWS_AS(eng.push_async({}, {}, {e}), InvalidArgument);
    engine::PushOptions on_sim;
    on_sim.device = engine::Device{engine::DeviceKind::kSim, 0};
    CHECK_THROWS_AS(eng.push_async([](const engine::RunContext&, engine::Completion& done) { done(); }, {}, {e}, on_sim),
                    InvalidArgument);
    try {
      eng.waitall();
    } catch (const OpError&) {
    }
    eng.waitall();
  }
}

TEST_CASE("async stress: chains through async nodes completed in random order match the sequential result" *
          doctest::timeout(240)) {
  const int kVars = 8;
  const int kOps = 600;
  for (const auto& cfg : all_configs()) {
    CAPTURE(cfg.str());
    for (std::uint32_t seed = 1; seed <= 3; ++seed) {
      CAPTURE(seed);
      engine::Engine eng(cfg.options());
      Completer completer(seed);
      std::vector<engine::Var> vars;
      std::vector<std::uint64_t> cells(kVars, 0), want(kVars, 0);
      std::atomic<int> lost_captures{0};
      for (int i = 0; i < kVars; ++i) vars.push_back(eng.new_var());
      std::mt19937 rng(seed);
      for (int op = 0; op < kOps; ++op) {
        const int r = static_cast<int>(rng() % kVars);
        const int w = static_cast<int>(rng() % kVars);
        want[w] = mix(want[w], want[r] + static_cast<std::uint64_t>(op));
        auto work = [&cells, r, w, op] { cells[w] = mix(cells[w], cells[r] + static_cast<std::uint64_t>(op)); };
        if (rng() % 2 == 0) {
          // The function's captures live until the node completes: the
          // started work may still use them.
          auto capture = std::make_shared<int>(op);
          eng.push_async([&completer, &lost_captures, work, capture](const engine::RunContext&, engine::Completion& done) {
            std::weak_ptr<int> alive = capture;
            completer.give(std::move(done), [work, alive, &lost_captures] {
              if (alive.expired()) ++lost_captures;
              work();
            });
          }, {vars[r]}, {vars[w]});
        } else {
          eng.push([work](const engine::RunContext&) { work(); }, {vars[r]}, {vars[w]});
        }
        if (rng() % 50 == 0) eng.wait_to_read(vars[rng() % kVars]);
      }
      eng.waitall();
      CHECK(cells == want);
      CHECK(lost_captures == 0);
    }
  }
}

TEST_CASE("run_on_failed_input: the node runs, told why, and its writes carry the failure" * doctest::timeout(120)) {
  for (const auto& cfg : all_configs()) {
    CAPTURE(cfg.str());
    engine::Engine eng(cfg.options());
    const engine::Var bad = eng.new_var();
    eng.push([](const engine::RunContext&) { throw InvalidArgument("the producer failed"); }, {}, {bad});
    engine::PushOptions o;
    o.run_on_failed_input = true;
    o.name = "collective";
    std::atomic<int> ran{0};
    std::string cause;
    const engine::Var out = eng.new_var();
    eng.push_async(
        [&](const engine::RunContext& ctx, engine::Completion& done) {
          ++ran;
          try {
            if (ctx.failed_input) std::rethrow_exception(ctx.failed_input);
          } catch (const std::exception& e) {
            cause = e.what();
          }
          done(ctx.failed_input);  // took part, then reports the input's failure
        },
        {bad}, {out}, o);
    const engine::Var out2 = eng.new_var();
    eng.push([&](const engine::RunContext& ctx) { ran += ctx.failed_input ? 10 : 100; }, {bad}, {out2}, o);
    try {
      eng.wait_to_read(out);
      FAIL("the failure did not reach the output");
    } catch (const OpError& e) {
      CHECK(std::string(e.what()).find("the producer failed") != std::string::npos);
    }
    CHECK_THROWS_AS(eng.wait_to_read(out2), OpError);
    CHECK(ran == 11);
    CHECK(cause.find("the producer failed") != std::string::npos);
    try {
      eng.waitall();
    } catch (const OpError&) {
    }
  }
}
