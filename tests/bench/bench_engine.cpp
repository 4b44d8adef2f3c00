// Engine overhead per op on five workloads, beside the same workloads written
// directly against oneTBB's flow graph (one node per op) and against
// tbb::task_group with hand-written atomic join counters, in the same run;
// and how far frontend work overlaps backend work under each policy.
// Prints one key=value line per figure: medians of repeats, ns per op.
#include <lazydag/engine/engine.hpp>
#include <lazydag/engine/profiler.hpp>

#include <oneapi/tbb/flow_graph.h>
#include <oneapi/tbb/task_group.h>

#include "bench_util.hpp"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using namespace lazydag::engine;
namespace flow = tbb::flow;

namespace {

using lazydag::bench::Clock;
using lazydag::bench::since;
// fn() returns the seconds it measured itself.
double median_seconds(const std::function<double()>& fn) { return lazydag::bench::median_of(fn); }

constexpr int kChain = 10000;
constexpr int kIndependent = 100000;
constexpr int kLayers = 1000;
constexpr int kWidth = 8;

// The overlap workload: each step the frontend spins kOverlapUs of host work
// and records one node that spins kOverlapUs.
constexpr int kOverlapSteps = 500;
constexpr double kOverlapUs = 20;

// A busy loop of volatile arithmetic, `iters` rounds.
void spin(std::uint64_t iters) {
  volatile std::uint64_t x = 0;
  for (std::uint64_t i = 0; i < iters; ++i) x = x + i;
}

// Rounds of spin() that take `us` microseconds on this machine: the loop is
// doubled until one run lasts a few milliseconds, then scaled by the median
// of five runs of that length.
std::uint64_t calibrate_spin(double us) {
  std::uint64_t iters = 1024;
  for (;;) {
    auto t0 = Clock::now();
    spin(iters);
    if (since(t0) > 2e-3) break;
    iters *= 2;
  }
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) {
    auto t0 = Clock::now();
    spin(iters);
    t.push_back(since(t0));
  }
  std::sort(t.begin(), t.end());
  return std::max<std::uint64_t>(1, static_cast<std::uint64_t>(static_cast<double>(iters) * us * 1e-6 / t[2]));
}

// What the chain and independent nodes write, on a cache line of its own
// (alignas makes the struct a whole line): every workload's, lazydag's and
// the peers' alike.
struct alignas(64) Sink {
  std::uint64_t value = 0;
};

// ---- lazydag ------------------------------------------------------------

struct EngineBench {
  Engine eng;
  std::vector<Var> vars;
  // The nodes write it on a worker while the frontend reads `eng` and
  // `vars` for every push: on a shared line, the line moved between the
  // cores on every node (docs/benchmarks.md, "The sinks' cache lines").
  Sink sink;

  explicit EngineBench(EngineOptions o) : eng(o) {
    for (int i = 0; i < kIndependent; ++i) vars.push_back(eng.new_var());
  }

  double push_only() {
    // Timed: recording only. The engine is built with an unbounded window so
    // nothing starts; the run afterwards is not timed.
    auto t0 = Clock::now();
    for (int i = 0; i < kIndependent; ++i) {
      eng.push([](const RunContext&) {}, {}, {vars[i]});
    }
    double t = since(t0);
    eng.waitall();
    return t;
  }

  double chain(bool sync) {
    Var x = vars[0];
    std::uint64_t* s = &sink.value;
    auto t0 = Clock::now();
    for (int i = 0; i < kChain; ++i) {
      eng.push([s](const RunContext&) { ++*s; }, {x}, {x});
      if (sync) eng.wait_to_read(x);
    }
    eng.waitall();
    return since(t0);
  }

  double independent() {
    std::uint64_t* s = &sink.value;
    auto t0 = Clock::now();
    for (int i = 0; i < kIndependent; ++i) {
      eng.push([s, i](const RunContext&) { s[0] += 0 * i; }, {}, {vars[i]});
    }
    eng.waitall();
    return since(t0);
  }

  double fan() {
    auto t0 = Clock::now();
    for (int l = 0; l < kLayers; ++l) {
      std::span<const Var> prev(vars.data() + (l - 1) * kWidth, l == 0 ? 0 : kWidth);
      for (int k = 0; k < kWidth; ++k) {
        Var out = vars[l * kWidth + k];
        eng.push([](const RunContext&) {}, prev, std::span<const Var>(&out, 1));
      }
    }
    eng.waitall();
    return since(t0);
  }

  // A chain of kChain dependent nodes on stream devices: alternately on `a`
  // and `b` (on one device: one stream, ordered by the stream; on two: an
  // event wait per edge). Launch, device-side ordering and the completion
  // report, per node.
  double stream_chain(Device a, Device b, bool sync) {
    Var x = vars[0];
    std::uint64_t* s = &sink.value;
    auto t0 = Clock::now();
    for (int i = 0; i < kChain; ++i) {
      PushOptions o;
      o.device = i % 2 == 0 ? a : b;
      eng.push([s](const RunContext&) { ++*s; }, {x}, {x}, o);
      if (sync) eng.wait_to_read(x);
    }
    eng.waitall();
    return since(t0);
  }

  // kOverlapSteps steps of host work (host_iters rounds of spin) each
  // followed by one node of node_iters rounds, the nodes chained through one
  // var as a training loop's updates are; then waitall.
  double overlap(std::uint64_t host_iters, std::uint64_t node_iters) {
    Var x = vars[0];
    auto t0 = Clock::now();
    for (int i = 0; i < kOverlapSteps; ++i) {
      spin(host_iters);
      eng.push([node_iters](const RunContext&) { spin(node_iters); }, {x}, {x});
    }
    eng.waitall();
    return since(t0);
  }

  // Per wait: push one write of a var that nothing else touches, then
  // wait_to_read it; averaged over kFreshWaits waits with `unrelated` nodes
  // recorded (unbounded window): under lazy pending the whole time, under
  // eager a chain the workers run meanwhile.
  static constexpr int kFreshWaits = 1000;
  double fresh_wait(int unrelated) {
    Var busy = vars[1];
    for (int i = 0; i < unrelated; ++i) eng.push([](const RunContext&) {}, {busy}, {busy});
    auto t0 = Clock::now();
    for (int i = 0; i < kFreshWaits; ++i) {
      Var fresh = vars[2 + i];
      eng.push([](const RunContext&) {}, {}, {fresh});
      eng.wait_to_read(fresh);
    }
    double t = since(t0) / kFreshWaits;
    eng.waitall();
    return t;
  }
};

// ---- oneTBB flow graph peer: one continue_node per op -------------------

using Node = flow::continue_node<flow::continue_msg>;

double tbb_push_only() {
  flow::graph g;
  std::vector<std::unique_ptr<Node>> nodes;
  nodes.reserve(kIndependent);
  auto t0 = Clock::now();
  for (int i = 0; i < kIndependent; ++i) {
    nodes.push_back(std::make_unique<Node>(g, [](const flow::continue_msg&) {}));
  }
  return since(t0);
}

double tbb_chain(bool sync, std::uint64_t& sink) {
  flow::graph g;
  std::vector<std::unique_ptr<Node>> nodes;
  nodes.reserve(kChain);
  std::uint64_t* s = &sink;
  auto t0 = Clock::now();
  for (int i = 0; i < kChain; ++i) {
    nodes.push_back(std::make_unique<Node>(g, [s](const flow::continue_msg&) { ++*s; }));
    if (sync) {
      nodes.back()->try_put(flow::continue_msg());
      g.wait_for_all();
    } else if (i > 0) {
      flow::make_edge(*nodes[i - 1], *nodes[i]);
    }
  }
  if (!sync) {
    nodes[0]->try_put(flow::continue_msg());
    g.wait_for_all();
  }
  return since(t0);
}

double tbb_independent(std::uint64_t& sink) {
  flow::graph g;
  std::vector<std::unique_ptr<Node>> nodes;
  nodes.reserve(kIndependent);
  std::uint64_t* s = &sink;
  auto t0 = Clock::now();
  for (int i = 0; i < kIndependent; ++i) {
    nodes.push_back(std::make_unique<Node>(g, [s, i](const flow::continue_msg&) { s[0] += 0 * i; }));
    nodes.back()->try_put(flow::continue_msg());
  }
  g.wait_for_all();
  return since(t0);
}

double tbb_fan() {
  flow::graph g;
  std::vector<std::unique_ptr<Node>> nodes;
  nodes.reserve(kLayers * kWidth);
  auto t0 = Clock::now();
  for (int l = 0; l < kLayers; ++l) {
    for (int k = 0; k < kWidth; ++k) {
      nodes.push_back(std::make_unique<Node>(g, [](const flow::continue_msg&) {}));
      if (l > 0) {
        for (int p = 0; p < kWidth; ++p) flow::make_edge(*nodes[(l - 1) * kWidth + p], *nodes.back());
      }
    }
  }
  for (int k = 0; k < kWidth; ++k) nodes[k]->try_put(flow::continue_msg());
  g.wait_for_all();
  return since(t0);
}

// ---- task_group peer: hand-written atomic join counters -----------------
// The practical floor for a dependency scheduler: a node is a join counter
// and a successor list; a task that finishes decrements its successors'
// counters, carries on with the first that reaches zero and spawns the rest.
// As with the flow graph peer, the whole graph is built before it starts.

struct CounterNode {
  std::atomic<int> join{0};  // unfinished predecessors
  void (*body)(std::uint64_t*) = nullptr;
  std::uint64_t* arg = nullptr;
  std::vector<CounterNode*> succ;
};

void run_counted(tbb::task_group& tg, CounterNode* n) {
  while (n != nullptr) {
    n->body(n->arg);
    CounterNode* next = nullptr;
    for (CounterNode* s : n->succ) {
      // acq_rel: the last predecessor's decrement publishes every
      // predecessor's writes to whoever runs the successor.
      if (s->join.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        if (next == nullptr) {
          next = s;
        } else {
          tg.run([&tg, s] { run_counted(tg, s); });
        }
      }
    }
    n = next;
  }
}

void increment(std::uint64_t* s) { ++*s; }
void nothing(std::uint64_t*) {}

std::unique_ptr<CounterNode> counter_node(void (*body)(std::uint64_t*), std::uint64_t* arg) {
  auto n = std::make_unique<CounterNode>();
  n->body = body;
  n->arg = arg;
  return n;
}

double counters_push_only() {
  std::vector<std::unique_ptr<CounterNode>> nodes;
  nodes.reserve(kIndependent);
  auto t0 = Clock::now();
  for (int i = 0; i < kIndependent; ++i) nodes.push_back(counter_node(nothing, nullptr));
  return since(t0);
}

double counters_chain(bool sync, std::uint64_t& sink) {
  tbb::task_group tg;
  std::vector<std::unique_ptr<CounterNode>> nodes;
  nodes.reserve(kChain);
  auto t0 = Clock::now();
  for (int i = 0; i < kChain; ++i) {
    nodes.push_back(counter_node(increment, &sink));
    CounterNode* n = nodes.back().get();
    if (sync) {
      tg.run([&tg, n] { run_counted(tg, n); });
      tg.wait();
    } else if (i > 0) {
      nodes[i - 1]->succ.push_back(n);
      n->join.store(1, std::memory_order_relaxed);
    }
  }
  if (!sync) {
    CounterNode* first = nodes[0].get();
    tg.run([&tg, first] { run_counted(tg, first); });
    tg.wait();
  }
  return since(t0);
}

double counters_independent(std::uint64_t& sink) {
  tbb::task_group tg;
  std::vector<std::unique_ptr<CounterNode>> nodes;
  nodes.reserve(kIndependent);
  auto t0 = Clock::now();
  for (int i = 0; i < kIndependent; ++i) {
    // the flow graph peer's body adds 0 * i; a sink no other task writes
    nodes.push_back(counter_node(nothing, &sink));
    CounterNode* n = nodes.back().get();
    tg.run([&tg, n] { run_counted(tg, n); });
  }
  tg.wait();
  return since(t0);
}

double counters_fan() {
  tbb::task_group tg;
  std::vector<std::unique_ptr<CounterNode>> nodes;
  nodes.reserve(kLayers * kWidth);
  auto t0 = Clock::now();
  for (int l = 0; l < kLayers; ++l) {
    for (int k = 0; k < kWidth; ++k) {
      nodes.push_back(counter_node(nothing, nullptr));
      if (l > 0) {
        for (int p = 0; p < kWidth; ++p) nodes[(l - 1) * kWidth + p]->succ.push_back(nodes.back().get());
        nodes.back()->join.store(kWidth, std::memory_order_relaxed);
      }
    }
  }
  for (int k = 0; k < kWidth; ++k) {
    CounterNode* n = nodes[k].get();
    tg.run([&tg, n] { run_counted(tg, n); });
  }
  tg.wait();
  return since(t0);
}

void line(const char* workload, const std::string& who, double seconds, int ops) {
  std::printf("bench=engine workload=%s %s ns_per_op=%.1f\n", workload, who.c_str(),
              seconds / ops * 1e9);
}

}  // namespace

int main() {
  const int threads = static_cast<int>(std::max(1U, std::thread::hardware_concurrency()));
  Sink tbb_sink;
  Sink counters_sink;
  struct Peer {
    const char* workload;
    int ops;
    std::function<double()> flow_graph;
    std::function<double()> counters;
  };
  std::vector<Peer> peers = {
      {"push_only", kIndependent, [] { return tbb_push_only(); }, [] { return counters_push_only(); }},
      {"chain_async", kChain, [&] { return tbb_chain(false, tbb_sink.value); },
       [&] { return counters_chain(false, counters_sink.value); }},
      {"chain_sync", kChain, [&] { return tbb_chain(true, tbb_sink.value); },
       [&] { return counters_chain(true, counters_sink.value); }},
      {"independent", kIndependent, [&] { return tbb_independent(tbb_sink.value); },
       [&] { return counters_independent(counters_sink.value); }},
      {"fan", kLayers * kWidth, [] { return tbb_fan(); }, [] { return counters_fan(); }},
  };
  std::vector<double> peer_ns;
  std::vector<double> counters_ns;
  for (auto& p : peers) {
    double t = median_seconds(p.flow_graph);
    peer_ns.push_back(t / p.ops * 1e9);
    line(p.workload, "peer=tbb_flow_graph", t, p.ops);
    t = median_seconds(p.counters);
    counters_ns.push_back(t / p.ops * 1e9);
    line(p.workload, "peer=tbb_counters", t, p.ops);
  }

  // lazy and eager on every hardware thread, then the engine's defaults
  // (EngineOptions{}: its default policy, and num_threads 0, which lets the
  // engine choose), labelled default=1.
  struct Run {
    Policy policy;
    int num_threads;
    bool is_default;
  };
  const EngineOptions defaults{};
  // The default policy with one worker fewer than the hardware threads
  // (the frontend and the workers together one per core): the measurement
  // behind EngineOptions::num_threads' default (docs/benchmarks.md, "How
  // many workers").
  std::vector<Run> policy_runs = {
      {Policy::kLazy, threads, false},
      {Policy::kEager, threads, false},
      {defaults.policy, defaults.num_threads, true},
  };
  if (threads > 1) policy_runs.push_back({defaults.policy, threads - 1, false});
  std::vector<std::vector<double>> engine_ns;  // [policy run][workload]
  std::vector<std::string> run_names;
  for (const Run& run : policy_runs) {
    engine_ns.emplace_back();
    EngineOptions o = defaults;
    o.policy = run.policy;
    o.num_threads = run.num_threads;
    EngineOptions unbounded = o;
    unbounded.max_pending = 0;
    EngineBench windowed(o);
    EngineBench open(unbounded);
    std::vector<std::pair<const char*, std::function<double()>>> runs = {
        {"push_only", [&] { return open.push_only(); }},
        {"chain_async", [&] { return windowed.chain(false); }},
        {"chain_sync", [&] { return windowed.chain(true); }},
        {"independent", [&] { return windowed.independent(); }},
        {"fan", [&] { return windowed.fan(); }},
    };
    std::string who = "policy=" + std::string(to_string(run.policy)) + " threads=" +
                      std::to_string(windowed.eng.num_threads()) + (run.is_default ? " default=1" : "");
    run_names.push_back(std::string(to_string(run.policy)) +
                        (run.is_default ? "(default)" : run.num_threads != threads ? "/" + std::to_string(run.num_threads) : ""));
    for (std::size_t i = 0; i < runs.size(); ++i) {
      double t = median_seconds(runs[i].second);
      double ns = t / peers[i].ops * 1e9;
      engine_ns.back().push_back(ns);
      line(runs[i].first, who, t, peers[i].ops);
      std::printf("bench=engine workload=%s %s ratio_vs_tbb=%.2f ratio_vs_counters=%.2f\n", runs[i].first,
                  who.c_str(), ns / peer_ns[i], ns / counters_ns[i]);
    }
    if (run.policy == Policy::kLazy && !run.is_default) {
      // The profiler's cost: the same workloads with it recording (its
      // buffers are dumped to /dev/null between repeats, untimed).
      for (std::size_t i : {std::size_t{1}, std::size_t{3}}) {
        auto profiled = [&] {
          lazydag::profiler::start();
          double t = runs[i].second();
          lazydag::profiler::stop();
          lazydag::profiler::dump("/dev/null");
          return t;
        };
        const double on = median_seconds(profiled) / peers[i].ops * 1e9;
        std::printf("bench=engine workload=%s %s profiler=on ns_per_op=%.1f overhead_vs_off=%.2f\n",
                    runs[i].first, who.c_str(), on, on / engine_ns.back()[i]);
      }
    }
    if (run.policy == Policy::kLazy || run.is_default) {
      for (int unrelated : {1000, 10000, 100000, 1000000}) {
        double t = median_seconds([&] { return open.fresh_wait(unrelated); });
        std::printf("bench=engine workload=fresh_wait %s unrelated=%d ns_per_push_and_wait=%.1f\n",
                    who.c_str(), unrelated, t * 1e9);
      }
    }
  }

  // Recording threads: the same pushes from one thread, then split over
  // two threads on disjoint vars. Each step is an NDArray op's pattern: a
  // new var written from one of the thread's vars, read into another, then
  // deleted. Under the defaults the nodes are small (cost_bytes), so they
  // run where they are recorded: the figure is recording's own cost, each
  // thread's final wait included. Under lazy, with no window, nothing runs
  // while the threads record (each into a list of its own): the figure is
  // the time until every thread has recorded, and the waitall after it is
  // not timed. ratio_vs_one_recorder below 1: two threads record the same
  // work faster than one.
  {
    constexpr int kSteps = 50000;
    auto record_with = [&](Engine& eng, int recorders) {
      const bool lazy = eng.policy() == Policy::kLazy;
      std::vector<std::vector<Var>> own(static_cast<std::size_t>(recorders));
      for (auto& vs : own) {
        for (int i = 0; i < 64; ++i) vs.push_back(eng.new_var());
      }
      auto body = [&](int t) {
        const std::vector<Var>& vs = own[static_cast<std::size_t>(t)];
        for (int i = 0; i < kSteps / recorders; ++i) {
          const Var tmp = eng.new_var();
          eng.push([](const RunContext&) {}, {vs[i % 64]}, {tmp}, {.name = "step", .cost_bytes = 8});
          eng.push([](const RunContext&) {}, {tmp}, {vs[(i + 1) % 64]}, {.name = "step", .cost_bytes = 8});
          eng.delete_var(tmp);
        }
        if (!lazy) eng.wait_to_read(vs[0]);
      };
      const auto t0 = lazydag::bench::Clock::now();
      std::vector<std::thread> others;
      for (int t = 1; t < recorders; ++t) others.emplace_back(body, t);
      body(0);
      for (auto& th : others) th.join();
      if (!lazy) eng.waitall();
      const double seconds = lazydag::bench::since(t0);
      eng.waitall();
      for (auto& vs : own) {
        for (const Var v : vs) eng.delete_var(v);
      }
      return seconds;
    };
    EngineOptions lazy_options;
    lazy_options.policy = Policy::kLazy;
    lazy_options.max_pending = 0;
    for (const EngineOptions& options : {defaults, lazy_options}) {
      const std::string who = options.policy == defaults.policy
                                  ? std::string("default=1")
                                  : "policy=" + std::string(to_string(options.policy)) + " max_pending=0";
      // One engine for all the runs: the figure is recording's, not the
      // growth of a new engine's node pool (under lazy with no window,
      // 100,000 nodes' worth of fresh pages).
      Engine eng(options);
      const auto [one, two] = lazydag::bench::interleaved_median_of([&] { return record_with(eng, 1); },
                                                                    [&] { return record_with(eng, 2); });
      std::printf("bench=engine workload=recorders recorders=1 %s ns_per_push=%.1f\n", who.c_str(),
                  one / (2.0 * kSteps) * 1e9);
      std::printf("bench=engine workload=recorders recorders=2 %s ns_per_push=%.1f ratio_vs_one_recorder=%.2f\n",
                  who.c_str(), two / (2.0 * kSteps) * 1e9, two / one);
    }
  }

  // Overlap: the frontend's host work beside the nodes' backend work. F and
  // C are measured alone (the host spins back to back; the node bodies
  // called inline), T with both; overlap_efficiency = (F + C) / T is 1 when
  // nothing overlaps and 2 when F = C overlap perfectly.
  // F, C and T are measured back to back in each repeat and the efficiency
  // is the median of the repeats' own ratios: measured apart, a change in
  // the machine's speed between them made the figure meaningless.
  {
    const std::uint64_t iters = calibrate_spin(kOverlapUs);
    auto host_run = [&] {
      auto t0 = Clock::now();
      for (int i = 0; i < kOverlapSteps; ++i) spin(iters);
      return since(t0);
    };
    auto node_run = [&] {
      const RunContext ctx{};
      auto body = [iters](const RunContext&) { spin(iters); };
      auto t0 = Clock::now();
      for (int i = 0; i < kOverlapSteps; ++i) body(ctx);
      return since(t0);
    };
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    for (const Run& run : policy_runs) {
      EngineOptions o = defaults;
      o.policy = run.policy;
      o.num_threads = run.num_threads;
      EngineBench b(o);
      (void)b.overlap(iters, iters);  // warm-up
      std::vector<double> host, node, total, efficiency;
      for (int r = 0; r < lazydag::bench::repeats(7); ++r) {
        host.push_back(host_run());
        node.push_back(node_run());
        total.push_back(b.overlap(iters, iters));
        efficiency.push_back((host.back() + node.back()) / total.back());
      }
      std::printf("bench=engine workload=overlap policy=%s threads=%d%s steps=%d F_us=%.1f C_us=%.1f "
                  "total_ms=%.2f overlap_efficiency=%.2f\n",
                  std::string(to_string(run.policy)).c_str(), b.eng.num_threads(),
                  run.is_default ? " default=1" : "", kOverlapSteps, median(host) / kOverlapSteps * 1e6,
                  median(node) / kOverlapSteps * 1e6, median(total) * 1e3, median(efficiency));
    }
  }

  // Stream devices (the emulated sim device): per-node cost of launch +
  // device ordering + completion, beside the CPU chain of the same engine.
  std::vector<std::vector<double>> stream_ns;
  const Device sim0{DeviceKind::kSim, 0};
  const Device sim1{DeviceKind::kSim, 1};
  const char* stream_workloads[] = {"sim_chain_async", "sim_chain_sync", "sim_cross_device"};
  for (Policy policy : {Policy::kLazy, Policy::kEager}) {
    EngineOptions o;
    o.policy = policy;
    o.num_threads = threads;
    EngineBench b(o);
    const std::string who = "policy=" + std::string(to_string(policy)) + " threads=" + std::to_string(threads);
    const double t[] = {median_seconds([&] { return b.stream_chain(sim0, sim0, false); }),
                        median_seconds([&] { return b.stream_chain(sim0, sim0, true); }),
                        median_seconds([&] { return b.stream_chain(sim0, sim1, false); })};
    stream_ns.emplace_back();
    for (int i = 0; i < 3; ++i) {
      line(stream_workloads[i], who, t[i], kChain);
      stream_ns.back().push_back(t[i] / kChain * 1e9);
    }
  }

  // The wake-up cost behind a synchronous op on a stream device: one round
  // trip between two threads that sleep on a condition variable between
  // turns (the frontend wakes the stream's executor, which wakes the
  // frontend when done). Waits for a launched node spin briefly first, so
  // sim_chain_sync can beat it.
  const double handoff = median_seconds([&] {
    std::mutex m;
    std::condition_variable cv;
    int turn = 0;
    std::thread other([&] {
      std::unique_lock lk(m);
      for (int i = 0; i < kChain; ++i) {
        cv.wait(lk, [&] { return turn == 1; });
        turn = 0;
        cv.notify_one();
      }
    });
    auto t0 = Clock::now();
    {
      std::unique_lock lk(m);
      for (int i = 0; i < kChain; ++i) {
        turn = 1;
        cv.notify_one();
        cv.wait(lk, [&] { return turn == 0; });
      }
    }
    const double t = since(t0);
    other.join();
    return t;
  }) / kChain * 1e9;
  std::printf("bench=engine workload=thread_roundtrip peer=condition_variable ns_per_roundtrip=%.1f\n", handoff);

  // The floor of any hand-over between cores: one cache line bounced
  // between two spinning threads (a store, then the other core's load sees
  // it and answers). Handing a node to a worker moves several lines (the
  // node, the queue slot, the output's bookkeeping, the graveyard) there
  // and back, so a node whose work is below a few of these round trips is
  // cheaper where it is recorded (docs/benchmarks.md).
  constexpr int kTrips = 100000;
  const double line_trip = median_seconds([&] {
    alignas(64) std::atomic<int> word{0};
    // Spins, yielding only when the other thread seems not to run (both on
    // one core of a loaded machine).
    auto await = [&](int value) {
      for (unsigned k = 0; word.load(std::memory_order_acquire) != value; ++k) {
        if (k >= 4096) std::this_thread::yield();
      }
    };
    std::thread other([&] {
      for (int i = 0; i < kTrips; ++i) {
        await(2 * i + 1);
        word.store(2 * i + 2, std::memory_order_release);
      }
    });
    auto t0 = Clock::now();
    for (int i = 0; i < kTrips; ++i) {
      word.store(2 * i + 1, std::memory_order_release);
      await(2 * i + 2);
    }
    const double t = since(t0);
    other.join();
    return t;
  }) / kTrips * 1e9;
  std::printf("bench=engine workload=line_roundtrip peer=spinning_threads ns_per_roundtrip=%.1f\n", line_trip);
  for (int p = 0; p < 2; ++p) {
    std::printf("bench=engine workload=sim_chain_sync policy=%s threads=%d ratio_vs_roundtrip=%.2f\n",
                p == 0 ? "lazy" : "eager", threads, stream_ns[static_cast<std::size_t>(p)][1] / handoff);
  }

  // The same figures as a table (ns per op, medians; goals for 2 cores).
  const char* goals[] = {"-", "<= 100", "<= 200", "<= 200", "<= 250"};
  std::printf("\n%-12s %8s", "workload", "goal");
  for (const auto& n : run_names) std::printf(" %14s", n.c_str());
  std::printf(" %10s %10s %10s %10s\n", "tbb_flow", "counters", "lazy/tbb", "lazy/cntrs");
  for (std::size_t i = 0; i < peers.size(); ++i) {
    std::printf("%-12s %8s", peers[i].workload, goals[i]);
    for (const auto& ns : engine_ns) std::printf(" %14.1f", ns[i]);
    std::printf(" %10.1f %10.1f %10.2f %10.2f\n", peer_ns[i], counters_ns[i], engine_ns[0][i] / peer_ns[i],
                engine_ns[0][i] / counters_ns[i]);
  }
  for (int i = 0; i < 3; ++i) {
    std::printf("%-16s %4s %14.1f %14.1f %14s\n", stream_workloads[i], "-", stream_ns[0][static_cast<std::size_t>(i)],
                stream_ns[1][static_cast<std::size_t>(i)], "-");
  }
  std::printf("%-16s %4s %14.1f  (two threads that sleep between turns: the wake-up cost behind sim_chain_sync)\n",
              "thread_roundtrip", "-", handoff);
  std::printf("%-16s %4s %14.1f  (one cache line bounced between two spinning threads: the floor of a hand-over)\n",
              "line_roundtrip", "-", line_trip);
  return 0;
}
