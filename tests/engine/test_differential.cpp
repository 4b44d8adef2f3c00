// The main correctness net: random programs of reads, writes, read-modify-
// writes, failing ops and waits give identical observations under naive
// (the reference), lazy and eager with 1, 2 and 4 workers.
#include <doctest/doctest.h>

#include <lazydag/engine/engine.hpp>

#include <cstdlib>
#include <random>
#include <sstream>
#include <string>

#include "support.hpp"

using namespace lazydag;
using namespace lazydag::engine;

namespace {

std::uint64_t mix(std::uint64_t h, std::uint64_t x) {
  h ^= x + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h *= 0xff51afd7ed558ccdULL;
  return h ^ (h >> 33);
}

struct OpSpec {
  std::vector<int> reads;
  std::vector<int> writes;
  bool fails = false;
};

struct Step {
  enum Kind { kPush, kWaitRead, kWaitWrite, kWaitAll } kind = kPush;
  OpSpec op;
  int var = 0;
};

std::vector<Step> make_program(std::uint32_t seed, int num_vars, int num_ops) {
  std::mt19937 rng(seed);
  auto coin = [&](double p) { return std::uniform_real_distribution<double>(0, 1)(rng) < p; };
  std::uniform_int_distribution<int> var(0, num_vars - 1);
  std::vector<Step> prog;
  for (int i = 0; i < num_ops; ++i) {
    Step s;
    s.op.fails = coin(0.03);
    int nr = std::uniform_int_distribution<int>(0, 3)(rng);
    int nw = std::uniform_int_distribution<int>(1, 3)(rng);
    for (int k = 0; k < nr; ++k) s.op.reads.push_back(var(rng));
    for (int k = 0; k < nw; ++k) s.op.writes.push_back(var(rng));
    prog.push_back(s);
    if (coin(0.05)) prog.push_back(Step{Step::kWaitRead, {}, var(rng)});
    if (coin(0.02)) prog.push_back(Step{Step::kWaitWrite, {}, var(rng)});
    if (coin(0.01)) prog.push_back(Step{Step::kWaitAll, {}, 0});
  }
  return prog;
}

// Runs the program and returns everything observable: values seen by waits,
// errors thrown (by op name), final values and poisoned vars.
std::string run_program(const std::vector<Step>& prog, int num_vars, const EngineOptions& o) {
  Engine eng(o);
  std::vector<Var> vars;
  std::vector<std::uint64_t> values(num_vars);
  for (int i = 0; i < num_vars; ++i) {
    vars.push_back(eng.new_var());
    values[i] = mix(0, i);
  }
  std::ostringstream log;
  auto guarded = [&](auto&& wait) {
    try {
      wait();
      return std::string();
    } catch (const OpError& e) {
      return "E:" + e.op_name();
    }
  };
  for (std::size_t i = 0; i < prog.size(); ++i) {
    const Step& s = prog[i];
    switch (s.kind) {
      case Step::kPush: {
        std::vector<Var> r;
        std::vector<Var> w;
        for (int x : s.op.reads) r.push_back(vars[x]);
        for (int x : s.op.writes) w.push_back(vars[x]);
        const OpSpec* spec = &s.op;
        std::uint64_t id = i;
        eng.push(
            [spec, id, &values](const RunContext&) {
              if (spec->fails) throw std::runtime_error("injected");
              std::uint64_t h = mix(id, 1);
              for (int x : spec->reads) h = mix(h, values[x]);
              for (int x : spec->writes) h = mix(h, values[x] * 3);  // RMW sees the old value
              for (int x : spec->writes) values[x] = mix(h, x);
            },
            r, w, {.name = "op" + std::to_string(i)});
        break;
      }
      case Step::kWaitRead: {
        std::string e = guarded([&] { eng.wait_to_read(vars[s.var]); });
        log << "R" << s.var << "=" << (e.empty() ? std::to_string(values[s.var]) : e) << ";";
        break;
      }
      case Step::kWaitWrite: {
        std::string e = guarded([&] { eng.wait_to_write(vars[s.var]); });
        log << "W" << s.var << "=" << (e.empty() ? std::to_string(values[s.var]) : e) << ";";
        break;
      }
      case Step::kWaitAll:
        log << "A=" << guarded([&] { eng.waitall(); }) << ";";
        break;
    }
  }
  log << "|A=" << guarded([&] { eng.waitall(); }) << "|";
  for (int x = 0; x < num_vars; ++x) {
    std::string e = guarded([&] { eng.wait_to_read(vars[x]); });
    log << x << "=" << (e.empty() ? std::to_string(values[x]) : e) << ";";
  }
  return log.str();
}

}  // namespace

TEST_SUITE("engine") {
  TEST_CASE("Differential.RandomProgramsMatchTheNaivePolicy" * doctest::timeout(300)) {
    int seeds = 400;
    if (const char* s = std::getenv("LAZYDAG_DIFF_SEEDS")) seeds = std::atoi(s);
    int mismatches = 0;
    int poisoned_runs = 0;
    for (int seed = 1; seed <= seeds; ++seed) {
      const int num_vars = 4 + seed % 13;
      const int num_ops = 50 + (seed * 37) % 250;
      auto prog = make_program(static_cast<std::uint32_t>(seed), num_vars, num_ops);
      EngineOptions naive;
      naive.policy = Policy::kNaive;
      const std::string ref = run_program(prog, num_vars, naive);
      poisoned_runs += ref.find("E:op") != std::string::npos ? 1 : 0;
      for (const auto& cfg : test::all_configs()) {
        if (cfg.policy == Policy::kNaive) continue;
        // small windows on some seeds so the window logic is exercised too
        const std::size_t window = seed % 3 == 0 ? 8 : 16384;
        const std::string got = run_program(prog, num_vars, cfg.options(window));
        if (got != ref) {
          ++mismatches;
          CAPTURE(seed);
          CAPTURE(cfg.str());
          CHECK(got == ref);
        }
      }
    }
    CHECK(mismatches == 0);
    CHECK(poisoned_runs > seeds / 4);  // the failure paths were exercised
    MESSAGE("differential: seeds=" << seeds << " configs=6 mismatches=" << mismatches
                                   << " runs_with_errors=" << poisoned_runs);
  }
}
