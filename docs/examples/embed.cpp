// The README's embedding example: the engine as a graph-execution backend,
// with closures and read/write sets and no NDArray.
#include <lazydag/engine/engine.hpp>

#include <iostream>

int main() {
  using namespace lazydag::engine;
  Engine eng;  // policy, workers and window from LAZYDAG_* or the defaults

  Var a = eng.new_var();
  Var b = eng.new_var();
  Var sum = eng.new_var();
  double va = 0, vb = 0, vs = 0;  // the data the vars stand for

  eng.push([&](const RunContext&) { va = 1.5; }, {}, {a}, {.name = "load_a"});
  eng.push([&](const RunContext&) { vb = 2.5; }, {}, {b}, {.name = "load_b"});
  eng.push([&](const RunContext&) { vs = va + vb; }, {a, b}, {sum}, {.name = "add"});
  eng.push([&](const RunContext&) { va *= 10; }, {a}, {a}, {.name = "scale_a"});  // after "add" read a

  eng.wait_to_read(sum);  // runs load_a, load_b and add only
  std::cout << "sum = " << vs << '\n';
  eng.waitall();          // and now scale_a
  std::cout << "a = " << va << '\n';
  return vs == 4.0 && va == 15.0 ? 0 : 1;
}
