// A program that exits with recorded work never waited for, and with an
// array in static storage: the work must run at exit and nothing may crash
// when the static array is destroyed after the exit handlers.
#include <lazydag/lazydag.hpp>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <unistd.h>

using namespace lazydag;

namespace {
std::atomic<bool> ran{false};
}  // namespace

NDArray global_keep;  // destroyed after the engine's exit handler ran

int main() {
  // Registered first, so it runs last: after the engine waited at exit.
  std::atexit([] {
    if (!ran.load()) {
      std::fputs("recorded work was lost at exit\n", stderr);
      _exit(1);
    }
  });
  NDArray a = nd::random_uniform({200, 200}, cpu(), 1);
  global_keep = nd::matmul(a, a) + 1.0;
  for (int i = 0; i < 50; ++i) (void)(nd::exp(a) * 2.0);
  engine::Var v = nd::engine().new_var();
  nd::engine().push([](const engine::RunContext&) { ran = true; }, {global_keep.var()}, {v},
                    {.name = "last"});
  return 0;  // no wait: everything above is still pending under the lazy policy
}
