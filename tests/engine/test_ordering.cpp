// Read/write ordering, concurrent readers, priorities and the topological
// order of execution, under every policy and worker count.
#include <doctest/doctest.h>

#include <lazydag/engine/engine.hpp>
#include <lazydag/engine/graph.hpp>

#include <boost/graph/breadth_first_search.hpp>
#include <boost/graph/topological_sort.hpp>

#include <algorithm>
#include <atomic>
#include <latch>
#include <mutex>
#include <random>
#include <set>

#include "support.hpp"

using namespace lazydag;
using namespace lazydag::engine;
using lazydag::test::all_configs;

namespace {

// A global clock of events: an op's [start, end] interval in ticks.
struct Interval {
  std::uint64_t start = 0;
  std::uint64_t end = 0;
};

struct Clock {
  std::atomic<std::uint64_t> now{1};
  std::uint64_t tick() { return now.fetch_add(1); }
};

}  // namespace

TEST_SUITE("engine") {
  TEST_CASE("Ordering.ReadWriteHazards" * doctest::timeout(120)) {
    for (const auto& cfg : all_configs()) {
      CAPTURE(cfg.str());
      Engine eng(cfg.options());
      Var v = eng.new_var();
      Clock clock;
      std::vector<Interval> iv(7);
      int value = 0;
      std::vector<int> seen(7, -1);
      auto op = [&](int i, auto body) {
        return [&, i, body](const RunContext&) {
          iv[i].start = clock.tick();
          body(i);
          iv[i].end = clock.tick();
        };
      };
      auto write = [&](int x) { return [&, x](int) { value = x; }; };
      auto read = [&](int i) { seen[i] = value; };
      eng.push(op(0, write(1)), {}, {v}, {.name = "w1"});
      eng.push(op(1, read), {v}, {}, {.name = "r1a"});
      eng.push(op(2, read), {v}, {}, {.name = "r1b"});
      eng.push(op(3, write(2)), {}, {v}, {.name = "w2"});
      eng.push(op(4, [&](int) { value += 10; }), {v}, {v}, {.name = "rmw"});
      eng.push(op(5, read), {v}, {}, {.name = "r2"});
      eng.push(op(6, write(7)), {}, {v, v}, {.name = "w3"});
      eng.waitall();
      CHECK(seen[1] == 1);
      CHECK(seen[2] == 1);
      CHECK(seen[5] == 12);
      CHECK(value == 7);
      auto before = [&](int a, int b) { return iv[a].end < iv[b].start; };
      CHECK(before(0, 1));  // read after write
      CHECK(before(0, 2));
      CHECK(before(1, 3));  // write after read
      CHECK(before(2, 3));
      CHECK(before(3, 4));  // write after write (read-modify-write)
      CHECK(before(4, 5));
      CHECK(before(5, 6));  // write after read
    }
  }

  TEST_CASE("Ordering.ReadersOfOneVersionRunConcurrently" * doctest::timeout(120)) {
    for (const auto& cfg : all_configs()) {
      if (cfg.policy == Policy::kNaive) continue;  // naive runs one op at a time by design
      CAPTURE(cfg.str());
      Engine eng(cfg.options());
      Var v = eng.new_var();
      eng.push([](const RunContext&) {}, {}, {v}, {.name = "init"});
      std::atomic<int> inside{0};
      std::atomic<int> saw_both{0};
      for (int i = 0; i < 2; ++i) {
        eng.push(
            [&](const RunContext&) {
              inside.fetch_add(1);
              if (test::spin_until([&] { return inside.load() == 2; }, 20.0)) saw_both.fetch_add(1);
            },
            {v}, {}, {.name = "reader"});
      }
      eng.waitall();
      CHECK(saw_both.load() == 2);
    }
  }

  TEST_CASE("Ordering.OneWriterAfterManyReaders" * doctest::timeout(120)) {
    for (const auto& cfg : all_configs()) {
      CAPTURE(cfg.str());
      Engine eng(cfg.options());
      Var v = eng.new_var();
      Var out = eng.new_var();
      Clock clock;
      constexpr int kReaders = 64;
      std::vector<Interval> iv(kReaders);
      std::uint64_t writer_start = 0;
      eng.push([](const RunContext&) {}, {}, {v});
      for (int i = 0; i < kReaders; ++i) {
        eng.push(
            [&, i](const RunContext&) {
              iv[i].start = clock.tick();
              iv[i].end = clock.tick();
            },
            {v}, {}, {.name = "reader"});
      }
      eng.push([&](const RunContext&) { writer_start = clock.tick(); }, {}, {v, out},
               {.name = "writer"});
      eng.wait_to_read(out);
      for (const auto& r : iv) {
        REQUIRE(r.end != 0);
        CHECK(r.end < writer_start);
      }
    }
  }

  TEST_CASE("Ordering.PriorityAmongReadyNodes" * doctest::timeout(60)) {
    EngineOptions o;
    o.policy = Policy::kEager;
    o.num_threads = 1;
    Engine eng(o);
    test::Gate gate;
    Var g = eng.new_var();
    // Park the only worker so that every following node is ready at once.
    std::atomic<bool> parked{false};
    eng.push(
        [&](const RunContext&) {
          parked = true;
          REQUIRE(gate.wait());
        },
        {}, {g}, {.name = "gate"});
    REQUIRE(test::spin_until([&] { return parked.load(); }));
    std::mt19937 rng(7);
    std::uniform_int_distribution<int> prio(-50, 50);
    constexpr int kNodes = 200;
    std::mutex mu;
    std::vector<std::pair<int, int>> order;  // (priority, record index)
    std::latch done(kNodes);
    for (int i = 0; i < kNodes; ++i) {
      int p = prio(rng);
      Var v = eng.new_var();
      eng.push(
          [&, p, i](const RunContext&) {
            {
              std::lock_guard lk(mu);
              order.emplace_back(p, i);
            }
            done.count_down();
          },
          {}, {v}, {.priority = p, .name = "prio"});
    }
    gate.open();
    done.wait();  // a plain latch: this thread must not help run them
    eng.waitall();
    REQUIRE(order.size() == kNodes);
    for (std::size_t i = 1; i < order.size(); ++i) {
      const auto& a = order[i - 1];
      const auto& b = order[i];
      CHECK((a.first > b.first || (a.first == b.first && a.second < b.second)));
    }
  }

  TEST_CASE("Ordering.ExecutionIsATopologicalOrderOfTheRecordedGraph" * doctest::timeout(120)) {
    for (const auto& cfg : all_configs()) {
      if (cfg.policy != Policy::kLazy) continue;  // lazy keeps the whole graph pending
      CAPTURE(cfg.str());
      Engine eng(cfg.options());
      std::mt19937 rng(1234 + cfg.threads);
      constexpr int kVars = 12;
      constexpr int kOps = 300;
      std::vector<Var> vars;
      for (int i = 0; i < kVars; ++i) vars.push_back(eng.new_var());
      std::vector<std::set<int>> reads(kOps);
      std::vector<std::set<int>> writes(kOps);
      std::vector<Interval> iv(kOps);
      Clock clock;
      std::uniform_int_distribution<int> pick(0, kVars - 1);
      for (int i = 0; i < kOps; ++i) {
        std::vector<Var> r;
        std::vector<Var> w;
        for (int k = 0; k < 3; ++k) {
          int a = pick(rng);
          if (rng() % 2 == 0) {
            reads[i].insert(a);
            r.push_back(vars[a]);
          } else {
            writes[i].insert(a);
            w.push_back(vars[a]);
          }
        }
        eng.push(
            [&, i](const RunContext&) {
              iv[i].start = clock.tick();
              iv[i].end = clock.tick();
            },
            r, w, {.name = "op" + std::to_string(i)});
      }
      PendingGraph g = pending_graph(eng);
      REQUIRE(boost::num_vertices(g) == kOps);
      std::vector<std::size_t> topo;
      CHECK_NOTHROW(boost::topological_sort(g, std::back_inserter(topo)));  // a DAG
      // Reference: two ops conflict when they share a var and one writes it;
      // the earlier must then reach the later through the recorded edges.
      for (int a = 0; a < kOps; ++a) {
        std::vector<boost::default_color_type> color(kOps);
        boost::breadth_first_search(
            g, static_cast<std::size_t>(a),
            boost::color_map(boost::make_iterator_property_map(
                color.begin(), boost::get(boost::vertex_index, g))));
        for (int b = a + 1; b < kOps; ++b) {
          bool conflict = false;
          for (int x : writes[a]) conflict |= reads[b].count(x) + writes[b].count(x) > 0;
          for (int x : reads[a]) conflict |= writes[b].count(x) > 0;
          if (conflict) {
            CAPTURE(a);
            CAPTURE(b);
            CHECK(color[b] != boost::white_color);
          }
        }
      }
      eng.waitall();
      for (auto e : boost::make_iterator_range(boost::edges(g))) {
        auto u = boost::source(e, g);
        auto v = boost::target(e, g);
        CHECK(iv[u].end < iv[v].start);
      }
    }
  }
}
