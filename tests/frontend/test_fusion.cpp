// Lazy fusion of elementwise ops: random expression programs run fused and
// unfused give the same bits; gathered ops are recorded before any other
// access to their buffers (in-place writes, views, other threads, exits);
// results nobody holds are never allocated; errors keep their origin.
#include "../counting_new.hpp"
#include "reference.hpp"

#include <lazydag/engine/graph.hpp>
#include <lazydag/engine/profiler.hpp>
#include <lazydag/ops/kernels.hpp>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <future>
#include <random>
#include <string_view>
#include <thread>

#include <unistd.h>

using namespace lazydag;
using namespace lazydag::test;

namespace {

// Whether elementwise ops on the default device (the sim configuration
// sets sim(0), which fuses too) are fused in this run's configuration.
bool fusing() {
  return nd::fusion_enabled() && nd::engine().policy() != engine::Policy::kNaive &&
         default_device().kind != DeviceKind::kGpu;
}

std::uint64_t recorded() {
  nd::flush_fused();
  return nd::engine().stats().nodes_recorded;
}

// Restores the process's setting at the end of a test.
struct FusionScope {
  bool was = nd::fusion_enabled();
  explicit FusionScope(bool on) { nd::set_fusion(on); }
  ~FusionScope() { nd::set_fusion(was); }
};

std::vector<unsigned char> bytes_of(const NDArray& a) {
  std::vector<unsigned char> out;
  dispatch(a.dtype(), [&]<class T>() {
    const std::vector<T> v = a.to_vector<T>();
    if constexpr (std::is_same_v<T, bool>) {
      for (bool b : v) out.push_back(b ? 1 : 0);
    } else {
      out.resize(v.size() * sizeof(T));
      if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
    }
  });
  return out;
}

// A random program of elementwise ops over a domain shape: inputs of the
// domain's shape, broadcast shapes, views and scalars; unary, binary,
// scalar, comparison, where and astype steps; some results held to the
// end, some dropped at once. Returns the held results' bytes.
std::vector<std::vector<unsigned char>> run_program(std::uint32_t seed) {
  std::mt19937 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<unsigned>(n)); };
  // {150, 384} and {20, 3, 300}: rows long enough for the flat path's
  // segments (a tile of whole rows when rows are shorter than a tile, else
  // a tile cut at each row's end); {13, 2500}: rows longer than a tile, so
  // tiles start inside a row.
  const std::vector<Shape> domains = {{7},  {300, 200}, {3, 5, 4},  {70000},     {},
                                      {2, 0, 3}, {150, 384}, {20, 3, 300}, {13, 2500}};
  const Shape domain = domains[static_cast<std::size_t>(pick(static_cast<int>(domains.size())))];
  const DType t = pick(3) == 0 ? DType::kFloat64 : pick(2) == 0 ? DType::kInt32 : DType::kFloat32;
  std::vector<NDArray> pool;  // arrays of dtype t broadcastable to the domain
  std::uint32_t s = seed * 7919U;
  pool.push_back(random_array(domain, t, ++s));
  pool.push_back(random_array(domain, t, ++s));
  if (!domain.empty()) {
    Shape row(domain.end() - 1, domain.end());
    pool.push_back(random_array(row, t, ++s));
    pool.push_back(random_array({1}, t, ++s));
    if (domain.size() == 2) {
      pool.push_back(random_array({domain[1], domain[0]}, t, ++s).transpose());  // a strided view
      pool.push_back(random_array({domain[0], 1}, t, ++s));
      pool.push_back(random_array({domain[0] + 3, domain[1]}, t, ++s).slice(0, 2, domain[0] + 2));
    }
    if (domain.size() == 3) pool.push_back(random_array({domain[1], domain[2]}, t, ++s));  // trailing two dims
  }
  nd::waitall();
  std::vector<NDArray> held;
  NDArray cur = pool[0];
  const int steps = 3 + pick(12);
  for (int i = 0; i < steps; ++i) {
    const NDArray& other = pool[static_cast<std::size_t>(pick(static_cast<int>(pool.size())))];
    NDArray next;
    const bool floating = is_floating(t);
    switch (pick(floating ? 7 : 5)) {
      case 0: next = cur + other; break;
      case 1: next = pick(2) == 0 ? cur * other : cur - other; break;
      case 2: next = pick(2) == 0 ? cur * 0.5 + 1.0 : 2.0 - cur; break;
      case 3: next = nd::where(cur > other, cur, other); break;
      case 4: next = (cur.astype(DType::kFloat64) * 1.5).astype(t); break;
      case 5: next = pick(2) == 0 ? nd::tanh(cur) : nd::relu(cur); break;
      default: next = nd::sigmoid(cur) / (nd::abs(other) + 1.0); break;
    }
    if (pick(3) == 0) held.push_back(next);  // an intermediate someone keeps
    if (pick(8) == 0) pool.push_back(next);  // and may read again later
    // A held result read now (it alone is written; the other held results
    // stay gathered), and an input written in place (what reads its old
    // values must come first).
    if (pick(6) == 0 && !held.empty()) held[static_cast<std::size_t>(pick(static_cast<int>(held.size())))].wait_to_read();
    if (pick(8) == 0) pool[static_cast<std::size_t>(pick(static_cast<int>(pool.size())))] += 1.0;
    cur = std::move(next);
  }
  held.push_back(cur);
  std::vector<std::vector<unsigned char>> out;
  for (const NDArray& h : held) out.push_back(bytes_of(h));
  return out;
}

}  // namespace

TEST_CASE("fused and unfused random programs give the same bits") {
  for (std::uint32_t seed = 1; seed <= 80; ++seed) {
    CAPTURE(seed);
    std::vector<std::vector<unsigned char>> fused;
    std::vector<std::vector<unsigned char>> unfused;
    {
      FusionScope on(true);
      fused = run_program(seed);
    }
    {
      FusionScope off(false);
      unfused = run_program(seed);
    }
    REQUIRE(fused.size() == unfused.size());
    for (std::size_t i = 0; i < fused.size(); ++i) {
      CAPTURE(i);
      CHECK(fused[i] == unfused[i]);
    }
  }
}

// A chain (ops/cpu/fused.cpp) broadcasts a scalar or a one-element operand
// to vectors: a -0.0 keeps its sign there, as in the separate kernels.
TEST_CASE("a chain keeps the sign of a broadcast negative zero") {
  const NDArray x = random_array({64, 256}, DType::kFloat32, 901);
  const NDArray row = random_array({256}, DType::kFloat32, 902);
  const NDArray nzero = nd::zeros({1}) * -1.0;
  nd::waitall();
  const std::function<NDArray()> exprs[] = {
      [&] { return (x + row) / -0.0; },
      [&] { return (x + row) * -0.0; },
      [&] { return -0.0 - (x * row); },
      [&] { return (x + row) * nzero; },
      [&] { return nd::relu(x - row) * nzero; },
  };
  for (std::size_t k = 0; k < std::size(exprs); ++k) {
    CAPTURE(k);
    std::vector<unsigned char> fused;
    std::vector<unsigned char> unfused;
    {
      FusionScope on(true);
      fused = bytes_of(exprs[k]());
    }
    {
      FusionScope off(false);
      unfused = bytes_of(exprs[k]());
    }
    CHECK(fused == unfused);
  }
}

TEST_CASE("a fused expression is one node and matches a double reference") {
  FusionScope on(true);
  NDArray x = random_array({500, 64}, DType::kFloat32, 1);
  NDArray w = random_array({64}, DType::kFloat32, 2);
  NDArray b = random_array({500, 1}, DType::kFloat32, 3);
  nd::waitall();
  const auto before = recorded();
  NDArray y = nd::sigmoid(x * w + b);
  const auto nodes = recorded() - before;
  CHECK(nodes == (fusing() ? 1U : 3U));
  const auto xv = values(x);
  const auto wv = values(w);
  const auto bv = values(b);
  std::vector<double> want(xv.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    want[i] = 1.0 / (1.0 + std::exp(-(xv[i] * wv[i % 64] + bv[i / 64])));
  }
  check_close(values(y), want, tolerance(DType::kFloat32));
}

TEST_CASE("intermediates nobody holds are never allocated") {
  if (default_device().kind != DeviceKind::kCpu) return;  // memory_in_use counts host memory
  FusionScope on(true);
  NDArray x = nd::ones({1 << 18});  // 1 MiB
  nd::waitall();
  const std::int64_t base = nd::memory_in_use();
  const std::int64_t mib = std::int64_t{1} << 20;
  NDArray y = ((x * 2.0) + 1.0) * 3.0;
  if (fusing()) CHECK(nd::memory_in_use() == base);  // gathered: nothing allocated yet
  y.wait_to_read();
  CHECK(nd::memory_in_use() - base == mib);  // y alone, fused or not (unfused: the others are freed)
  NDArray kept = x * 4.0;
  NDArray z = kept - 1.0;
  z.wait_to_read();
  // Fused, z alone is written: kept stays gathered until it is read.
  CHECK(nd::memory_in_use() - base == (fusing() ? 2 : 3) * mib);
  CHECK(kept.to_vector<float>()[5] == 4.0F);
  CHECK(nd::memory_in_use() - base == 3 * mib);  // y, kept, z
  CHECK(z.to_vector<float>()[7] == 3.0F);
  CHECK(y.to_vector<float>()[9] == 9.0F);
}

TEST_CASE("a result read within its expression leaves the expression's temporaries unwritten") {
  if (default_device().kind != DeviceKind::kCpu) return;  // memory_in_use counts host memory
  FusionScope on(true);
  NDArray x = nd::full({1 << 18}, 2.0);  // 1 MiB
  NDArray w = nd::full({1 << 18}, 3.0);
  nd::waitall();
  const std::int64_t base = nd::memory_in_use();
  const std::int64_t mib = std::int64_t{1} << 20;
  // The temporaries x * w and x * w + 1 live to the end of each statement,
  // after the read: the read records the result alone.
  const std::int64_t during = (nd::relu(x * w + 1.0).wait_to_read(), nd::memory_in_use() - base);
  CHECK(during == (fusing() ? 1 : 3) * mib);
  nd::waitall();
  CHECK(nd::memory_in_use() == base);
  // The same with a reduction reading the result: the result and the sum.
  float total = 0;
  const std::int64_t reduced = ((total = ((x - 1.0) * w).sum().item<float>()), nd::memory_in_use() - base);
  CHECK(total == 3.0F * (1 << 18));
  CHECK(reduced <= (fusing() ? 1 : 2) * mib + 4096);
  nd::waitall();
  CHECK(nd::memory_in_use() == base);
}

TEST_CASE("held results that stayed gathered through one read are written with the next") {
  if (default_device().kind != DeviceKind::kCpu) return;  // memory_in_use counts host memory
  FusionScope on(true);
  NDArray x = nd::full({1 << 18}, 1.0);  // 1 MiB
  nd::waitall();
  const std::int64_t base = nd::memory_in_use();
  const std::int64_t mib = std::int64_t{1} << 20;
  NDArray a = x * 2.0;
  NDArray b = a + 1.0;
  NDArray c = b * 3.0;
  NDArray d = nd::exp(x);
  c.wait_to_read();  // c alone: a, b and d stay gathered
  CHECK(nd::memory_in_use() - base == (fusing() ? 1 : 4) * mib);
  b.wait_to_read();  // b, and a and d, which stayed through the read of c
  CHECK(nd::memory_in_use() - base == 4 * mib);
  CHECK(a.to_vector<float>()[0] == 2.0F);
  CHECK(b.to_vector<float>()[1] == 3.0F);
  CHECK(c.to_vector<float>()[2] == 9.0F);
  CHECK(std::abs(d.to_vector<float>()[3] - 2.7182817F) < 1e-6F);
}

TEST_CASE("a held result that stays gathered keeps its inputs' values") {
  FusionScope on(true);
  NDArray x = nd::full({1000}, 2.0);
  NDArray a = x * 3.0;    // held, read last
  NDArray b = a + 1.0;    // read first: a stays gathered
  NDArray c = nd::exp(a * 0.0) + b;
  CHECK(c.to_vector<float>()[0] == 8.0F);
  x += 100.0;             // a must be computed from the old x first
  NDArray d = b.copy();   // b was written; a still gathered
  CHECK(a.to_vector<float>()[999] == 6.0F);
  CHECK(d.to_vector<float>()[3] == 7.0F);
  NDArray e = a * 2.0;    // a was written: it is an input now
  a += 1.0;               // after e's read of a
  CHECK(e.to_vector<float>()[1] == 12.0F);
  CHECK(a.to_vector<float>()[1] == 7.0F);
  CHECK(x.to_vector<float>()[0] == 102.0F);
}

TEST_CASE("a fused expression allocates nothing once warm") {
#if defined(__SANITIZE_ADDRESS__)
  return;  // object and buffer pools are off under AddressSanitizer
#endif
  if (default_device().kind != DeviceKind::kCpu) return;
  FusionScope on(true);
  NDArray p = random_array({256}, DType::kFloat32, 4);
  NDArray q = random_array({256}, DType::kFloat32, 5);
  auto expr = [&] {
    NDArray y = nd::sigmoid((p - q) * 0.5);
    y.wait_to_read();
  };
  for (int i = 0; i < 200; ++i) expr();  // warm: pools, caches
  const long allocations = allocations_in([&] {
    for (int i = 0; i < 200; ++i) expr();
  });
  // Recording, running (here or on a worker) and freeing: no allocation
  // on this thread (the result's buffer comes from the host pool).
  CHECK(allocations == 0);
}

TEST_CASE("gathered ops come before a later in-place write, view or copy of their buffers") {
  FusionScope on(true);
  NDArray x = nd::full({1000}, 2.0);
  NDArray y = x * 3.0 + 1.0;  // reads x, gathered
  x += 10.0;                  // must come after the gathered read of x
  NDArray yv = y.slice(0, 0, 10);
  NDArray c = y.copy();
  CHECK(y.to_vector<float>()[0] == 7.0F);
  CHECK(yv.to_vector<float>()[9] == 7.0F);
  CHECK(c.to_vector<float>()[999] == 7.0F);
  CHECK(x.to_vector<float>()[0] == 12.0F);
  NDArray m = (x - 2.0).sum();  // a reduction of a gathered result
  CHECK(m.item<float>() == 10000.0F);
}

TEST_CASE("another thread's read records the gathering thread's group") {
  FusionScope on(true);
  NDArray x = nd::full({4096}, 1.0);
  nd::waitall();
  std::promise<NDArray> made;
  std::promise<void> read;
  std::thread gatherer([&] {
    NDArray y = nd::exp(x * 0.0) + 2.0;  // gathered on this thread
    made.set_value(y);
    read.get_future().wait();            // the group is still open here
    NDArray z = y * 2.0;                  // more work after the other thread's read
    CHECK(z.to_vector<float>()[0] == 6.0F);
  });
  NDArray y = made.get_future().get();
  CHECK(y.to_vector<float>()[4095] == 3.0F);  // settles the other thread's group
  read.set_value();
  gatherer.join();
}

TEST_CASE("a thread's gathered ops are recorded when it exits") {
  FusionScope on(true);
  NDArray x = nd::full({256}, 5.0);
  NDArray out;
  std::thread t([&] { out = x * x - 1.0; });  // nothing waits in the thread
  t.join();
  CHECK(out.to_vector<float>()[0] == 24.0F);
  nd::waitall();
}

TEST_CASE("an input that failed fails the fused result, naming the op that failed") {
  FusionScope on(true);
  NDArray a = nd::array<std::int32_t>({1, 2, 3}, {3});
  NDArray zero = nd::zeros({3}, DType::kInt32);
  NDArray bad = a / zero;  // integer division: not fused, fails when it runs
  NDArray y = bad * 2 + 1;
  try {
    y.wait_to_read();
    FAIL("the failure did not reach the fused result");
  } catch (const OpError& e) {
    CHECK(std::string(e.what()).find("div") != std::string::npos);
  }
  nd::waitall();  // reported once, by the wait above
}

TEST_CASE("fused nodes are named by the ops they contain") {
  if (!fusing() || nd::engine().policy() != engine::Policy::kLazy) return;
  FusionScope on(true);
  NDArray x = nd::full({64}, 1.0);
  nd::waitall();
  NDArray y = nd::sigmoid(x * 2.0 + 1.0);
  nd::flush_fused();
  bool found = false;
  for (const auto& p : nd::engine().pending_nodes()) found = found || p.name == "fused[mul,add,sigmoid]";
  CHECK(found);
  y.wait_to_read();
}

TEST_CASE("LAZYDAG_FUSION=0 in the environment switches fusion off") {
  // Run with and without the variable (tests/meson.build): the process's
  // setting comes from it, and an expression is then one node per op.
  const char* e = std::getenv("LAZYDAG_FUSION");
  const bool off = e != nullptr && std::string_view(e) == "0";
  CHECK(nd::fusion_enabled() == !off);
  if (nd::engine().policy() == engine::Policy::kNaive) return;  // naive never fuses
  NDArray x = nd::full({64}, 1.0);
  nd::waitall();
  const std::uint64_t before = recorded();
  NDArray y = nd::sigmoid(x * 2.0 + 1.0);
  y.wait_to_read();
  CHECK(recorded() - before == (off ? 3U : 1U));
}

TEST_CASE("dump_graph and the profiler's trace name fused nodes by their ops") {
  if (!fusing()) return;
  FusionScope on(true);
  NDArray x = nd::full({64}, 1.0);
  nd::waitall();
  const std::string name = "fused[mul,add,sigmoid]";
  if (nd::engine().policy() == engine::Policy::kLazy) {
    // Recorded, not run: the pending graph holds the fused node.
    NDArray y = nd::sigmoid(x * 2.0 + 1.0);
    nd::flush_fused();
    std::ostringstream dot;
    engine::write_dot(dot, engine::pending_graph(nd::engine()));
    CHECK(dot.str().find("label=\"" + name + " #") != std::string::npos);
    y.wait_to_read();
  }
  const std::string path =
      (std::filesystem::temp_directory_path() / ("lazydag_fused_trace_" + std::to_string(::getpid()) + ".json"))
          .string();
  profiler::dump(path);  // drop whatever an earlier case left
  profiler::start();
  NDArray z = nd::sigmoid(x * 2.0 + 1.0);
  z.wait_to_read();
  nd::waitall();
  profiler::stop();
  profiler::dump(path);
  std::ifstream in(path);
  std::stringstream trace;
  trace << in.rdbuf();
  std::filesystem::remove(path);
  CHECK(trace.str().find("\"" + name + "\"") != std::string::npos);
}

TEST_CASE("gradients through fused ops are those of the unfused ops") {
  auto grads = [](bool fused) {
    FusionScope scope(fused);
    NDArray x = random_array({64, 33}, DType::kFloat64, 11);
    NDArray w = random_array({33}, DType::kFloat64, 12);
    NDArray b = random_array({64, 1}, DType::kFloat64, 13);
    x.requires_grad(true);
    w.requires_grad(true);
    b.requires_grad(true);
    NDArray h = nd::tanh(x * w + b);
    NDArray loss = (nd::sigmoid(h * 2.0 - 0.5) * (h + 1.0)).sum();
    loss.backward();
    return std::vector<std::vector<unsigned char>>{bytes_of(loss), bytes_of(x.grad()), bytes_of(w.grad()),
                                                   bytes_of(b.grad())};
  };
  const auto fused = grads(true);
  const auto unfused = grads(false);
  for (std::size_t i = 0; i < fused.size(); ++i) {
    CAPTURE(i);
    CHECK(fused[i] == unfused[i]);
  }
}

TEST_CASE("the backward pass of an elementwise chain is fused too") {
  if (!fusing()) return;
  // Nodes recorded by backward() alone, fused and not: the gradient of
  // tanh(x * w + b) * 3 - 1 is a chain of elementwise ops.
  auto backward_nodes = [](bool fused) {
    FusionScope scope(fused);
    NDArray x = random_array({32, 16}, DType::kFloat32, 21);
    NDArray w = random_array({16}, DType::kFloat32, 22);
    NDArray b = random_array({16}, DType::kFloat32, 23);
    x.requires_grad(true);
    NDArray y = (nd::tanh(x * w + b) * 3.0 - 1.0).sum();
    nd::waitall();
    const auto before = nd::engine().stats().nodes_recorded;
    y.backward();
    nd::flush_fused();
    const auto recorded = nd::engine().stats().nodes_recorded - before;
    return std::make_pair(recorded, bytes_of(x.grad()));
  };
  const auto [fused_nodes, fused_grad] = backward_nodes(true);
  const auto [unfused_nodes, unfused_grad] = backward_nodes(false);
  CAPTURE(fused_nodes);
  CAPTURE(unfused_nodes);
  CHECK(fused_nodes < unfused_nodes);
  CHECK(fused_grad == unfused_grad);
}

TEST_CASE("a failed input fails only the fused results computed from it") {
  FusionScope on(true);
  NDArray a = nd::array<std::int32_t>({1, 2, 3}, {3});
  NDArray ok = nd::array<std::int32_t>({4, 5, 6}, {3});
  NDArray zero = nd::zeros({3}, DType::kInt32);
  NDArray bad = a / zero;       // fails when it runs (not fused)
  NDArray good = ok * 2 + 1;    // one group with the two next lines
  NDArray poisoned = bad + ok;  // from the failed input
  NDArray mixed = good * 3;     // from good alone
  CHECK(good.to_vector<std::int32_t>() == std::vector<std::int32_t>{9, 11, 13});
  CHECK(mixed.to_vector<std::int32_t>() == std::vector<std::int32_t>{27, 33, 39});
  try {
    poisoned.wait_to_read();
    FAIL("the failure did not reach the result computed from the failed input");
  } catch (const OpError& e) {
    CHECK(std::string(e.what()).find("div") != std::string::npos);
  }
  nd::waitall();
}

TEST_CASE("write_sources are checked at push") {
  engine::Engine& eng = nd::engine();
  engine::Var r = eng.new_var();
  engine::Var w = eng.new_var();
  const std::uint64_t one[] = {1};
  const std::uint64_t two[] = {1, 1};
  engine::PushOptions o;
  o.write_sources = two;  // one mask per write
  CHECK_THROWS_AS(eng.push([](const engine::RunContext&) {}, {r}, {w}, o), InvalidArgument);
  o.write_sources = one;
  CHECK_THROWS_AS(eng.push([](const engine::RunContext&) {}, {r, r}, {w}, o), InvalidArgument);  // r twice
  CHECK_THROWS_AS(eng.push([](const engine::RunContext&) {}, {w}, {w}, o), InvalidArgument);     // read and written
  CHECK_THROWS_AS(eng.push_async([](const engine::RunContext&, engine::Completion&) {}, {r}, {w}, o),
                  InvalidArgument);  // asynchronous
  eng.push([](const engine::RunContext&) {}, {r}, {w}, o);
  eng.wait_to_read(w);
  eng.delete_var(r);
  eng.delete_var(w);
}

TEST_CASE("a column of a transposed array, squeezed to one dimension") {
  auto run = [](bool fused) {
    FusionScope scope(fused);
    NDArray x = random_array({300, 7}, DType::kFloat32, 31);
    NDArray column = nd::squeeze(x.transpose().slice(0, 2, 3), 0);  // shape {300}
    NDArray w = random_array({300}, DType::kFloat32, 32);
    return bytes_of(nd::tanh(column * 2.0 + w) - column);
  };
  const auto fused = run(true);
  const auto unfused = run(false);
  CHECK(fused == unfused);
  // and against a reference built from host values
  NDArray x = random_array({300, 7}, DType::kFloat32, 31);
  NDArray column = nd::squeeze(x.transpose().slice(0, 2, 3), 0);
  const auto xv = x.to_vector<float>();
  const auto cv = column.to_vector<float>();
  for (std::size_t i = 0; i < cv.size(); ++i) CHECK(cv[i] == xv[i * 7 + 2]);
}

TEST_CASE("the interpreter runs programs longer and wider than a group, as the separate kernels") {
  // 40 steps over 20 inputs (a group holds at most 32 and 16): the
  // interpreter's bookkeeping then leaves the stack. Every fifth result is
  // kept, the rest live in scratch slots; each kept result must have the
  // bits the unfused kernels give.
  using ops::FusedStep;
  using ops::TensorView;
  constexpr std::int64_t n = 3000;
  constexpr int kInputs = 20;
  constexpr int kSteps = 40;
  const Shape domain{n};
  const Strides dense{1};
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0F, 1.0F);
  std::vector<std::vector<float>> in(kInputs, std::vector<float>(n));
  for (auto& v : in) {
    for (float& f : v) f = u(rng);
  }
  auto view = [&](std::vector<float>& v) { return TensorView{v.data(), DType::kFloat32, domain, dense, 0}; };
  std::vector<FusedStep> steps(kSteps);
  std::vector<TensorView> inputs;
  for (auto& v : in) inputs.push_back(view(v));
  std::vector<std::vector<float>> fused_out(kSteps, std::vector<float>(n));
  std::vector<std::vector<float>> want(kSteps, std::vector<float>(n));
  std::vector<TensorView> outputs(kSteps);
  for (int i = 0; i < kSteps; ++i) {
    FusedStep& s = steps[static_cast<std::size_t>(i)];
    const auto& prev = i == 0 ? in[0] : want[static_cast<std::size_t>(i - 1)];
    std::vector<float> prev_copy = prev;
    TensorView a = view(prev_copy);
    TensorView y = view(want[static_cast<std::size_t>(i)]);
    s.dtype = DType::kFloat32;
    s.num_in = i < kInputs ? 2 : 1;
    s.in[0] = i == 0 ? -1 : i - 1;
    if (i < kInputs) {
      s.kind = FusedStep::Kind::kBinary;
      s.op = static_cast<std::uint8_t>(i % 2 == 0 ? ops::BinaryOp::kAdd : ops::BinaryOp::kMul);
      s.in[1] = -1 - i;
      ops::cpu::binary(static_cast<ops::BinaryOp>(s.op), a, inputs[static_cast<std::size_t>(i)], y);
    } else {
      s.kind = i % 2 == 0 ? FusedStep::Kind::kUnary : FusedStep::Kind::kScalar;
      s.op = static_cast<std::uint8_t>(i % 2 == 0 ? static_cast<int>(ops::UnaryOp::kTanh)
                                                   : static_cast<int>(ops::BinaryOp::kMul));
      s.scalar = 1.5;
      if (i % 2 == 0) {
        ops::cpu::unary(ops::UnaryOp::kTanh, a, y);
      } else {
        ops::cpu::binary_scalar(ops::BinaryOp::kMul, a, 1.5, false, y);
      }
    }
    if (i % 5 == 4) outputs[static_cast<std::size_t>(i)] = view(fused_out[static_cast<std::size_t>(i)]);
  }
  ops::cpu::fused(steps, inputs, outputs, domain);
  for (int i = 4; i < kSteps; i += 5) {
    CAPTURE(i);
    CHECK(std::memcmp(fused_out[static_cast<std::size_t>(i)].data(), want[static_cast<std::size_t>(i)].data(),
                      n * sizeof(float)) == 0);
  }
}
