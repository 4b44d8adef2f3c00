// Observability: the Chrome-trace profiler (parsed back with a real JSON
// parser), blocking-call counters, sync debugging, and DOT export with the
// critical path.
#include <doctest/doctest.h>

#include <lazydag/engine/engine.hpp>
#include <lazydag/engine/graph.hpp>
#include <lazydag/engine/profiler.hpp>
#include <lazydag/engine/sync_debug.hpp>

#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <vector>

#include "support.hpp"

using namespace lazydag;
using namespace lazydag::engine;
namespace pt = boost::property_tree;

namespace {

std::string temp_path(const char* stem) {
  return (std::filesystem::temp_directory_path() /
          (std::string(stem) + "_" + std::to_string(::getpid())))
      .string();
}

}  // namespace

TEST_SUITE("engine") {
  TEST_CASE("Observability.TraceHasOneEventPerNodeWithFlowsAndWaits" * doctest::timeout(60)) {
    for (const auto& cfg : test::all_configs()) {
      CAPTURE(cfg.str());
      const std::string path = temp_path("lazydag_trace") + ".json";
      (void)profiler::event_count();
      profiler::dump(path);  // drop whatever an earlier case left
      Engine eng(cfg.options());
      profiler::start();
      // a chain a -> b -> c, and a fan d, e -> f
      Var x = eng.new_var();
      Var y = eng.new_var();
      Var z = eng.new_var();
      auto nop = [](const RunContext&) {};
      eng.push(nop, {}, {x}, {.name = "a"});
      eng.push(nop, {x}, {x}, {.name = "b"});
      eng.push(nop, {x}, {y}, {.name = "c"});
      eng.push(nop, {}, {z}, {.name = "d"});
      eng.push(nop, {y, z}, {z}, {.name = "f"});
      eng.wait_to_read(z);
      eng.waitall();
      profiler::stop();
      eng.push(nop, {}, {x}, {.name = "unprofiled"});
      eng.waitall();
      profiler::dump(path);

      pt::ptree root;
      REQUIRE_NOTHROW(pt::read_json(path, root));
      std::map<std::string, pt::ptree> ops;
      int flows_start = 0;
      int flows_finish = 0;
      int records = 0;
      int waits = 0;
      std::set<std::string> thread_names;
      for (const auto& [k, ev] : root.get_child("traceEvents")) {
        const std::string ph = ev.get<std::string>("ph");
        const std::string cat = ev.get<std::string>("cat", "");
        if (ph == "X" && cat == "op") ops[ev.get<std::string>("name")] = ev;
        if (ph == "s") ++flows_start;
        if (ph == "f") ++flows_finish;
        if (ph == "X" && cat == "record") ++records;
        if (ph == "X" && cat == "wait") ++waits;
        if (ph == "M" && ev.get<std::string>("name") == "thread_name") {
          thread_names.insert(ev.get<std::string>("args.name"));
        }
      }
      // exactly the recorded program: five ops, none of the unprofiled one
      CHECK(ops.size() == 5);
      for (const char* n : {"a", "b", "c", "d", "f"}) CHECK(ops.count(n) == 1);
      CHECK(ops.count("unprofiled") == 0);
      CHECK(records == 5);
      CHECK(waits == 2);
      // edges a->b, b->c, c->f, d->f: one flow arrow each (lazy keeps them
      // all pending at record time; other policies may finish a producer first)
      if (cfg.policy == Policy::kLazy) {
        CHECK(flows_start == 4);
        CHECK(flows_finish == 4);
      }
      CHECK(flows_start == flows_finish);
      // args carry ids and vars; times are consistent with the dependencies
      CHECK(ops["f"].get<std::string>("args.status") == "ok");
      CHECK(ops["b"].get_child("args.reads").size() == 1);
      // numbers read as text: ptree's numeric translator trips -Wmaybe-uninitialized
      auto num = [&](const char* n, const char* key) { return std::stod(ops[n].get<std::string>(key)); };
      auto end = [&](const char* n) { return num(n, "ts") + num(n, "dur"); };
      CHECK(end("a") <= num("b", "ts"));
      CHECK(end("c") <= num("f", "ts"));
      CHECK(num("f", "args.queued_us") >= 0.0);
      CHECK_FALSE(thread_names.empty());
      if (cfg.policy != Policy::kNaive) {
        bool has_worker_or_frontend = false;
        for (const auto& t : thread_names) has_worker_or_frontend |= !t.empty();
        CHECK(has_worker_or_frontend);
      }
      std::filesystem::remove(path);
    }
  }

  TEST_CASE("Observability.StreamNodesHaveTracksOfTheirStreams" * doctest::timeout(60)) {
    const Device sim0{DeviceKind::kSim, 0};
    auto on = [&](StreamKind k, const char* name) {
      PushOptions o;
      o.device = sim0;
      o.stream = k;
      o.name = name;
      return o;
    };
    for (const auto& cfg : test::all_configs()) {
      CAPTURE(cfg.str());
      const std::string path = temp_path("lazydag_stream_trace") + ".json";
      profiler::dump(path);  // drop whatever an earlier case left
      Engine eng(cfg.options());
      profiler::start();
      Var x = eng.new_var();
      Var y = eng.new_var();
      Var z = eng.new_var();
      Var w = eng.new_var();
      auto nop = [](const RunContext&) {};
      // a and b have no producer: spread over the two compute streams; c
      // follows one of them (or, finished both, takes the next stream) and
      // waits for the other's event; d on the CPU.
      eng.push(nop, {}, {w}, on(StreamKind::kCopyIn, "in"));
      eng.push(nop, {}, {x}, on(StreamKind::kCompute, "a"));
      eng.push(nop, {}, {y}, on(StreamKind::kCompute, "b"));
      eng.push(nop, {x, y, w}, {z}, on(StreamKind::kCompute, "c"));
      for (int i = 0; i < 20; ++i) eng.push(nop, {z}, {z}, on(StreamKind::kCompute, "more"));
      eng.push(nop, {z}, {x}, {.name = "d"});
      eng.waitall();
      profiler::stop();
      profiler::dump(path);

      pt::ptree root;
      REQUIRE_NOTHROW(pt::read_json(path, root));
      std::map<std::string, int> track_of_name;  // track name -> tid
      std::map<std::string, pt::ptree> ops;
      std::map<int, std::vector<std::pair<double, double>>> intervals;  // tid -> [ts, end)
      auto num = [](const pt::ptree& ev, const char* key) { return std::stod(ev.get<std::string>(key)); };
      for (const auto& [k, ev] : root.get_child("traceEvents")) {
        const std::string ph = ev.get<std::string>("ph");
        if (ph == "M" && ev.get<std::string>("name") == "thread_name") {
          track_of_name[ev.get<std::string>("args.name")] = std::stoi(ev.get<std::string>("tid"));
        }
        if (ph == "X" && ev.get<std::string>("cat", "") == "op") {
          ops[ev.get<std::string>("name")] = ev;
          intervals[std::stoi(ev.get<std::string>("tid"))].emplace_back(num(ev, "ts"),
                                                                         num(ev, "ts") + num(ev, "dur"));
        }
      }
      REQUIRE(ops.size() == 6);
      for (const char* t : {"sim(0) stream 0", "sim(0) stream 1", "sim(0) copy in"}) {
        CAPTURE(t);
        CHECK(track_of_name.count(t) == 1);
      }
      auto tid = [&](const char* op) { return std::stoi(ops[op].get<std::string>("tid")); };
      CHECK(tid("in") == track_of_name["sim(0) copy in"]);
      CHECK(tid("a") != tid("b"));
      CHECK((tid("c") == tid("a") || tid("c") == tid("b")));
      for (const char* op : {"in", "a", "b", "c"}) {
        CAPTURE(op);
        CHECK(ops[op].get<std::string>("args.device") == "sim(0)");
        CHECK(ops[op].get_child_optional("args.stream").has_value());
        CHECK(ops[op].get_child_optional("args.launch_us").has_value());
      }
      // the CPU node is on a thread's track, not a stream's
      CHECK_FALSE(ops["d"].get_child_optional("args.stream").has_value());
      for (const auto& [name, t] : track_of_name) {
        if (name.rfind("sim(", 0) == 0) CHECK(tid("d") != t);
      }
      // a stream runs one op at a time, in order; an event wait orders a
      // consumer after its producers on other streams
      for (auto& [t, iv] : intervals) {
        if (t == tid("d")) continue;
        std::sort(iv.begin(), iv.end());
        for (std::size_t i = 1; i < iv.size(); ++i) CHECK(iv[i - 1].second <= iv[i].first);
      }
      auto end = [&](const char* op) { return num(ops[op], "ts") + num(ops[op], "dur"); };
      CHECK(end("a") <= num(ops["c"], "ts"));
      CHECK(end("b") <= num(ops["c"], "ts"));
      CHECK(end("in") <= num(ops["c"], "ts"));
      CHECK(end("more") <= num(ops["d"], "ts"));
      std::filesystem::remove(path);
    }
  }

  TEST_CASE("Observability.BlockingCallsAreCountedByKind" * doctest::timeout(60)) {
    Engine eng(test::Config{Policy::kLazy, 2}.options());
    Var v = eng.new_var();
    eng.push([](const RunContext&) {}, {}, {v});
    eng.wait_to_read(v);
    eng.wait_to_read(v);
    eng.wait_to_write(v);
    eng.waitall();
    eng.wait_to_read(v, CallSite{BlockingCall::kItem, std::source_location::current()});
    EngineStats s = eng.stats();
    CHECK(s.blocking_calls[static_cast<int>(BlockingCall::kWaitToRead)] == 2);
    CHECK(s.blocking_calls[static_cast<int>(BlockingCall::kWaitToWrite)] == 1);
    CHECK(s.blocking_calls[static_cast<int>(BlockingCall::kWaitall)] == 1);
    CHECK(s.blocking_calls[static_cast<int>(BlockingCall::kItem)] == 1);
    CHECK(s.blocking_waits == 5);
    CHECK(s.blocked_ns > 0);
  }

  TEST_CASE("Observability.SyncDebugWarnsOncePerSiteAndErrorRefuses" * doctest::timeout(60)) {
    Engine eng(test::Config{Policy::kLazy, 2}.options());
    Var v = eng.new_var();
    eng.push([](const RunContext&) {}, {}, {v});
    clear_blocking_sites();
    set_sync_debug(SyncDebug::kWarn);
    std::ostringstream captured;
    auto* old = std::cerr.rdbuf(captured.rdbuf());
    int line_in_loop = 0;
    for (int i = 0; i < 10; ++i) {
      line_in_loop = __LINE__ + 1;
      eng.wait_to_read(v);  // the mistake: a blocking call in a loop
    }
    eng.waitall();
    std::cerr.rdbuf(old);
    set_sync_debug(SyncDebug::kOff);
    const std::string out = captured.str();
    // reported once per site, with its location
    const std::string site = std::string("test_observability.cpp:") + std::to_string(line_in_loop);
    CHECK(out.find(site) != std::string::npos);
    CHECK(out.find(site, out.find(site) + 1) == std::string::npos);
    auto sites = blocking_sites();
    REQUIRE(sites.size() == 2);
    std::map<std::uint32_t, BlockingSite> by_line;
    for (const auto& s : sites) by_line[s.line] = s;
    CHECK(by_line[static_cast<std::uint32_t>(line_in_loop)].count == 10);
    CHECK(by_line[static_cast<std::uint32_t>(line_in_loop)].kind == BlockingCall::kWaitToRead);
    CHECK(blocking_report().find("10 x wait_to_read()") != std::string::npos);

    // error mode: the blocking call throws before blocking
    Var w = eng.new_var();
    std::atomic<bool> ran{false};
    eng.push([&](const RunContext&) { ran = true; }, {}, {w});
    set_sync_debug(SyncDebug::kError);
    CHECK_THROWS_AS(eng.wait_to_read(w), BlockingCallError);
    CHECK_FALSE(ran.load());  // lazy: nothing ran, the wait was refused
    set_sync_debug(SyncDebug::kOff);
    eng.wait_to_read(w);
    CHECK(ran.load());
    CHECK(parse_sync_debug("warn") == SyncDebug::kWarn);
    CHECK_THROWS_AS((void)parse_sync_debug("loud"), InvalidArgument);
    clear_blocking_sites();
  }

  TEST_CASE("Observability.DotExportMarksTheCriticalPath" * doctest::timeout(60)) {
    Engine eng(test::Config{Policy::kLazy, 1}.options(0));
    auto nop = [](const RunContext&) {};
    Var a = eng.new_var();
    Var b = eng.new_var();
    Var c = eng.new_var();
    // long chain on a (4 ops), short chain on b (1 op), c reads both
    for (int i = 0; i < 4; ++i) eng.push(nop, {a}, {a}, {.name = "chain"});
    eng.push(nop, {}, {b}, {.name = "side"});
    eng.push(nop, {a, b}, {c}, {.name = "join"});
    Var unrelated = eng.new_var();
    eng.push(nop, {}, {unrelated}, {.name = "unrelated"});
    PendingGraph g = pending_graph(eng);
    std::vector<std::size_t> path = critical_path(g);
    REQUIRE(path.size() == 5);  // chain x4 -> join
    CHECK(g[path.back()].name == "join");
    CHECK(g[path.front()].name == "chain");
    PendingGraph sub = required_subgraph(g, c);
    CHECK(boost::num_vertices(sub) == 6);  // everything but "unrelated"
    const std::string path_dot = temp_path("lazydag_graph") + ".dot";
    dump_graph(eng, path_dot);
    std::ifstream in(path_dot);
    std::stringstream text;
    text << in.rdbuf();
    const std::string dot = text.str();
    CHECK(dot.rfind("digraph", 0) == 0);
    CHECK(dot.find("join #") != std::string::npos);
    CHECK(dot.find("unrelated #") != std::string::npos);
    std::size_t red_edges = 0;
    for (std::size_t at = dot.find("->"); at != std::string::npos; at = dot.find("->", at + 1)) {
      const std::size_t eol = dot.find('\n', at);
      red_edges += dot.substr(at, eol - at).find("color=red") != std::string::npos ? 1 : 0;
    }
    CHECK(red_edges == 4);
    dump_graph(eng, path_dot, c);
    std::ifstream in2(path_dot);
    std::stringstream text2;
    text2 << in2.rdbuf();
    CHECK(text2.str().find("unrelated") == std::string::npos);
    std::filesystem::remove(path_dot);
    eng.waitall();
  }
}
