// NDArray on several devices: copies among cpu(), sim(0) and sim(1) keep
// every value and dtype, as_in_device is a no-op when already there, mixing
// devices is refused with nothing recorded, device memory goes back as the
// last accesses of its buffers complete, blockers on device arrays block once, and gpu(n) where no
// CUDA device can be used is refused at record time.
#include "reference.hpp"

#include <string>
#include <vector>

using namespace lazydag;

namespace {

template <class T>
void check_round_trip(std::uint32_t seed) {
  const Shape shape{3, 5, 4};
  const std::vector<T> data = test::random_values<T>(60, seed);
  NDArray host = nd::array(data, shape, cpu());
  // cpu -> sim(0) -> sim(1) -> cpu, and a strided view on the way
  NDArray s0 = host.copyto(sim(0));
  NDArray s1 = s0.copyto(sim(1));
  CHECK(s0.device() == sim(0));
  CHECK(s1.device() == sim(1));
  CHECK(s1.dtype() == dtype_of<T>());
  CHECK(s1.to_vector<T>() == data);
  CHECK(s1.copyto(cpu()).to_vector<T>() == data);
  NDArray t = s1.transpose({2, 0, 1}).copyto(cpu(1));  // non-contiguous source
  const std::vector<T> got = t.to_vector<T>();
  REQUIRE(got.size() == data.size());
  bool same = true;
  for (std::int64_t k = 0; k < 4; ++k) {
    for (std::int64_t i = 0; i < 3; ++i) {
      for (std::int64_t j = 0; j < 5; ++j) {
        same = same && got[static_cast<std::size_t>((k * 3 + i) * 5 + j)] ==
                           data[static_cast<std::size_t>((i * 5 + j) * 4 + k)];
      }
    }
  }
  CHECK(same);
}

}  // namespace

TEST_SUITE("ndarray") {
  TEST_CASE("Devices.CopiesKeepEveryValueAndDtype" * doctest::timeout(120)) {
    check_round_trip<float>(1);
    check_round_trip<double>(2);
    check_round_trip<std::int32_t>(3);
    check_round_trip<std::int64_t>(4);
    check_round_trip<bool>(5);
  }

  TEST_CASE("Devices.OpsOnASimDeviceMatchTheCpu" * doctest::timeout(120)) {
    const std::vector<float> a = test::random_values<float>(64 * 48, 11);
    const std::vector<float> b = test::random_values<float>(48 * 32, 12);
    NDArray ha = nd::array(a, {64, 48}, cpu());
    NDArray hb = nd::array(b, {48, 32}, cpu());
    auto program = [](const NDArray& x, const NDArray& y) {
      NDArray p = nd::matmul(x, y);
      NDArray q = nd::tanh(p * 0.1) + nd::relu(p);
      return nd::concat({q.sum(0, true), q.max(0, true)}, 0);
    };
    const std::vector<float> ref = program(ha, hb).to_vector<float>();
    for (Device d : {sim(0), sim(1)}) {
      CAPTURE(d.str());
      NDArray r = program(ha.copyto(d), hb.copyto(d));
      CHECK(r.device() == d);
      CHECK(r.to_vector<float>() == ref);  // the same kernels: bit for bit
    }
  }

  TEST_CASE("Devices.AsInDeviceIsANoOpWhenAlreadyThere" * doctest::timeout(60)) {
    NDArray x = nd::arange(0, 8, 1, DType::kFloat32, sim(1));
    nd::waitall();
    const auto recorded = nd::engine().stats().nodes_recorded;
    NDArray same = x.as_in_device(sim(1));
    CHECK(same.shares_storage_with(x));
    CHECK(nd::engine().stats().nodes_recorded == recorded);
    NDArray copy = x.copyto(sim(1));
    CHECK_FALSE(copy.shares_storage_with(x));
    NDArray moved = x.as_in_device(sim(0));
    CHECK(moved.device() == sim(0));
    CHECK(moved.to_vector<float>() == x.to_vector<float>());
  }

  TEST_CASE("Devices.MixingDevicesIsRefusedAndRecordsNothing" * doctest::timeout(60)) {
    NDArray c = nd::ones({4}, DType::kFloat32, cpu());
    NDArray s0 = nd::ones({4}, DType::kFloat32, sim(0));
    NDArray s1 = nd::ones({4}, DType::kFloat32, sim(1));
    NDArray positive = s0 > 0.0;
    nd::waitall();
    const auto recorded = nd::engine().stats().nodes_recorded;
    try {
      (void)(s0 + s1);
      FAIL("mixing devices must be refused");
    } catch (const DeviceMismatch& e) {
      const std::string msg = e.what();
      CHECK(msg.find("sim(0)") != std::string::npos);
      CHECK(msg.find("sim(1)") != std::string::npos);
      CHECK(msg.find("copyto") != std::string::npos);
    }
    CHECK_THROWS_AS((void)(c * s0), DeviceMismatch);
    CHECK_THROWS_AS((void)nd::where(positive, s0, c), DeviceMismatch);
    CHECK_THROWS_AS((void)nd::matmul(s0.reshape({4, 1}), s1.reshape({1, 4})), DeviceMismatch);
    CHECK_THROWS_AS((void)nd::concat({s0, s1}), DeviceMismatch);
    CHECK_THROWS_AS(s0 += s1, DeviceMismatch);
    CHECK_THROWS_AS(s0.assign(c), DeviceMismatch);
    CHECK(nd::engine().stats().nodes_recorded == recorded);
    CHECK(s0.to_vector<float>() == std::vector<float>(4, 1.0F));
  }

  TEST_CASE("Devices.DeviceMemoryIsFreedWithoutANodePerBuffer" * doctest::timeout(60)) {
    nd::waitall();
    const std::int64_t before = nd::device_memory_in_use(sim(1));
    std::uint64_t recorded = 0;
    {
      NDArray a = nd::random_uniform({256, 256}, sim(1), 3);
      NDArray b = nd::exp(a) * a;
      b.wait_to_read();
      CHECK(nd::device_memory_in_use(sim(1)) >= before + 2 * 256 * 256 * 4);
      CHECK(nd::memory_in_use() >= 0);
      recorded = nd::engine().stats().nodes_recorded;
    }
    // The buffers go back as their last accesses complete, with their vars;
    // waitall returns after those completions.
    nd::waitall();
    CHECK(nd::device_memory_in_use(sim(1)) == before);
    CHECK(nd::engine().stats().nodes_recorded == recorded);
    // Dropped before anything ran: the same once the ops have run.
    {
      NDArray a = nd::random_uniform({256, 256}, sim(1), 4);
      NDArray b = nd::tanh(nd::matmul(a, a));
      recorded = nd::engine().stats().nodes_recorded;
    }
    nd::waitall();
    CHECK(nd::device_memory_in_use(sim(1)) == before);
    CHECK(nd::engine().stats().nodes_recorded == recorded);
  }

  TEST_CASE("Devices.ABlockerOnADeviceArrayBlocksOnce" * doctest::timeout(60)) {
    NDArray x = nd::full({3}, 2.5, DType::kFloat64, sim(0));
    nd::waitall();
    const auto before = nd::engine().stats();
    CHECK(x.to_vector<double>() == std::vector<double>{2.5, 2.5, 2.5});
    CHECK(x.sum().item<double>() == 7.5);
    const auto after = nd::engine().stats();
    CHECK(after.blocking_waits == before.blocking_waits + 2);
    CHECK(after.blocking_calls[static_cast<std::size_t>(engine::BlockingCall::kToVector)] ==
          before.blocking_calls[static_cast<std::size_t>(engine::BlockingCall::kToVector)] + 1);
    CHECK(after.blocking_calls[static_cast<std::size_t>(engine::BlockingCall::kItem)] ==
          before.blocking_calls[static_cast<std::size_t>(engine::BlockingCall::kItem)] + 1);
  }

  TEST_CASE("Devices.DefaultDeviceAndParsing" * doctest::timeout(60)) {
    CHECK(parse_device("sim(3)") == sim(3));
    CHECK(parse_device("gpu") == gpu(0));
    CHECK(parse_device("cpu(12)") == cpu(12));
    CHECK_THROWS_AS((void)parse_device("tpu(0)"), InvalidArgument);
    CHECK_THROWS_AS((void)parse_device("sim(x)"), InvalidArgument);
    CHECK_THROWS_AS((void)parse_device("sim(1"), InvalidArgument);
    const Device saved = default_device();
    set_default_device(sim(1));
    CHECK(nd::zeros({2}).device() == sim(1));
    set_default_device(saved);
    CHECK(nd::zeros({2}).device() == saved);
  }

  TEST_CASE("Devices.GpuWithoutAUsableDeviceIsRefusedAtRecordTime" * doctest::timeout(60)) {
    bool usable = true;
    try {
      (void)nd::engine().stream_device(gpu(0));
    } catch (const BackendUnavailable&) {
      usable = false;
    }
    if (usable) {
      MESSAGE("a CUDA device is usable here; the gpu suite covers it");
      return;
    }
    NDArray x = nd::ones({4}, DType::kFloat32, cpu());
    nd::waitall();
    const auto recorded = nd::engine().stats().nodes_recorded;
    try {
      (void)x.copyto(gpu(0));
      FAIL("gpu(0) cannot be used here");
    } catch (const BackendUnavailable& e) {
      const std::string msg = e.what();
      CHECK(msg.find("gpu(0)") != std::string::npos);
      CHECK(msg.find("copyto") != std::string::npos);
    }
    CHECK_THROWS_AS((void)nd::zeros({2}, DType::kFloat32, gpu(0)), BackendUnavailable);
    CHECK_THROWS_AS((void)nd::random_normal({2}, gpu(1), 7), BackendUnavailable);
    CHECK(nd::engine().stats().nodes_recorded == recorded);
  }
}
