// A program that exits with recorded work never waited for, some of which
// records more work while it runs, and with an array in static storage: all
// of the work must run at exit and nothing may crash when the static array
// is destroyed after the exit handlers. Among the pending work is a fused
// expression with intermediates in scratch memory, on a thread whose kept
// scratch was made by an earlier fused node and is destroyed (with the
// thread's other thread_local objects) before the engine's exit handler runs.
// And among it is a float32 product (see main).
#include <lazydag/lazydag.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>

using namespace lazydag;

namespace {
std::atomic<bool> ran{false};
std::atomic<int> nested{0};
}  // namespace

NDArray global_keep;  // destroyed after the engine's exit handler ran
NDArray global_fused;

// With an argument, a float32 product runs before exit too: the CPU
// matmul's library (oneDNN) then makes its kernels during the program and
// must keep them until the work still recorded at exit has run; without
// one, the only products run at exit.
int main(int argc, char**) {
  // Registered first, so it runs last: after the engine waited at exit.
  std::atexit([] {
    if (!ran.load()) {
      std::fputs("recorded work was lost at exit\n", stderr);
      _exit(1);
    }
    if (nested.load() != 30) {
      std::fprintf(stderr, "work recorded by running nodes was lost at exit: %d of 30 ran\n",
                   nested.load());
      _exit(1);
    }
  });
  NDArray a = nd::random_uniform({200, 200}, cpu(), 1);
  // Run (and waited for) here: its intermediates, dropped before the group
  // is recorded, live in scratch memory.
  NDArray warm = nd::relu(a * 2.0 - 1.0);
  if (warm.sum().item<float>() < 0) return 1;
  if (argc > 1 && nd::matmul(a, a).sum().item<float>() < 0) return 1;
  global_fused = nd::relu(a * 3.0 - 1.0) + 0.5;  // recorded as one fused node at exit
  global_keep = nd::matmul(a, a) + 1.0;
  for (int i = 0; i < 50; ++i) (void)(nd::exp(a) * 2.0);
  engine::Var v = nd::engine().new_var();
  nd::engine().push([](const engine::RunContext&) { ran = true; }, {global_keep.var()}, {v},
                    {.name = "last"});
  // Ten nodes that each record a node that records another, while they run.
  for (int i = 0; i < 10; ++i) {
    engine::Var w = nd::engine().new_var();
    nd::engine().push(
        [w](const engine::RunContext&) {
          ++nested;
          nd::engine().push(
              [w](const engine::RunContext&) {
                ++nested;
                nd::engine().push([](const engine::RunContext&) { ++nested; }, {w}, {});
              },
              {w}, {});
        },
        {}, {w}, {.name = "nested"});
  }
  return 0;  // no wait: everything above is still pending under the lazy policy
}
