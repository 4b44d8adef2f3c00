// Creation, shape ops (views vs copies), devices and copies, blockers,
// printing, record-time errors and array lifetime.
#include "reference.hpp"

#include <lazydag/ops/kernels.hpp>

#include <oneapi/tbb/task_arena.h>

#include <atomic>
#include <numbers>
#include <sstream>
#include <thread>
#include <vector>

using namespace lazydag;
using namespace lazydag::test;

TEST_SUITE("ndarray") {
  TEST_CASE("Arrays.Creation" * doctest::timeout(60)) {
    CHECK(values(nd::zeros({2, 3}, DType::kInt64)) == std::vector<double>(6, 0.0));
    CHECK(values(nd::ones({4}, DType::kFloat64)) == std::vector<double>(4, 1.0));
    CHECK(values(nd::full({2, 2}, 7.5)) == std::vector<double>(4, 7.5));
    CHECK(values(nd::arange(2, 11, 3, DType::kInt32)) == std::vector<double>{2, 5, 8});
    CHECK(values(nd::arange(1, 0, -0.25, DType::kFloat64)) == std::vector<double>{1, 0.75, 0.5, 0.25});
    CHECK(nd::arange(3, 3).size() == 0);
    NDArray a = nd::array<std::int32_t>({1, 2, 3, 4, 5, 6}, {2, 3});
    CHECK(a.shape() == Shape{2, 3});
    CHECK(a.to_vector<std::int32_t>() == std::vector<std::int32_t>{1, 2, 3, 4, 5, 6});
    NDArray scalar = nd::full({}, 4.0);
    CHECK(scalar.ndim() == 0);
    CHECK(scalar.item<float>() == 4.0F);
    CHECK_THROWS_AS((void)nd::array<float>({1, 2, 3}, {2, 2}), InvalidArgument);
    CHECK_THROWS_AS((void)nd::zeros({2, -1}), InvalidArgument);
    CHECK_THROWS_AS((void)nd::zeros({1, 1, 1, 1, 1, 1, 1, 1, 1}), InvalidArgument);
    CHECK_THROWS_AS((void)nd::arange(0, 1, 0), InvalidArgument);
  }

  TEST_CASE("Arrays.RandomIsCounterBasedAndWellDistributed" * doctest::timeout(60)) {
    NDArray u1 = nd::random_uniform({100000}, cpu(), 42, -2, 3, DType::kFloat64);
    NDArray u2 = nd::random_uniform({100000}, cpu(), 42, -2, 3, DType::kFloat64);
    NDArray u3 = nd::random_uniform({100000}, cpu(), 43, -2, 3, DType::kFloat64);
    const auto v1 = u1.to_vector<double>();
    CHECK(v1 == u2.to_vector<double>());
    CHECK(v1 != u3.to_vector<double>());
    double mean = 0;
    for (double x : v1) {
      REQUIRE(x >= -2.0);
      REQUIRE(x < 3.0);
      mean += x / v1.size();
    }
    CHECK(mean == doctest::Approx(0.5).epsilon(0.02));
    // A prefix of a bigger array holds the same values: element i depends on (seed, i) only.
    auto big = nd::random_uniform({200000}, cpu(), 42, -2, 3, DType::kFloat64).to_vector<double>();
    CHECK(std::equal(v1.begin(), v1.end(), big.begin()));
    auto n = nd::random_normal({200000}, cpu(), 7, 1.0, 2.0, DType::kFloat64).to_vector<double>();
    double m = 0;
    double var = 0;
    for (double x : n) m += x / n.size();
    for (double x : n) var += (x - m) * (x - m) / n.size();
    CHECK(m == doctest::Approx(1.0).epsilon(0.02));
    CHECK(std::sqrt(var) == doctest::Approx(2.0).epsilon(0.02));
    // The kernel itself, run in arenas of 1 and 4 threads, gives the same bits.
    auto run = [](int threads) {
      std::vector<float> out(100000);
      ops::TensorView v{out.data(), DType::kFloat32, {100000}, {1}, 0};
      tbb::task_arena arena(threads);
      arena.execute([&] { ops::cpu::random_normal(v, 9, 0, 1); });
      return out;
    };
    CHECK(run(1) == run(4));
  }

  TEST_CASE("Arrays.RandomIsTheDocumentedGenerator" * doctest::timeout(60)) {
    // The documented generator, written out independently: element i of
    // random_uniform(seed) is splitmix64 applied to seed * golden + i * c,
    // 53 bits scaled to [0, 1). Every device computes this, so a GPU run
    // with the same seed gives these exact values (tests/cuda checks that).
    auto splitmix = [](std::uint64_t seed, std::uint64_t i) {
      std::uint64_t z = seed * 0x9e3779b97f4a7c15ULL + i * 0xd1b54a32d192ed03ULL + 0x632be59bd9b4e019ULL;
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
      return z ^ (z >> 31);
    };
    auto unit = [&](std::uint64_t seed, std::uint64_t i) {
      return static_cast<double>(splitmix(seed, i) >> 11) / 9007199254740992.0;
    };
    for (std::uint64_t seed : {0ULL, 1ULL, 12345ULL, 0xffffffffffffffffULL}) {
      const auto u = nd::random_uniform({4096}, cpu(), seed, -1, 5, DType::kFloat64).to_vector<double>();
      const auto n = nd::random_normal({4096}, cpu(), seed, 0.5, 3.0, DType::kFloat64).to_vector<double>();
      const auto k = nd::random_uniform({4096}, cpu(), seed, -10, 10, DType::kInt32).to_vector<std::int32_t>();
      for (std::uint64_t i = 0; i < 4096; ++i) {
        CAPTURE(seed);
        CAPTURE(i);
        REQUIRE(u[i] == -1.0 + 6.0 * unit(seed, i));
        const double u1 = 1.0 - unit(seed, 2 * i);
        const double u2 = unit(seed, 2 * i + 1);
        REQUIRE(n[i] == doctest::Approx(0.5 + 3.0 * std::sqrt(-2.0 * std::log(u1)) * std::cos(2 * std::numbers::pi * u2)).epsilon(1e-12));
        REQUIRE(k[i] == static_cast<std::int32_t>(-10.0 + 20.0 * unit(seed, i)));  // toward zero
      }
    }
  }

  TEST_CASE("Arrays.ShapeOpsViewsAndCopies" * doctest::timeout(60)) {
    NDArray a = nd::arange(0, 24, 1, DType::kInt64).reshape({2, 3, 4});
    CHECK(a.shape() == Shape{2, 3, 4});
    NDArray r = a.reshape({4, -1});
    CHECK(r.shape() == Shape{4, 6});
    CHECK(r.shares_storage_with(a));  // contiguous: a view
    NDArray t = a.transpose({2, 0, 1});
    CHECK(t.shape() == Shape{4, 2, 3});
    CHECK(t.shares_storage_with(a));
    CHECK_FALSE(t.is_contiguous());
    auto vt = values(t);
    // t[i][j][k] = a[j][k][i]
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 2; ++j) {
        for (int k = 0; k < 3; ++k) CHECK(vt[i * 6 + j * 3 + k] == j * 12 + k * 4 + i);
      }
    }
    NDArray tr = t.reshape({24});  // not contiguous: a copy
    CHECK_FALSE(tr.shares_storage_with(a));
    CHECK(values(tr) == vt);
    NDArray s = a.slice(2, 1, -1);  // [1, 3) along the last axis
    CHECK(s.shape() == Shape{2, 3, 2});
    CHECK(s.shares_storage_with(a));
    CHECK(values(s) == std::vector<double>{1, 2, 5, 6, 9, 10, 13, 14, 17, 18, 21, 22});
    NDArray m = nd::arange(0, 6, 1, DType::kFloat32).reshape({2, 3});
    CHECK(values(m.transpose()) == std::vector<double>{0, 3, 1, 4, 2, 5});
    NDArray c = nd::concat({m, m * 10.0}, 0);
    CHECK(c.shape() == Shape{4, 3});
    CHECK(values(c) == std::vector<double>{0, 1, 2, 3, 4, 5, 0, 10, 20, 30, 40, 50});
    NDArray c1 = nd::concat({m, m.slice(1, 0, 1)}, 1);
    CHECK(c1.shape() == Shape{2, 4});
    CHECK(values(c1) == std::vector<double>{0, 1, 2, 0, 3, 4, 5, 3});
    CHECK_FALSE(c.shares_storage_with(m));
    NDArray cp = m.copy();
    CHECK_FALSE(cp.shares_storage_with(m));
    CHECK(values(cp) == values(m));
  }

  TEST_CASE("Arrays.DevicesAndCopies" * doctest::timeout(60)) {
    NDArray x = nd::arange(0, 5, 1, DType::kFloat32, cpu());
    NDArray same = x.as_in_device(cpu());
    CHECK(same.shares_storage_with(x));  // no copy, nothing recorded
    const auto recorded = nd::engine().stats().nodes_recorded;
    (void)x.as_in_device(cpu(0));
    CHECK(nd::engine().stats().nodes_recorded == recorded);
    NDArray c = x.copyto(cpu());
    CHECK_FALSE(c.shares_storage_with(x));  // copyto always copies
    NDArray other = x.copyto(cpu(1));
    CHECK(other.device() == cpu(1));
    CHECK(values(other) == values(x));
    CHECK(x.as_in_device(cpu(1)).device() == cpu(1));
    try {
      (void)(x + other);
      FAIL("mixing devices must be refused");
    } catch (const DeviceMismatch& e) {
      const std::string msg = e.what();
      CHECK(msg.find("cpu(0)") != std::string::npos);
      CHECK(msg.find("cpu(1)") != std::string::npos);
      CHECK(msg.find("copyto") != std::string::npos);
    }
    CHECK_THROWS_AS((void)nd::matmul(x.reshape({5, 1}), other.reshape({1, 5})), DeviceMismatch);
    CHECK_THROWS_AS((void)nd::where(x > 1.0, x, other), DeviceMismatch);
    CHECK(values(other + other) == std::vector<double>{0, 2, 4, 6, 8});
  }

  TEST_CASE("Arrays.BlockersAndPrinting" * doctest::timeout(60)) {
    NDArray a = nd::arange(0, 6, 1, DType::kFloat32).reshape({2, 3});
    std::ostringstream os;
    os << a;
    CHECK(os.str() == "array([[0., 1., 2.],\n       [3., 4., 5.]], dtype=float32)");
    std::ostringstream big;
    big << nd::zeros({2000}, DType::kInt32);
    CHECK(big.str() == "array([0, 0, 0, ..., 0, 0, 0], dtype=int32)");
    std::ostringstream b;
    b << (a > 2.0).slice(1, 0, 2);
    CHECK(b.str() == "array([[false, false],\n       [true, true]], dtype=bool)");
    std::ostringstream s;
    s << a.sum();
    CHECK(s.str() == "array(15., dtype=float32)");
    CHECK(a.sum().item<float>() == 15.0F);
    CHECK(a.to_vector<float>() == std::vector<float>{0, 1, 2, 3, 4, 5});
    a.wait_to_write();
  }

  TEST_CASE("Arrays.BadInputIsRefusedAtRecordTime" * doctest::timeout(60)) {
    NDArray a = nd::zeros({2, 3});
    NDArray b = nd::zeros({4, 5});
    NDArray i = nd::zeros({2, 3}, DType::kInt32);
    NDArray flags = nd::zeros({2}, DType::kBool);
    NDArray cube = nd::zeros({3, 2, 3});
    nd::waitall();
    const auto recorded = nd::engine().stats().nodes_recorded;
    auto message = [](auto f) {
      try {
        f();
      } catch (const InvalidArgument& e) {
        return std::string(e.what());
      }
      return std::string("no error");
    };
    std::string m = message([&] { (void)(a + b); });
    CHECK(m.find("(2, 3)") != std::string::npos);
    CHECK(m.find("(4, 5)") != std::string::npos);
    m = message([&] { (void)(a + i); });
    CHECK(m.find("float32") != std::string::npos);
    CHECK(m.find("int32") != std::string::npos);
    CHECK(m.find("astype") != std::string::npos);
    CHECK(message([&] { (void)a.sum(2); }).find("axis 2") != std::string::npos);
    CHECK(message([&] { (void)a.sum(-3); }).find("axis -3") != std::string::npos);
    CHECK(message([&] { (void)a.item<float>(); }).find("exactly one element") != std::string::npos);
    CHECK(message([&] { (void)a.to_vector<double>(); }).find("float32") != std::string::npos);
    CHECK(message([&] { (void)a.reshape({4, 2}); }).find("(2, 3)") != std::string::npos);
    CHECK(message([&] { (void)a.transpose({0, 0}); }).find("permutation") != std::string::npos);
    CHECK(message([&] { (void)a.slice(1, 2, 5); }).find("out of range") != std::string::npos);
    CHECK(message([&] { (void)nd::matmul(a, a); }).find("inner dimensions") != std::string::npos);
    CHECK(message([&] { (void)nd::matmul(i, i.transpose()); }).find("float32 or float64") != std::string::npos);
    CHECK(message([&] { (void)nd::exp(i); }).find("int32") != std::string::npos);
    CHECK(message([&] { (void)(flags + flags); }).find("bool") != std::string::npos);
    CHECK(message([&] { (void)nd::where(a, a, a); }).find("bool") != std::string::npos);
    CHECK(message([&] { (void)nd::concat({a, b}, 0); }).find("differ") != std::string::npos);
    CHECK(message([&] { a += b; }).find("(4, 5)") != std::string::npos);
    CHECK(message([&] { a += cube; }).find("differs") != std::string::npos);
    NDArray moved = std::move(b);
    CHECK(message([&] { (void)(b + a); }).find("moved-from") != std::string::npos);  // NOLINT
    CHECK(message([&] { (void)NDArray().sum(); }).find("moved-from") != std::string::npos);
    CHECK(nd::engine().stats().nodes_recorded == recorded);  // nothing was recorded
    // and the engine is unaffected
    CHECK((a + 1.0).sum().item<float>() == 6.0F);
    CHECK(moved.shape() == Shape{4, 5});
  }

  TEST_CASE("Arrays.StorageIsFreedAfterItsLastAccess" * doctest::timeout(60)) {
    nd::waitall();
    const std::int64_t before = nd::memory_in_use();
    NDArray keep;
    {
      NDArray a = nd::random_uniform({512, 512}, cpu(), 5);
      NDArray b = nd::exp(a) * 2.0;
      NDArray c = nd::matmul(a, b);  // recorded; a and b are dropped before it runs
      keep = c.sum();
      CHECK(nd::memory_in_use() >= before + 3 * 512 * 512 * 4);
    }
    CHECK(keep.item<float>() > 0.0F);  // all the work ran on buffers kept alive by the ops
    nd::waitall();
    CHECK(nd::memory_in_use() == before + 4);  // only `keep` (one float32) remains
    keep = NDArray();
    nd::waitall();
    CHECK(nd::memory_in_use() == before);
  }

  TEST_CASE("Arrays.SmallBuffersComeBackWhereverTheyAreFreed" * doctest::timeout(60)) {
    // Small buffers are cached per thread: made on two threads, dropped on
    // the other one, made again; every array keeps its own values, and the
    // bytes in use come back to where they were.
    nd::waitall();
    const std::int64_t before = nd::memory_in_use();
    constexpr int kArrays = 300;
    auto make = [](int base, std::vector<NDArray>& out) {
      for (int i = 0; i < kArrays; ++i) {
        const auto n = static_cast<std::int64_t>(1 + (base + i) % 200);  // 4 B to 800 B
        out.push_back(nd::full({n}, static_cast<double>(base + i)));
      }
    };
    std::vector<NDArray> a;
    std::vector<NDArray> b;
    std::thread t([&] { make(0, a); });
    make(kArrays, b);
    t.join();
    std::thread drop_a([&] { a.clear(); });  // a's buffers go to this thread's cache
    std::vector<NDArray> c;
    make(2 * kArrays, c);
    drop_a.join();
    std::vector<NDArray> d;
    make(3 * kArrays, d);
    int base = kArrays;
    for (const auto* v : {&b, &c, &d}) {
      for (int i = 0; i < kArrays; ++i) {
        for (float g : (*v)[static_cast<std::size_t>(i)].to_vector<float>()) {
          CHECK(g == static_cast<float>(base + i));
        }
      }
      base += kArrays;
    }
    b.clear();
    c.clear();
    d.clear();
    nd::waitall();
    CHECK(nd::memory_in_use() == before);
    nd::release_cached_memory();  // the shared cache and this thread's
    CHECK(nd::memory_cached() == 0);
  }

  TEST_CASE("Arrays.BenchmarkWaitsForTheWork" * doctest::timeout(60)) {
    std::ostringstream os;
    std::atomic<bool> ran{false};
    {
      Benchmark b("probe", os);
      engine::Var v = nd::engine().new_var();
      nd::engine().push([&](const engine::RunContext&) { ran = true; }, {}, {v});
      nd::engine().delete_var(v);
    }
    CHECK(ran.load());  // the destructor waited for it
    CHECK(os.str().rfind("probe: ", 0) == 0);
    CHECK(os.str().find(" sec\n") != std::string::npos);
  }
}
