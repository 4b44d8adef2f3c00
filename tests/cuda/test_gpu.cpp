// The gpu suite: NDArray and the engine on a real CUDA device, compared with
// the CPU on random inputs. Exits 77 (Meson's SKIP) when no CUDA device can
// be used here, saying why.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <lazydag/engine/profiler.hpp>
#include <lazydag/engine/stream.hpp>
#include <lazydag/lazydag.hpp>
#include <lazydag/ops/kernels.hpp>

#include "../frontend/reference.hpp"

#include <boost/property_tree/json_parser.hpp>
#include <boost/property_tree/ptree.hpp>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <iostream>
#include <string>
#include <vector>

using namespace lazydag;
namespace pt = boost::property_tree;

namespace {

template <class T>
void check_close(const std::vector<T>& got, const std::vector<T>& want, double rtol, double atol) {
  REQUIRE(got.size() == want.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double g = static_cast<double>(got[i]);
    const double w = static_cast<double>(want[i]);
    if (!(std::abs(g - w) <= atol + rtol * std::abs(w)) && !(std::isnan(g) && std::isnan(w))) ++bad;
  }
  CHECK(bad == 0);
}

}  // namespace

TEST_SUITE("gpu") {
  TEST_CASE("Gpu.CopiesKeepEveryValue" * doctest::timeout(120)) {
    const std::vector<float> f = test::random_values<float>(1000, 1);
    const std::vector<std::int64_t> i = test::random_values<std::int64_t>(1000, 2, -1e9, 1e9);
    NDArray hf = nd::array(f, {10, 100}, cpu());
    NDArray hi = nd::array(i, {1000}, cpu());
    CHECK(hf.copyto(gpu(0)).to_vector<float>() == f);
    CHECK(hi.copyto(gpu(0)).copyto(cpu(1)).to_vector<std::int64_t>() == i);
    CHECK(hf.copyto(gpu(0)).copyto(sim(0)).copyto(gpu(0)).to_vector<float>() == f);
    NDArray t = hf.copyto(gpu(0)).transpose().copyto(cpu());
    CHECK(t.to_vector<float>() == hf.transpose().copy().to_vector<float>());
    CHECK(nd::array(std::vector<bool>{true, false, true}, {3}, gpu(0)).to_vector<bool>() ==
          std::vector<bool>{true, false, true});
  }

  TEST_CASE("Gpu.OpsMatchTheCpu" * doctest::timeout(120)) {
    const std::vector<float> a = test::random_values<float>(96 * 64, 11);
    const std::vector<float> b = test::random_values<float>(64 * 80, 12);
    auto program = [](const NDArray& x, const NDArray& y) {
      NDArray p = nd::matmul(x, y);
      NDArray q = nd::tanh(p * 0.1) + nd::relu(p) - nd::sigmoid(p) / 3.0;
      return nd::concat({q.sum(0, true), q.max(0, true), q.min(1, true).reshape({1, 96}).slice(1, 0, 80),
                         q.mean(0, true)},
                        0);
    };
    NDArray ha = nd::array(a, {96, 64}, cpu());
    NDArray hb = nd::array(b, {64, 80}, cpu());
    check_close(program(ha.copyto(gpu(0)), hb.copyto(gpu(0))).to_vector<float>(),
                program(ha, hb).to_vector<float>(), 1e-4, 1e-4);
    NDArray g = ha.copyto(gpu(0));
    CHECK(g.argmax().item<std::int64_t>() == ha.argmax().item<std::int64_t>());
    CHECK(g.argmax(1).to_vector<std::int64_t>() == ha.argmax(1).to_vector<std::int64_t>());
    CHECK((g > 0.5).to_vector<bool>() == (ha > 0.5).to_vector<bool>());
    CHECK(g.astype(DType::kInt32).to_vector<std::int32_t>() == ha.astype(DType::kInt32).to_vector<std::int32_t>());
    CHECK(std::abs(g.sum().item<float>() - ha.sum().item<float>()) < 1e-2);
    // the counter-based generator gives the CPU's numbers
    CHECK(nd::random_uniform({4096}, gpu(0), 99).to_vector<float>() ==
          nd::random_uniform({4096}, cpu(), 99).to_vector<float>());
    // bit for bit also where a fused multiply-add would round differently
    // (non-trivial bounds, float64, and arange's start + i * step)
    CHECK(nd::random_uniform({100000}, gpu(0), 7, -2, 3, DType::kFloat64).to_vector<double>() ==
          nd::random_uniform({100000}, cpu(), 7, -2, 3, DType::kFloat64).to_vector<double>());
    CHECK(nd::arange(1, 10001, 0.1, DType::kFloat64, gpu(0)).to_vector<double>() ==
          nd::arange(1, 10001, 0.1, DType::kFloat64, cpu()).to_vector<double>());
    check_close(nd::random_normal({4096}, gpu(0), 5, 0, 1, DType::kFloat64).to_vector<double>(),
                nd::random_normal({4096}, cpu(), 5, 0, 1, DType::kFloat64).to_vector<double>(), 1e-12, 1e-12);
    {
      // one kernel per op (fusion off), the dense 128-bit path among them:
      // an odd length, so whole packs and a tail
      const bool was = nd::fusion_enabled();
      nd::set_fusion(false);
      const NDArray d = nd::array(test::random_values<float>(10001, 13), {10001}, cpu());
      auto ops = [](const NDArray& v) { return nd::exp(v * 0.5) - v / 3.0 + nd::maximum(v, v * v) - 1.0 / (v * v + 1.0); };
      check_close(ops(d.copyto(gpu(0))).to_vector<float>(), ops(d).to_vector<float>(), 1e-5, 1e-6);
      const NDArray di = d.astype(DType::kInt32);
      CHECK((di.copyto(gpu(0)) * 3.0 + di.copyto(gpu(0))).to_vector<std::int32_t>() ==
            (di * 3.0 + di).to_vector<std::int32_t>());
      const NDArray dd = d.astype(DType::kFloat64);
      CHECK((dd.copyto(gpu(0)) * dd.copyto(gpu(0)) - 2.0).to_vector<double>() == (dd * dd - 2.0).to_vector<double>());
      // the dense path of comparisons, where and casts: operands of mixed
      // widths (a bool mask beside float64 values, int64 to float32)
      const NDArray e = nd::array(test::random_values<float>(10001, 14), {10001}, cpu());
      const NDArray gd = d.copyto(gpu(0));
      const NDArray ge = e.copyto(gpu(0));
      CHECK((gd < ge).to_vector<bool>() == (d < e).to_vector<bool>());
      CHECK((gd >= 0.25).to_vector<bool>() == (d >= 0.25).to_vector<bool>());
      CHECK(nd::where(gd > ge, gd, ge * 2.0).to_vector<float>() == nd::where(d > e, d, e * 2.0).to_vector<float>());
      const NDArray mask = dd > 0.0;
      CHECK(nd::where(mask.copyto(gpu(0)), dd.copyto(gpu(0)), dd.copyto(gpu(0)) * -1.0).to_vector<double>() ==
            nd::where(mask, dd, dd * -1.0).to_vector<double>());
      const NDArray di64 = (d * 1e6).astype(DType::kInt64);
      CHECK(di64.copyto(gpu(0)).astype(DType::kFloat32).to_vector<float>() ==
            di64.astype(DType::kFloat32).to_vector<float>());
      CHECK(gd.astype(DType::kFloat64).to_vector<double>() == d.astype(DType::kFloat64).to_vector<double>());
      CHECK(mask.copyto(gpu(0)).astype(DType::kInt32).to_vector<std::int32_t>() ==
            mask.astype(DType::kInt32).to_vector<std::int32_t>());
      // broadcasts and a transposed view: the strided kernel's 32-bit
      // division by precomputed magic numbers (ops/src/indexer.hpp)
      const NDArray m2 = nd::array(test::random_values<float>(37 * 53, 15), {37, 53}, cpu());
      const NDArray row = nd::array(test::random_values<float>(53, 16), {53}, cpu());
      const NDArray col = nd::array(test::random_values<float>(37, 17), {37, 1}, cpu());
      const NDArray t3 = nd::array(test::random_values<float>(5 * 37 * 53, 18), {53, 37, 5}, cpu());
      auto bcast = [](const NDArray& m, const NDArray& r, const NDArray& c, const NDArray& t) {
        const NDArray tt = t.transpose({2, 1, 0});  // [5, 37, 53], strided
        return (m * r - c + tt).to_vector<float>();
      };
      CHECK(bcast(m2.copyto(gpu(0)), row.copyto(gpu(0)), col.copyto(gpu(0)), t3.copyto(gpu(0))) ==
            bcast(m2, row, col, t3));
      CHECK((m2.copyto(gpu(0)) > col.copyto(gpu(0))).to_vector<bool>() == (m2 > col).to_vector<bool>());
      nd::set_fusion(was);
    }
    {
      // reductions over an axis that is not the last: few outputs over a
      // long axis (threads of a block split it), and many outputs
      const NDArray tall = nd::array(test::random_values<float>(100000 * 3, 19), {100000, 3}, cpu());
      const NDArray cube = nd::array(test::random_values<float>(7 * 5000 * 33, 20), {7, 5000, 33}, cpu());
      const NDArray gt = tall.copyto(gpu(0));
      const NDArray gc = cube.copyto(gpu(0));
      check_close(gt.sum(0).to_vector<float>(), tall.sum(0).to_vector<float>(), 1e-4, 1e-3);
      check_close(gc.mean(1).to_vector<float>(), cube.mean(1).to_vector<float>(), 1e-5, 1e-5);
      CHECK(gt.max(0).to_vector<float>() == tall.max(0).to_vector<float>());
      CHECK(gc.min(1).to_vector<float>() == cube.min(1).to_vector<float>());
      CHECK(gt.argmax(0).to_vector<std::int64_t>() == tall.argmax(0).to_vector<std::int64_t>());
      CHECK(gc.argmax(1).to_vector<std::int64_t>() == cube.argmax(1).to_vector<std::int64_t>());
      // few long rows, the last axis: blocks split each row, partials
      // combined in a fixed order (the same result on every run)
      std::vector<float> wide_values = test::random_values<float>(3 * 200003, 21);
      wide_values[2 * 200003 + 150000] = 7.0F;  // a tie: the lowest index wins
      wide_values[2 * 200003 + 190000] = 7.0F;
      const NDArray wide = nd::array(wide_values, {3, 200003}, cpu());
      const NDArray gw = wide.copyto(gpu(0));
      check_close(gw.sum(1).to_vector<float>(), wide.sum(1).to_vector<float>(), 1e-4, 1e-3);
      check_close(gw.mean(1).to_vector<float>(), wide.mean(1).to_vector<float>(), 1e-5, 1e-5);
      CHECK(gw.max(1).to_vector<float>() == wide.max(1).to_vector<float>());
      CHECK(gw.min(1).to_vector<float>() == wide.min(1).to_vector<float>());
      CHECK(gw.argmax(1).to_vector<std::int64_t>() == wide.argmax(1).to_vector<std::int64_t>());
      CHECK(gw.sum(1).to_vector<float>() == gw.sum(1).to_vector<float>());
      CHECK(gt.sum(0).to_vector<float>() == gt.sum(0).to_vector<float>());
    }
    // integer arithmetic wraps as on the CPU
    const std::vector<std::int32_t> big{2147483647, -2147483647 - 1, 7};
    NDArray hb32 = nd::array(big, {3}, cpu());
    CHECK((hb32.copyto(gpu(0)) + 1.0).to_vector<std::int32_t>() == (hb32 + 1.0).to_vector<std::int32_t>());
  }

  TEST_CASE("Gpu.FusedProgramsMatchTheUnfusedKernelsBitForBit" * doctest::timeout(120)) {
    // Every kind of step (unary, binary, scalar both ways, comparisons,
    // where, casts), row and column broadcasts, a transposed input, three
    // dtypes, held and dropped intermediates: one fused kernel against one
    // kernel per op.
    const Device g = gpu(0);
    const NDArray x = nd::array(test::random_values<float>(300 * 257, 21), {300, 257}, cpu()).copyto(g);
    const NDArray xt = nd::array(test::random_values<float>(257 * 300, 22), {257, 300}, cpu()).copyto(g).transpose();
    const NDArray row = nd::array(test::random_values<float>(257, 23), {257}, cpu()).copyto(g);
    const NDArray col = nd::array(test::random_values<float>(300, 24), {300, 1}, cpu()).copyto(g);
    const NDArray ints =
        nd::array(test::random_values<std::int32_t>(300 * 257, 25, -1e9, 1e9), {300, 257}, cpu()).copyto(g);
    auto program = [&] {
      NDArray a = x * row + col;
      NDArray held = nd::tanh(a);
      NDArray m = nd::where(a > 0.25, nd::exp(-a), nd::sigmoid(a) / 3.0);
      NDArray k = (ints + 3.0) * ints;  // wraps
      NDArray f = m + k.astype(DType::kFloat32) * 1e-9 - nd::relu(xt) + (2.0 - nd::abs(a)) * nd::sqrt(nd::abs(col));
      NDArray d = (f.astype(DType::kFloat64) + 1.0) / (nd::log1p(nd::abs(a)).astype(DType::kFloat64) + 0.5);
      NDArray cmp = (f >= held) == (a < row);
      return std::vector<NDArray>{held, k, f, d, cmp, nd::maximum(f, held), nd::minimum(2.0 - f, held)};
    };
    const bool was = nd::fusion_enabled();
    nd::set_fusion(false);
    nd::waitall();
    const auto before_unfused = nd::engine().stats().nodes_recorded;
    const std::vector<NDArray> unfused = program();
    nd::waitall();
    const auto unfused_nodes = nd::engine().stats().nodes_recorded - before_unfused;
    nd::set_fusion(true);
    const auto before_fused = nd::engine().stats().nodes_recorded;
    const std::vector<NDArray> fused = program();
    nd::waitall();
    const auto fused_nodes = nd::engine().stats().nodes_recorded - before_fused;
    nd::set_fusion(was);
    CHECK(fused_nodes < unfused_nodes);
    CHECK(fused[0].to_vector<float>() == unfused[0].to_vector<float>());
    CHECK(fused[1].to_vector<std::int32_t>() == unfused[1].to_vector<std::int32_t>());
    CHECK(fused[2].to_vector<float>() == unfused[2].to_vector<float>());
    CHECK(fused[3].to_vector<double>() == unfused[3].to_vector<double>());
    CHECK(fused[4].to_vector<bool>() == unfused[4].to_vector<bool>());
    CHECK(fused[5].to_vector<float>() == unfused[5].to_vector<float>());
    CHECK(fused[6].to_vector<float>() == unfused[6].to_vector<float>());
  }

  TEST_CASE("Gpu.TrainingStepsMatchTheCpu" * doctest::timeout(120)) {
    // cross_entropy forward and backward, and Adam steps, on the GPU
    // against the same steps on the CPU from the same parameters.
    const NDArray x = nd::array(test::random_values<float>(64 * 20, 31), {64, 20}, cpu());
    std::vector<std::int64_t> labels(64);
    for (std::size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<std::int64_t>((i * 7) % 10);
    const NDArray y = nd::array(labels, {64}, cpu());
    const NDArray w1 = nd::array(test::random_values<float>(20 * 32, 32, -0.3, 0.3), {20, 32}, cpu());
    const NDArray b1 = nd::array(test::random_values<float>(32, 33, -0.1, 0.1), {32}, cpu());
    const NDArray w2 = nd::array(test::random_values<float>(32 * 10, 34, -0.3, 0.3), {32, 10}, cpu());
    auto train = [&](Device dev) {
      std::vector<NDArray> p = {w1.copyto(dev), b1.copyto(dev), w2.copyto(dev)};
      for (auto& q : p) q.requires_grad(true);
      optim::Adam opt(p, {.lr = 1e-2});
      const NDArray xd = x.copyto(dev);
      const NDArray yd = y.copyto(dev);
      std::vector<float> losses;
      for (int step = 0; step < 5; ++step) {
        opt.zero_grad();
        NDArray loss = nd::cross_entropy(nd::matmul(nd::relu(nd::matmul(xd, p[0]) + p[1]), p[2]), yd);
        loss.backward();
        opt.step();
        losses.push_back(loss.item<float>());
      }
      return std::pair{losses, p};
    };
    const auto [gl, gp] = train(gpu(0));
    const auto [cl, cp] = train(cpu());
    check_close(gl, cl, 1e-4, 1e-5);
    for (std::size_t i = 0; i < gp.size(); ++i) {
      CHECK(gp[i].device() == gpu(0));
      check_close(gp[i].to_vector<float>(), cp[i].to_vector<float>(), 1e-4, 1e-5);
    }
  }

  TEST_CASE("Gpu.DependentOpsNeedNoHostSync" * doctest::timeout(120)) {
    NDArray x = nd::zeros({256}, DType::kFloat32, gpu(0));
    nd::waitall();
    const auto before = nd::engine().stats();
    for (int i = 0; i < 2000; ++i) x += 1.0;
    const auto mid = nd::engine().stats();
    CHECK(mid.blocking_waits == before.blocking_waits);
    CHECK(x.to_vector<float>() == std::vector<float>(256, 2000.0F));
  }

  TEST_CASE("Gpu.CrossStreamDependenciesUseEvents" * doctest::timeout(120)) {
    // Producer on a compute stream, consumer on the copy-in stream, reader
    // on the copy-out stream: only events order them, and no host waits
    // until the last wait_to_read.
    engine::Engine& eng = nd::engine();
    constexpr std::int64_t kN = 1 << 22;
    constexpr std::size_t kBytes = kN * sizeof(float);
    auto view = [](void* p) { return ops::TensorView{p, DType::kFloat32, {kN}, {1}, 0}; };
    auto on = [](engine::StreamKind k, const char* name) {
      engine::PushOptions o;
      o.device = gpu(0);
      o.stream = k;
      o.name = name;
      return o;
    };
    for (int round = 1; round <= 10; ++round) {
      const double v = round;
      engine::Var a = eng.new_var();
      engine::Var b = eng.new_var();
      void* pa = nullptr;
      void* pb = nullptr;
      void* host = nullptr;
      eng.push([&, v](const engine::RunContext& ctx) {
        pa = ctx.stream_device->allocate(kBytes, ctx.stream);
        ops::fill(ctx, view(pa), v);
      }, {}, {a}, on(engine::StreamKind::kCompute, "produce"));
      eng.push([&](const engine::RunContext& ctx) {
        CHECK(ctx.stream_index == ctx.stream_device->copy_in_stream());
        pb = ctx.stream_device->allocate(kBytes, ctx.stream);
        ops::copy_cast(ctx, view(pa), view(pb));
        ops::binary_scalar(ctx, ops::BinaryOp::kMul, view(pb), 2.0, false, view(pb));
      }, {a}, {b}, on(engine::StreamKind::kCopyIn, "consume"));
      eng.push([&](const engine::RunContext& ctx) {
        host = ctx.stream_device->allocate_host(kBytes);
        ops::copy_to_staging(ctx, host, pb, kBytes);
      }, {b}, {b}, on(engine::StreamKind::kCopyOut, "read back"));
      eng.wait_to_read(b);
      const float* h = static_cast<const float*>(host);
      bool ok = true;
      for (std::int64_t i = 0; i < kN; i += 4099) ok = ok && h[i] == static_cast<float>(2 * v);
      CHECK(ok);
      engine::StreamDevice& dev = eng.stream_device(gpu(0));
      eng.push([&](const engine::RunContext& ctx) {
        ctx.stream_device->deallocate(pa, kBytes, ctx.stream);
        ctx.stream_device->deallocate(pb, kBytes, ctx.stream);
        ctx.stream_device->release_host(host, kBytes, ctx.stream);
      }, {}, {a, b}, on(engine::StreamKind::kCompute, "free"));
      eng.wait_to_read(a);
      (void)dev;
      eng.delete_var(a);
      eng.delete_var(b);
    }
  }

  TEST_CASE("Gpu.ProfilerShowsDeviceTimesOnStreamTracks" * doctest::timeout(120)) {
    const std::string path = "lazydag_gpu_trace_" + std::to_string(::getpid()) + ".json";
    nd::waitall();
    profiler::dump(path);  // drop earlier events
    NDArray a = nd::random_uniform({2048, 2048}, gpu(0), 3);
    a.wait_to_read();
    profiler::start();
    NDArray b = nd::matmul(a, a);
    NDArray c = nd::matmul(b, a);
    c.wait_to_read();
    profiler::stop();
    profiler::dump(path);
    pt::ptree root;
    REQUIRE_NOTHROW(pt::read_json(path, root));
    std::map<int, std::string> tracks;
    std::vector<pt::ptree> matmuls;
    for (const auto& [k, ev] : root.get_child("traceEvents")) {
      const std::string ph = ev.get<std::string>("ph");
      if (ph == "M" && ev.get<std::string>("name") == "thread_name") {
        tracks[std::stoi(ev.get<std::string>("tid"))] = ev.get<std::string>("args.name");
      }
      if (ph == "X" && ev.get<std::string>("cat", "") == "op" && ev.get<std::string>("name") == "matmul") {
        matmuls.push_back(ev);
      }
    }
    REQUIRE(matmuls.size() == 2);
    auto num = [](const pt::ptree& ev, const char* key) { return std::stod(ev.get<std::string>(key)); };
    for (const auto& m : matmuls) {
      CHECK(tracks[std::stoi(m.get<std::string>("tid"))].rfind("gpu(0) stream ", 0) == 0);
      // the device ran it after the host began to enqueue it, for about
      // 2 * 2048^3 flops: longer than a microsecond on any GPU
      CHECK(num(m, "ts") >= num(m, "args.launch_us"));
      CHECK(num(m, "dur") > 1.0);
    }
    const double first_end = std::min(num(matmuls[0], "ts") + num(matmuls[0], "dur"),
                                       num(matmuls[1], "ts") + num(matmuls[1], "dur"));
    const double second_start = std::max(num(matmuls[0], "ts"), num(matmuls[1], "ts"));
    CHECK(first_end <= second_start + 1.0);  // c = b * a ran after b, within the clock's resolution
    std::remove(path.c_str());
  }

  TEST_CASE("Gpu.MemoryReturnsToThePool" * doctest::timeout(120)) {
    nd::waitall();
    const std::int64_t before = nd::device_memory_in_use(gpu(0));
    {
      NDArray a = nd::random_uniform({1024, 1024}, gpu(0), 1);
      NDArray b = nd::matmul(a, a);
      b.wait_to_read();
      CHECK(nd::device_memory_in_use(gpu(0)) >= before + 2 * 1024 * 1024 * 4);
    }
    nd::waitall();
    CHECK(nd::device_memory_in_use(gpu(0)) == before);
  }
}

int main(int argc, char** argv) {
  try {
    (void)nd::engine().stream_device(gpu(0));
  } catch (const BackendUnavailable& e) {
    std::cout << "gpu suite skipped: " << e.what() << '\n';
    return 77;
  }
  doctest::Context ctx(argc, argv);
  return ctx.run();
}
