// ./dev demo: the engine at work. 10,000 dependent increments recorded and
// waited for one at a time (synchronous) or all at once (asynchronous).
#include <lazydag/engine/engine.hpp>

#include <chrono>
#include <cstdio>

using namespace lazydag::engine;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double increments(Engine& eng, int n, bool sync) {
  Var x = eng.new_var();
  double value = 0;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) {
    eng.push([&value](const RunContext&) { value += 1; }, {x}, {x}, {.name = "x+1"});
    if (sync) eng.wait_to_read(x);
  }
  eng.wait_to_read(x);
  double t = seconds_since(t0);
  if (value != n) std::printf("wrong result: %g\n", value);
  eng.delete_var(x);
  return t;
}

}  // namespace

int main() {
  Engine eng;
  constexpr int kN = 10000;
  std::printf("lazydag engine demo: policy=%s workers=%d max_pending=%zu\n",
              std::string(to_string(eng.policy())).c_str(), eng.num_threads(), eng.max_pending());
  increments(eng, kN, false);  // warm up the workers and the node pool
  double sync = increments(eng, kN, true);
  double async = increments(eng, kN, false);
  std::printf("%-44s %12s %12s\n", "10,000 dependent increments", "seconds", "ns/op");
  std::printf("%-44s %12.6f %12.1f\n", "synchronous (wait_to_read after each)", sync, sync / kN * 1e9);
  std::printf("%-44s %12.6f %12.1f\n", "asynchronous (one wait at the end)", async, async / kN * 1e9);
  std::printf("sync / async = %.2fx\n", sync / async);

  // Laziness: an op nobody reads does not run until waitall().
  Var unread = eng.new_var();
  bool ran = false;
  eng.push([&ran](const RunContext&) { ran = true; }, {}, {unread}, {.name = "unread"});
  Var other = eng.new_var();
  eng.push([](const RunContext&) {}, {}, {other}, {.name = "other"});
  eng.wait_to_read(other);
  std::printf("after wait_to_read(other): unread op ran = %s\n", ran ? "yes" : "no");
  eng.waitall();
  std::printf("after waitall():            unread op ran = %s\n", ran ? "yes" : "no");
  EngineStats s = eng.stats();
  std::printf("stats: recorded=%llu run=%llu blocking_waits=%llu peak_unfinished=%zu\n",
              static_cast<unsigned long long>(s.nodes_recorded),
              static_cast<unsigned long long>(s.nodes_run),
              static_cast<unsigned long long>(s.blocking_waits), s.peak_unfinished);
  return 0;
}
