// The NDArray side of observability: blockers attributed to their call
// sites, and MetricLog moving one block per K appends to the host.
#include "reference.hpp"

#include <lazydag/engine/sync_debug.hpp>

#include <filesystem>
#include <map>
#include <fstream>
#include <sstream>
#include <unistd.h>

using namespace lazydag;
using namespace lazydag::test;

namespace {

std::uint64_t blocking_calls() { return nd::engine().stats().blocking_waits; }

}  // namespace

TEST_SUITE("ndarray") {
  TEST_CASE("Observe.BlockersNameTheirKindAndCallSite" * doctest::timeout(60)) {
    NDArray a = nd::arange(0, 4, 1, DType::kFloat32);
    nd::waitall();
    engine::clear_blocking_sites();
    engine::set_sync_debug(engine::SyncDebug::kWarn);
    std::ostringstream captured;
    auto* old = std::cerr.rdbuf(captured.rdbuf());
    const int item_line = __LINE__ + 1;
    (void)a.sum().item<float>();
    (void)a.to_vector<float>();
    std::ostringstream printed;
    printed << a;
    std::cerr.rdbuf(old);
    engine::set_sync_debug(engine::SyncDebug::kOff);
    std::map<engine::BlockingCall, engine::BlockingSite> by_kind;
    for (const auto& s : engine::blocking_sites()) by_kind[s.kind] = s;
    REQUIRE(by_kind.count(engine::BlockingCall::kItem) == 1);
    CHECK(by_kind[engine::BlockingCall::kItem].line == static_cast<std::uint32_t>(item_line));
    CHECK(by_kind[engine::BlockingCall::kItem].file.find("test_observe.cpp") != std::string::npos);
    CHECK(by_kind.count(engine::BlockingCall::kToVector) == 1);
    CHECK(by_kind.count(engine::BlockingCall::kPrint) == 1);
    CHECK(captured.str().find("item() at") != std::string::npos);
    // error mode refuses the blocker before it blocks
    engine::set_sync_debug(engine::SyncDebug::kError);
    CHECK_THROWS_AS((void)a.sum().item<float>(), BlockingCallError);
    engine::set_sync_debug(engine::SyncDebug::kOff);
    engine::clear_blocking_sites();
  }

  TEST_CASE("Observe.MetricLogMovesOneBlockPerKAppends" * doctest::timeout(60)) {
    const int steps = 95;
    const int k = 10;
    std::vector<double> got;
    std::vector<std::int64_t> firsts;
    std::vector<double> want;
    NDArray w = nd::full({}, 1.0, DType::kFloat32);
    nd::waitall();
    {
      MetricLog log("loss", k, [&](std::int64_t first, std::span<const double> v) {
        firsts.push_back(first);
        got.insert(got.end(), v.begin(), v.end());
      });
      const std::uint64_t before = blocking_calls();
      for (int s = 0; s < steps; ++s) {
        w *= 0.9;  // a "loss" that stays on the device
        NDArray loss = w * w + static_cast<double>(s);
        log.append(loss);
        // exactly one blocking transfer per k appends, none in between
        CHECK(blocking_calls() - before == static_cast<std::uint64_t>((s + 1) / k));
      }
      CHECK(log.steps() == steps);
      log.flush();  // the partial last block
      CHECK(blocking_calls() - before == static_cast<std::uint64_t>(steps / k + 1));
      log.flush();  // nothing pending: no transfer
      CHECK(blocking_calls() - before == static_cast<std::uint64_t>(steps / k + 1));
    }
    float wv = 1.0F;
    for (int s = 0; s < steps; ++s) {
      wv *= 0.9F;
      want.push_back(static_cast<double>(wv * wv + static_cast<float>(s)));
    }
    REQUIRE(got.size() == want.size());
    for (std::size_t i = 0; i < got.size(); ++i) CHECK(got[i] == want[i]);  // exact: float32 -> double
    CHECK(firsts == std::vector<std::int64_t>{0, 10, 20, 30, 40, 50, 60, 70, 80, 90});
  }

  TEST_CASE("Observe.MetricLogWritesCsvAndRefusesBadInput" * doctest::timeout(60)) {
    const std::string path =
        (std::filesystem::temp_directory_path() / ("lazydag_metrics_" + std::to_string(::getpid()) + ".csv"))
            .string();
    std::filesystem::remove(path);
    {
      MetricLog log("acc", 4, path);
      for (int i = 0; i < 6; ++i) log.append(nd::full({1}, i * 0.5, DType::kFloat64));
      CHECK_THROWS_AS(log.append(nd::zeros({2})), InvalidArgument);
      CHECK_THROWS_AS(log.append(nd::zeros({1}, DType::kBool)), InvalidArgument);
      CHECK_THROWS_AS(log.append(nd::zeros({1}, DType::kFloat32, cpu(1))), DeviceMismatch);
    }  // flushes the last two
    std::ifstream in(path);
    std::stringstream text;
    text << in.rdbuf();
    CHECK(text.str() == "step,name,value\n0,acc,0\n1,acc,0.5\n2,acc,1\n3,acc,1.5\n4,acc,2\n5,acc,2.5\n");
    std::filesystem::remove(path);
    CHECK_THROWS_AS(MetricLog("bad", 0, [](std::int64_t, std::span<const double>) {}), InvalidArgument);
  }
}
