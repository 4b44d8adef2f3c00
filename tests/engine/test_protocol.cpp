// The record/wait protocol under pressure: several frontend threads with
// random programs checked against the naive policy, and a long push + wait
// loop in which a lost wake-up would hang (the watchdog turns it into a
// failure).
#include <doctest/doctest.h>

#include <lazydag/engine/engine.hpp>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <deque>
#include <exception>
#include <memory>
#include <random>
#include <set>
#include <span>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>
#include <typeinfo>
#include <vector>

#include "support.hpp"

using namespace lazydag;
using namespace lazydag::engine;

namespace {

using test::mix;

constexpr std::uint64_t kConstant = 0x5eed5eed5eedULL;

// Vars every frontend thread uses. `constant` is written once before the
// threads start and only read after; `counter` and `sum` are written by
// every thread's count ops (counter += 1, sum += amount), so their final
// values do not depend on the interleaving. Their cells are atomics so that
// a thread may load them after a wait while other threads' ops run; the ops
// load and store (not fetch_add), so two count ops run at once would lose
// an update and show in the totals.
struct SharedCells {
  std::uint64_t constant = 0;
  std::atomic<std::uint64_t> counter{0};
  std::atomic<std::uint64_t> sum{0};
};

struct SharedVars {
  Var constant;
  Var counter;
  Var sum;
  std::shared_ptr<SharedCells> cells = std::make_shared<SharedCells>();
};

SharedVars make_shared_vars(Engine& eng) {
  SharedVars s{eng.new_var(), eng.new_var(), eng.new_var()};
  eng.push([cells = s.cells](const RunContext&) { cells->constant = kConstant; }, {}, {s.constant},
           {.name = "set_constant"});
  return s;
}

// One step of a frontend thread's program. Own var indices are the
// thread's own (disjoint) vars.
struct Step {
  enum Kind {
    kOp,          // reads own vars (and maybe the constant), writes own vars; may throw
    kCount,       // counter += 1, sum += amount
    kWaitRead,    // wait_to_read an own var and log its value or error
    kWaitWrite,   // the same with wait_to_write
    kWaitShared,  // wait_to_read or wait_to_write the counter
    kTemp,        // a temporary var: written from own vars (may throw), read into an own var, deleted
    kRenew,       // delete an own var while work on it is pending; a new var takes its slot
  } kind = kOp;
  std::vector<int> reads;
  std::vector<int> writes;
  bool reads_constant = false;
  bool throws = false;
  bool to_write = false;  // kWaitShared: wait_to_write
  int var = 0;
  std::uint64_t amount = 0;
};

std::vector<Step> make_program(std::uint32_t seed, int num_vars, int num_steps) {
  std::mt19937 rng(seed);
  auto coin = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };
  std::uniform_int_distribution<int> var(0, num_vars - 1);
  std::uniform_int_distribution<int> small(1, 3);
  std::vector<Step> prog;
  for (int i = 0; i < num_steps; ++i) {
    Step s;
    const double r = std::uniform_real_distribution<double>(0, 1)(rng);
    if (r < 0.55) {
      s.kind = Step::kOp;
      for (int k = small(rng) - 1; k > 0; --k) s.reads.push_back(var(rng));
      for (int k = (small(rng) + 1) / 2; k > 0; --k) s.writes.push_back(var(rng));
      s.reads_constant = coin(0.2);
      s.throws = coin(0.04);
    } else if (r < 0.70) {
      s.kind = Step::kCount;
      s.amount = 1 + rng() % 1000;
    } else if (r < 0.78) {
      s.kind = Step::kWaitRead;
      s.var = var(rng);
    } else if (r < 0.82) {
      s.kind = Step::kWaitWrite;
      s.var = var(rng);
    } else if (r < 0.87) {
      s.kind = Step::kWaitShared;
      s.to_write = coin(0.5);
    } else if (r < 0.95) {
      s.kind = Step::kTemp;
      for (int k = (small(rng) + 1) / 2; k > 0; --k) s.reads.push_back(var(rng));
      s.throws = coin(0.1);
      s.var = var(rng);
    } else {
      s.kind = Step::kRenew;
      s.var = var(rng);
    }
    prog.push_back(s);
  }
  return prog;
}

// What one thread observed.
struct Outcome {
  std::string log;         // own var values and errors seen by waits, in order, then final values
  int op_errors = 0;       // OpErrors thrown by waits on own vars
  std::uint64_t counts = 0;  // count ops recorded
  std::uint64_t amount = 0;  // and their amounts
  int bad_shared_reads = 0;  // shared waits that saw fewer increments than this thread had recorded, or too many
  std::string failure;       // any other exception: a bug
  std::shared_ptr<std::atomic<std::uint64_t>> bodies_run =
      std::make_shared<std::atomic<std::uint64_t>>(0);  // own-var op bodies that ran (read after waitall)
};

// Runs `prog` on `eng`, which other threads may use at the same time (so no
// waitall: it would report their failures too). `total_counts` bounds what
// a wait on the counter may see.
Outcome run_program(Engine& eng, const SharedVars& shared, const std::vector<Step>& prog, int num_vars,
                    const std::string& tag, std::uint64_t total_counts) {
  Outcome out;
  try {
    // One value cell per var instance; cells never move, and every op holds
    // the deque, so ops that run after a var was deleted (or after this
    // function returned) still find their cells.
    auto cells = std::make_shared<std::deque<std::uint64_t>>();
    std::vector<Var> vars;
    std::vector<std::uint64_t*> cell_of;
    for (int i = 0; i < num_vars; ++i) {
      vars.push_back(eng.new_var());
      cells->push_back(mix(0, static_cast<std::uint64_t>(i)));
      cell_of.push_back(&cells->back());
    }
    auto bodies_run = out.bodies_run;
    // A node over own cells: the written cells get a hash of the op id, the
    // read cells and the old values of the written ones.
    auto push_op = [&](std::uint64_t id, std::vector<Var> r, std::vector<std::uint64_t*> rc,
                       std::vector<Var> w, std::vector<std::uint64_t*> wc, bool throws, const std::string& name) {
      eng.push(
          [id, rc, wc, throws, cells, bodies_run](const RunContext&) {
            bodies_run->fetch_add(1, std::memory_order_relaxed);
            if (throws) throw std::runtime_error("injected");
            std::uint64_t h = mix(id, 1);
            for (auto* c : rc) h = mix(h, *c);
            for (auto* c : wc) h = mix(h, *c * 3);  // RMW sees the old value
            std::uint64_t k = 0;
            for (auto* c : wc) *c = mix(h, ++k);
          },
          r, w, {.name = name, .cost_bytes = id % 2 == 0 ? 8U : 0U});  // some run where recorded
    };
    auto observe = [&](const char* what, int x, auto&& wait) {
      try {
        wait();
        out.log += what + std::to_string(x) + "=" + std::to_string(*cell_of[x]) + ";";
      } catch (const OpError& e) {
        ++out.op_errors;
        out.log += what + std::to_string(x) + "=E:" + e.op_name() + ";";
      }
    };
    for (std::size_t i = 0; i < prog.size(); ++i) {
      const Step& s = prog[i];
      const std::string name = tag + "op" + std::to_string(i);
      switch (s.kind) {
        case Step::kOp: {
          std::vector<Var> r;
          std::vector<Var> w;
          std::vector<std::uint64_t*> rc;
          std::vector<std::uint64_t*> wc;
          for (int x : s.reads) {
            r.push_back(vars[x]);
            rc.push_back(cell_of[x]);
          }
          if (s.reads_constant) {
            r.push_back(shared.constant);
            rc.push_back(&shared.cells->constant);
          }
          for (int x : s.writes) {
            w.push_back(vars[x]);
            wc.push_back(cell_of[x]);
          }
          push_op(i, r, rc, w, wc, s.throws, name);
          break;
        }
        case Step::kCount: {
          const std::uint64_t amount = s.amount;
          eng.push(
              [c = shared.cells, amount](const RunContext&) {
                // a count op that ran before the constant was set adds a mark
                const std::uint64_t bad = c->constant == kConstant ? 0 : std::uint64_t{1} << 40;
                c->counter.store(c->counter.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
                c->sum.store(c->sum.load(std::memory_order_relaxed) + amount + bad, std::memory_order_relaxed);
              },
              {shared.constant}, {shared.counter, shared.sum}, {.name = name, .cost_bytes = amount % 2 == 0 ? 8U : 0U});
          ++out.counts;
          out.amount += amount;
          break;
        }
        case Step::kWaitRead:
          observe("R", s.var, [&] { eng.wait_to_read(vars[s.var]); });
          break;
        case Step::kWaitWrite:
          observe("W", s.var, [&] { eng.wait_to_write(vars[s.var]); });
          break;
        case Step::kWaitShared: {
          // every count op this thread recorded is done; others' may be too
          if (s.to_write) {
            eng.wait_to_write(shared.counter);
          } else {
            eng.wait_to_read(shared.counter);
          }
          const std::uint64_t seen = shared.cells->counter.load(std::memory_order_relaxed);
          if (seen < out.counts || seen > total_counts) ++out.bad_shared_reads;
          break;
        }
        case Step::kTemp: {
          Var tmp = eng.new_var();
          cells->push_back(mix(5, i));
          std::uint64_t* tc = &cells->back();
          std::vector<Var> r;
          std::vector<std::uint64_t*> rc;
          for (int x : s.reads) {
            r.push_back(vars[x]);
            rc.push_back(cell_of[x]);
          }
          push_op(i, r, rc, {tmp}, {tc}, s.throws, name);
          push_op(i + (std::uint64_t{1} << 32), {tmp}, {tc}, {vars[s.var]}, {cell_of[s.var]}, false,
                  name + "b");
          eng.delete_var(tmp);
          break;
        }
        case Step::kRenew:
          eng.delete_var(vars[s.var]);
          vars[s.var] = eng.new_var();
          cells->push_back(mix(7, i));
          cell_of[s.var] = &cells->back();
          break;
      }
    }
    for (int x = 0; x < num_vars; ++x) observe("F", x, [&] { eng.wait_to_read(vars[x]); });
    for (Var v : vars) eng.delete_var(v);
  } catch (const std::exception& e) {
    out.failure = std::string(typeid(e).name()) + ": " + e.what();
  }
  return out;
}

void drain(Engine& eng) {
  try {
    eng.waitall();  // collects the injected failures nobody waited for
  } catch (const OpError&) {
  }
}

}  // namespace

TEST_SUITE("engine") {
  TEST_CASE("Protocol.StressAgainstNaive" * doctest::timeout(240)) {
    // Four frontend threads, each running a random program of its own on
    // its own vars, on shared read-only and shared read-modify-write vars,
    // with waits, temporaries, deletes, new vars and throwing ops. Own-var
    // observations must match the same program run alone under naive
    // exactly; the shared vars' totals must not depend on the interleaving.
    constexpr int kThreads = 4;
    constexpr int kSteps = 2000;
    constexpr int kRounds = 8;
    const int num_vars = 6;
    int mismatches = 0;
    int ref_errors = 0;
    for (int round = 0; round < kRounds; ++round) {
      std::vector<std::vector<Step>> progs;
      std::vector<Outcome> refs;
      for (int t = 0; t < kThreads; ++t) {
        progs.push_back(make_program(static_cast<std::uint32_t>(round * 131 + t + 1), num_vars, kSteps));
        EngineOptions naive = test::Config{Policy::kNaive, 0}.options();
        Engine eng(naive);
        const SharedVars shared = make_shared_vars(eng);
        refs.push_back(run_program(eng, shared, progs.back(), num_vars, "t" + std::to_string(t), ~std::uint64_t{0}));
        drain(eng);
        REQUIRE(refs.back().failure.empty());
        ref_errors += refs.back().op_errors;
      }
      std::uint64_t total_counts = 0;
      std::uint64_t total_amount = 0;
      for (const auto& r : refs) {
        total_counts += r.counts;
        total_amount += r.amount;
      }
      // small windows on odd rounds: frontends stall on each other's work
      const std::size_t window = round % 2 == 1 ? 8 : 16384;
      for (const auto& cfg : test::all_configs()) {
        CAPTURE(round);
        CAPTURE(cfg.str());
        Engine eng(cfg.options(window));
        const SharedVars shared = make_shared_vars(eng);
        std::vector<Outcome> got(kThreads);
        std::vector<std::thread> threads;
        for (int t = 0; t < kThreads; ++t) {
          threads.emplace_back([&, t] {
            got[t] = run_program(eng, shared, progs[t], num_vars, "t" + std::to_string(t), total_counts);
          });
        }
        for (auto& th : threads) th.join();
        drain(eng);
        eng.wait_to_read(shared.counter);
        eng.wait_to_read(shared.sum);
        CHECK(shared.cells->counter.load() == total_counts);
        CHECK(shared.cells->sum.load() == total_amount);
        CHECK(eng.stats().unfinished == 0);
        for (int t = 0; t < kThreads; ++t) {
          CAPTURE(t);
          CHECK(got[t].failure == "");
          CHECK(got[t].bad_shared_reads == 0);
          CHECK(got[t].op_errors == refs[t].op_errors);
          CHECK(got[t].bodies_run->load() == refs[t].bodies_run->load());
          if (got[t].log != refs[t].log) {
            ++mismatches;
            CHECK(got[t].log == refs[t].log);
          }
        }
      }
    }
    CHECK(mismatches == 0);
    CHECK(ref_errors > 0);  // the failure paths were exercised
    MESSAGE("protocol stress: rounds=" << kRounds << " threads=" << kThreads << " steps=" << kSteps
                                       << " configs=7 mismatches=" << mismatches
                                       << " op_errors_per_round=" << ref_errors / kRounds);
  }

  TEST_CASE("Protocol.NoLostWakeup" * doctest::timeout(240)) {
    // chain_sync: push(x += 1) then wait_to_read(x), many times. A wake-up
    // lost between the node's completion and the waiter going to sleep
    // hangs one wait, which the watchdog (LAZYDAG_WATCHDOG) turns into
    // WatchdogTimeout. The second variant has another frontend thread
    // pushing and waiting on an unrelated var at the same time.
    const int iterations = std::getenv("LAZYDAG_DIFF_SEEDS") != nullptr ? 20000 : 200000;
    for (const auto& cfg : test::all_configs()) {
      if (cfg.policy == Policy::kNaive) continue;
      for (bool background : {false, true}) {
        CAPTURE(cfg.str());
        CAPTURE(background);
        Engine eng(cfg.options());
        Var x = eng.new_var();
        Var y = eng.new_var();
        std::uint64_t value = 0;  // written only by the nodes on x
        std::uint64_t other = 0;  // written only by the nodes on y
        std::uint64_t pushed = 0;
        int wrong = 0;
        int other_wrong = 0;
        std::string failure;
        std::string other_failure;
        std::atomic<bool> done{false};
        std::thread pusher;
        if (background) {
          pusher = std::thread([&] {
            try {
              while (!done.load(std::memory_order_acquire)) {
                eng.push([&other](const RunContext&) { ++other; }, {y}, {y}, {.name = "other"});
                ++pushed;
                if (pushed % 16 == 0) {
                  eng.wait_to_read(y);
                  if (other != pushed) ++other_wrong;
                }
              }
            } catch (const std::exception& e) {
              other_failure = e.what();
            }
          });
        }
        try {
          for (int i = 1; i <= iterations; ++i) {
            eng.push([&value](const RunContext&) { ++value; }, {x}, {x}, {.name = "inc"});
            eng.wait_to_read(x);
            if (value != static_cast<std::uint64_t>(i)) ++wrong;
          }
        } catch (const std::exception& e) {
          failure = e.what();
        }
        done.store(true, std::memory_order_release);
        if (pusher.joinable()) pusher.join();
        eng.wait_to_read(y);
        CHECK(failure == "");
        CHECK(other_failure == "");
        CHECK(wrong == 0);
        CHECK(other_wrong == 0);
        CHECK(value == static_cast<std::uint64_t>(iterations));
        CHECK(other == pushed);
      }
    }
  }

  TEST_CASE("Protocol.RecordersSharingVarsInEveryOrder" * doctest::timeout(240)) {
    // Recording takes the locks of a push's vars, not one graph lock. Four
    // threads push read-modify-writes of two shared vars, naming them in
    // opposite orders (a, b and b, a), each op incrementing both with a
    // plain load and store: two such ops run at once, or a cycle in the
    // graph, would lose an update or hang. Between them they also push on
    // vars of their own, wait for the shared vars (a wait must see every op
    // its thread pushed before it), delete and make vars; a fifth thread
    // calls waitall throughout.
    constexpr int kThreads = 4;
    const int ops = std::getenv("LAZYDAG_DIFF_SEEDS") != nullptr ? 1500 : 6000;
    for (const auto& cfg : test::all_configs()) {
      for (std::size_t window : {std::size_t{8}, std::size_t{16384}}) {
        CAPTURE(cfg.str());
        CAPTURE(window);
        Engine eng(cfg.options(window));
        const Var a = eng.new_var();
        const Var b = eng.new_var();
        struct Cells {
          std::atomic<std::uint64_t> a{0};
          std::atomic<std::uint64_t> b{0};
        };
        auto cells = std::make_shared<Cells>();
        auto bump = [cells](const RunContext&) {
          // Load then store: the engine, not the atomics, must order these.
          cells->a.store(cells->a.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
          cells->b.store(cells->b.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
        };
        std::atomic<bool> recording{true};
        std::vector<std::string> failures(kThreads + 1);
        std::vector<int> stale(kThreads, 0);
        std::vector<std::thread> threads;
        for (int t = 0; t < kThreads; ++t) {
          threads.emplace_back([&, t] {
            try {
              std::mt19937 rng(static_cast<std::uint32_t>(t + 7));
              Var own = eng.new_var();
              auto own_value = std::make_shared<std::uint64_t>(0);
              std::uint64_t own_pushed = 0;
              for (int i = 1; i <= ops; ++i) {
                if (t % 2 == 0) {
                  eng.push(bump, {a, b}, {a, b}, {.name = "ab"});
                } else {
                  eng.push(bump, {b, a}, {b, a}, {.name = "ba"});
                }
                switch (rng() % 8) {
                  case 0: {
                    // Every op this thread pushed on a is before the wait's target.
                    eng.wait_to_read(a);
                    if (cells->a.load(std::memory_order_relaxed) < static_cast<std::uint64_t>(i)) ++stale[t];
                    break;
                  }
                  case 1:
                    eng.wait_to_write(b);
                    if (cells->b.load(std::memory_order_relaxed) < static_cast<std::uint64_t>(i)) ++stale[t];
                    break;
                  case 2: {
                    eng.push([own_value](const RunContext&) { ++*own_value; }, {own}, {own}, {.name = "own"});
                    ++own_pushed;
                    if (rng() % 4 == 0) {
                      eng.wait_to_read(own);
                      if (*own_value != own_pushed) ++stale[t];
                    }
                    break;
                  }
                  case 3: {
                    // A temporary written from a shared var, then deleted.
                    Var tmp = eng.new_var();
                    eng.push([](const RunContext&) {}, {a}, {tmp}, {.name = "tmp"});
                    eng.delete_var(tmp);
                    break;
                  }
                  default:
                    break;
                }
              }
              eng.wait_to_read(own);
              if (*own_value != own_pushed) ++stale[t];
              eng.delete_var(own);
            } catch (const std::exception& e) {
              failures[t] = e.what();
            }
          });
        }
        std::thread waiter([&] {
          try {
            while (recording.load(std::memory_order_acquire)) eng.waitall();
          } catch (const std::exception& e) {
            failures[kThreads] = e.what();
          }
        });
        for (auto& th : threads) th.join();
        recording.store(false, std::memory_order_release);
        waiter.join();
        eng.waitall();
        for (int t = 0; t <= kThreads; ++t) {
          CAPTURE(t);
          CHECK(failures[t] == "");
        }
        for (int t = 0; t < kThreads; ++t) CHECK(stale[t] == 0);
        CHECK(cells->a.load() == static_cast<std::uint64_t>(kThreads) * ops);
        CHECK(cells->b.load() == static_cast<std::uint64_t>(kThreads) * ops);
        CHECK(eng.stats().unfinished == 0);
      }
    }
  }

  TEST_CASE("Protocol.MoreRecordingThreadsThanThreadSlots" * doctest::timeout(240)) {
    // Free nodes and var slots, record clocks and counts are kept per
    // thread slot, and there are 64 slots. 72 threads record at once (each
    // has made a var before any starts its steps, so at least 8 of them
    // have no slot and take the shared paths), then exit, and 72 more do
    // the same on the same engine, taking over the first threads' slots
    // and what is cached under them. Each step is an NDArray op's pattern:
    // a temporary written from the thread's var, the var written back from
    // it, the temporary deleted. While they record, node ids must be unique
    // and larger than their predecessors'.
    constexpr int kThreads = 72;
    const int steps = std::getenv("LAZYDAG_DIFF_SEEDS") != nullptr ? 60 : 200;
    for (const auto& cfg : test::all_configs()) {
      for (std::size_t window : {std::size_t{8}, std::size_t{16384}}) {
        CAPTURE(cfg.str());
        CAPTURE(window);
        Engine eng(cfg.options(window));
        const Var shared = eng.new_var();
        eng.push([](const RunContext&) {}, {}, {shared}, {.name = "init"});
        std::uint64_t pushes = 1;
        for (int round = 0; round < 2; ++round) {
          CAPTURE(round);
          std::vector<std::string> failures(kThreads);
          std::vector<std::uint64_t> finals(kThreads, 0);
          std::atomic<int> ready{0};
          std::atomic<bool> go{false};
          std::atomic<int> finished{0};
          std::vector<std::thread> threads;
          for (int t = 0; t < kThreads; ++t) {
            threads.emplace_back([&, t] {
              try {
                const Var own = eng.new_var();
                auto value = std::make_shared<std::uint64_t>(0);
                ready.fetch_add(1);
                while (!go.load(std::memory_order_acquire)) std::this_thread::yield();
                for (int i = 0; i < steps; ++i) {
                  const Var tmp = eng.new_var();
                  auto cell = std::make_shared<std::uint64_t>(0);
                  // Half the threads also read a var they all share.
                  const std::vector<Var> reads = t % 2 == 0 ? std::vector<Var>{own, shared} : std::vector<Var>{own};
                  const Var writes[] = {tmp};
                  eng.push([value, cell](const RunContext&) { *cell = *value + 1; }, std::span<const Var>(reads),
                           std::span<const Var>(writes), {.name = "up", .cost_bytes = 8});
                  eng.push([value, cell](const RunContext&) { *value = *cell; }, {tmp}, {own},
                           {.name = "back", .cost_bytes = 8});
                  eng.delete_var(tmp);
                  if (i % 50 == 49) {
                    eng.wait_to_read(own);
                    if (*value != static_cast<std::uint64_t>(i) + 1) throw std::runtime_error("stale read");
                  }
                }
                eng.wait_to_read(own);
                finals[static_cast<std::size_t>(t)] = *value;
                eng.delete_var(own);
              } catch (const std::exception& e) {
                failures[static_cast<std::size_t>(t)] = e.what();
              }
              finished.fetch_add(1, std::memory_order_release);
            });
          }
          while (ready.load() < kThreads) std::this_thread::yield();
          go.store(true, std::memory_order_release);
          // Ids while the threads record: unique, and past their predecessors'.
          int duplicate_ids = 0;
          int preds_after = 0;
          for (int look = 0; look < 24 && finished.load(std::memory_order_acquire) < kThreads; ++look) {
            const auto pending = eng.pending_nodes();
            std::set<std::uint64_t> ids;
            for (const auto& n : pending) {
              duplicate_ids += ids.insert(n.id).second ? 0 : 1;
              for (std::uint64_t p : n.preds) preds_after += p < n.id ? 0 : 1;
            }
          }
          CHECK(duplicate_ids == 0);
          CHECK(preds_after == 0);
          for (auto& th : threads) th.join();
          for (int t = 0; t < kThreads; ++t) {
            CAPTURE(t);
            CHECK(failures[static_cast<std::size_t>(t)] == "");
            CHECK(finals[static_cast<std::size_t>(t)] == static_cast<std::uint64_t>(steps));
          }
          pushes += static_cast<std::uint64_t>(kThreads) * steps * 2;
        }
        eng.waitall();
        const EngineStats st = eng.stats();
        CHECK(st.nodes_recorded == pushes);
        CHECK(st.nodes_run == pushes);
        CHECK(st.unfinished == 0);
      }
    }
  }

  TEST_CASE("Protocol.StreamedNodesRunWithoutAWait" * doctest::timeout(120)) {
    // A frontend that records a burst of independent ready nodes streams:
    // the workers let the queue fill before they take from it. Whatever way
    // the burst ends (the frontend goes quiet, a node that depends on the
    // queue, one more node behind a long pause), every node must start
    // with no wait from anyone: the frontend here only watches a counter.
    // A worker left coalescing for good would never run them; the
    // deadline (not a timing assertion: minutes against microseconds)
    // turns that into a failure instead of a hang.
    for (const auto& cfg : test::all_configs()) {
      if (cfg.policy != Policy::kEager || cfg.threads == 0) continue;
      CAPTURE(cfg.str());
      EngineOptions o = cfg.options();
      o.max_pending = 0;  // no window: the frontend never helps
      Engine eng(o);
      constexpr int kBurst = 3000;
      std::vector<Var> vars;
      for (int i = 0; i < kBurst; ++i) vars.push_back(eng.new_var());
      std::atomic<int> ran{0};
      auto until = [&](int n) {
        test::spin_until([&] { return ran.load(std::memory_order_acquire) >= n; }, 60.0);
        return ran.load(std::memory_order_acquire);
      };
      int expected = 0;
      for (int ending = 0; ending < 3; ++ending) {
        CAPTURE(ending);
        for (int i = 0; i < kBurst; ++i) {
          eng.push([&ran](const RunContext&) { ran.fetch_add(1, std::memory_order_release); }, {}, {vars[i]});
        }
        expected += kBurst;
        if (ending == 1) {
          // reads every var the burst wrote: not ready while any is queued
          eng.push([&ran](const RunContext&) { ran.fetch_add(1, std::memory_order_release); }, vars, {});
          ++expected;
        }
        if (ending == 2) {
          CHECK(until(expected) == expected);
          eng.push([&ran](const RunContext&) { ran.fetch_add(1, std::memory_order_release); }, {}, {vars[0]});
          ++expected;
        }
        CHECK(until(expected) == expected);
      }
      eng.waitall();
      CHECK(eng.stats().nodes_run == static_cast<std::uint64_t>(expected));
    }
  }
}
