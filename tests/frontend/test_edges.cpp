// Bad input at the NDArray edges: shapes whose element, stride or byte
// counts overflow (every op family that makes a shape), input vectors that
// do not fill their shape, a var deleted behind an array's back, integer
// division by a scalar that truncates to 0, and what assign does to an
// array an earlier op poisoned. Refusals are InvalidArgument at the call
// site and record nothing.
#include "reference.hpp"

#include <cstdint>
#include <functional>
#include <limits>

using namespace lazydag;
using namespace lazydag::test;

namespace {

constexpr std::int64_t kBig = std::int64_t{1} << 40;
constexpr std::int64_t kInt64Max = std::numeric_limits<std::int64_t>::max();

std::uint64_t recorded() { return nd::engine().stats().nodes_recorded; }

// `call` throws InvalidArgument whose message has `what`, and records nothing.
void refused(const std::function<void()>& call, const std::string& what) {
  nd::waitall();
  const std::uint64_t before = recorded();
  const std::int64_t bytes = nd::memory_in_use();
  try {
    call();
    FAIL("accepted; expected an InvalidArgument mentioning '" << what << "'");
  } catch (const InvalidArgument& e) {
    CHECK_MESSAGE(std::string(e.what()).find(what) != std::string::npos, e.what());
  }
  CHECK(recorded() == before);
  CHECK(nd::memory_in_use() == bytes);
}

}  // namespace

TEST_SUITE("ndarray") {
  TEST_CASE("Edges.ShapesWhoseCountsOverflowAreRefused" * doctest::timeout(60)) {
    const Device dev = default_device();
    const std::string too_many = "too many elements";
    // Products that wrap to 0, to a negative count, or to a byte count near 2^64.
    refused([&] { (void)nd::zeros({std::int64_t{1} << 32, std::int64_t{1} << 32}, DType::kFloat32, dev); },
            too_many);
    refused([&] { (void)nd::zeros({3037000500, 3037000500}, DType::kFloat32, dev); }, too_many);
    refused([&] { (void)nd::zeros({kInt64Max, 2}, DType::kFloat32, dev); }, too_many);
    refused([&] { (void)nd::ones({kInt64Max}, DType::kFloat64, dev); }, too_many);
    refused([&] { (void)nd::full({std::int64_t{1} << 61}, 1.0, DType::kBool, dev); }, too_many);
    // A zero dim makes no bytes, but the strides of the others still overflow.
    refused([&] { (void)nd::zeros({0, kBig, kBig}, DType::kFloat32, dev); }, too_many);
    refused([&] { (void)nd::random_uniform({kBig, kBig}, dev, 1); }, too_many);
    refused([&] { (void)nd::random_normal({kBig, kBig}, dev, 1); }, too_many);
    refused([&] { (void)nd::array<float>({1.0F}, {kBig, kBig}, dev); }, too_many);
    // Element counts beyond what an int64 can index, from arange.
    refused([&] { (void)nd::arange(0, 1e30, 1, DType::kFloat32, dev); }, "elements");
    refused([&] { (void)nd::arange(-1e308, 1e308, 1e-300, DType::kFloat64, dev); }, "elements");
    // The largest zero-size shapes are fine.
    NDArray empty = nd::zeros({0, kBig}, DType::kFloat32, dev);
    CHECK(empty.size() == 0);
    CHECK(nd::zeros({0, kMaxElements}, DType::kFloat64, dev).size() == 0);
  }

  TEST_CASE("Edges.AnArrayLargerThanTheAddressSpaceIsAnError" * doctest::timeout(60)) {
    // 2^50 bytes: a valid shape no machine can hold (beyond the 47-bit user
    // address space, so no overcommit setting lets it through).
    const std::uint64_t before = recorded();
    try {
      (void)nd::zeros({std::int64_t{1} << 48}, DType::kFloat32, cpu());
      FAIL("a 1 PiB array was allocated");
    } catch (const InvalidArgument&) {
      FAIL("a valid shape was refused as invalid");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find("out of memory") != std::string::npos);
      CHECK(std::string(e.what()).find("(281474976710656,)") != std::string::npos);
    }
    CHECK(recorded() == before);
  }

  TEST_CASE("Edges.ShapeRulesUseCheckedArithmetic" * doctest::timeout(60)) {
    const Device dev = default_device();
    NDArray a = nd::arange(0, 16, 1, DType::kFloat32, dev);
    // reshape: products that wrap to 16, and -1 inference against a huge known part
    refused([&] { (void)a.reshape({(std::int64_t{1} << 62) + 1, 4}); }, "too many elements");
    refused([&] { (void)a.reshape({std::int64_t{1} << 62, 4}); }, "too many elements");
    refused([&] { (void)a.reshape({-1, kInt64Max}); }, "too many elements");
    refused([&] { (void)a.reshape({kInt64Max, kInt64Max, -1}); }, "too many elements");
    CHECK(values(a.reshape({-1, 4}).slice(0, 1, 2)) == std::vector<double>{4, 5, 6, 7});
    // broadcast: each operand fits (zero bytes), their broadcast does not
    NDArray col = nd::zeros({0, kBig, 1}, DType::kFloat32, dev);
    NDArray row = nd::zeros({0, 1, kBig}, DType::kFloat32, dev);
    refused([&] { (void)(col + row); }, "too many elements");
    refused([&] { (void)(col < row); }, "too many elements");
    NDArray cond = col < 0.0;
    refused([&] { (void)nd::where(cond, col, row); }, "too many elements");
    // concat: the sum along the axis
    NDArray wide = nd::zeros({0, kMaxElements}, DType::kFloat32, dev);
    refused([&] { (void)nd::concat({wide, wide}, 1); }, "exceeds the maximum");
    NDArray half = nd::zeros({0, std::int64_t{1} << 59}, DType::kFloat32, dev);
    refused([&] { (void)nd::concat({half, half, half}, 1); }, "exceeds the maximum");
    NDArray quarter = nd::zeros({0, std::int64_t{1} << 58}, DType::kFloat32, dev);
    CHECK(nd::concat({quarter, quarter, quarter}, 1).shape() == Shape{0, std::int64_t{3} << 58});
    // matmul: (2^40, 0) x (0, 2^40), whose dims BLAS could not take either,
    // and (2^30 x 2^30 of a batch of 2^4): each dim fits, the product does not
    NDArray tall = nd::zeros({kBig, 0}, DType::kFloat32, dev);
    NDArray flat = nd::zeros({0, kBig}, DType::kFloat32, dev);
    refused([&] { (void)nd::matmul(tall, flat); }, "exceeds the BLAS limit");
    const std::int64_t g = std::int64_t{1} << 30;
    NDArray bt = nd::zeros({16, g, 0}, DType::kFloat32, dev);
    NDArray bf = nd::zeros({16, 0, g}, DType::kFloat32, dev);
    refused([&] { (void)nd::matmul(bt, bf); }, "too many elements");
    // BLAS takes int dimensions: larger ones are refused, not truncated
    NDArray wide_a = nd::zeros({std::int64_t{1} << 31, 0}, DType::kFloat32, dev);
    NDArray none = nd::zeros({0, 0}, DType::kFloat32, dev);
    refused([&] { (void)nd::matmul(wide_a, none); }, "exceeds the BLAS limit");
    // views of huge zero-size arrays keep their shapes exactly
    CHECK(wide.transpose().shape() == Shape{kMaxElements, 0});
    CHECK(wide.slice(1, 5, 10).shape() == Shape{0, 5});
  }

  TEST_CASE("Edges.ArrayInputMustFillItsShape" * doctest::timeout(60)) {
    const Device dev = default_device();
    refused([&] { (void)nd::array<bool>({true, false, true}, {2, 2}, dev); }, "do not fill");
    refused([&] { (void)nd::array<bool>({true}, {100000}, dev); }, "do not fill");
    refused([&] { (void)nd::array<float>({1, 2, 3}, {2, 2}, dev); }, "do not fill");
    refused([&] { (void)nd::array<std::int64_t>({}, {1}, dev); }, "do not fill");
    NDArray b = nd::array<bool>({true, false, true, true}, {2, 2}, dev);
    CHECK(b.to_vector<bool>() == std::vector<bool>{true, false, true, true});
  }

  TEST_CASE("Edges.AnArraysVarCannotBeDeletedBehindItsBack" * doctest::timeout(60)) {
    NDArray x = nd::full({3}, 2.0, DType::kFloat32, default_device());
    try {
      nd::engine().delete_var(x.var());
      FAIL("deleting an array's var through the engine was accepted");
    } catch (const InvalidArgument& e) {
      CHECK(std::string(e.what()).find("NDArray") != std::string::npos);
    }
    // The array is intact, and dropping it later does not throw.
    CHECK(values(x + 1.0) == std::vector<double>{3, 3, 3});
    x = NDArray();
    nd::waitall();
    // Plain engine vars are still the user's to delete.
    engine::Var v = nd::engine().new_var();
    nd::engine().delete_var(v);
    CHECK_THROWS_AS(nd::engine().delete_var(v), InvalidArgument);
  }

  TEST_CASE("Edges.IntegerDivisionByAScalarThatTruncatesToZero" * doctest::timeout(60)) {
    const Device dev = default_device();
    NDArray i = nd::array<std::int32_t>({5, 7, -9}, {3}, dev);
    refused([&] { (void)(i / 0.4); }, "the scalar 0.4 was converted to int32 0");
    refused([&] { (void)(i / 0.0); }, "integer division by zero");
    NDArray l = i.astype(DType::kInt64);
    refused([&] { (void)(l / -0.9); }, "converted to int64 0");
    refused([&] { i /= 0.25; }, "converted to int32 0");
    CHECK(values(i / 2.0) == std::vector<double>{2, 3, -4});  // C++ integer division
    CHECK(values(i.astype(DType::kFloat64) / 0.5) == std::vector<double>{10, 14, -18});
    CHECK(values(10.0 / i) == std::vector<double>{2, 1, -1});
  }

  TEST_CASE("Edges.AssignOverwritingAWholeArrayClearsItsError" * doctest::timeout(60)) {
    const Device dev = default_device();
    NDArray zero = nd::zeros({3}, DType::kInt32, dev);
    NDArray clean = nd::array<std::int32_t>({1, 2, 3}, {3}, dev);
    NDArray bad = nd::array<std::int32_t>({4, 5, 6}, {3}, dev) / zero;  // integer division by zero
    if (dev.kind != DeviceKind::kGpu) {  // a GPU kernel gives 0 instead (kernels.hpp)
      CHECK_THROWS_AS(bad.wait_to_read(), OpError);
      NDArray part = nd::array<std::int32_t>({4, 5, 6}, {3}, dev) / zero;
      // Writing part of it keeps the error: the rest of the buffer is still what failed.
      part.slice(0, 0, 1).assign(clean.slice(0, 0, 1));
      CHECK_THROWS_AS(part.wait_to_read(), OpError);
      NDArray later = bad + 1.0;  // recorded before the overwrite: still poisoned
      bad.assign(clean);
      CHECK_THROWS_AS(later.wait_to_read(), OpError);
    } else {
      bad.assign(clean);
    }
    // A full overwrite: the array holds the new values and reads normally.
    CHECK(bad.to_vector<std::int32_t>() == std::vector<std::int32_t>{1, 2, 3});
    CHECK(values(bad * 2.0) == std::vector<double>{2, 4, 6});
    nd::waitall();
  }

  TEST_CASE("Edges.DevicesOutsideTheEnumeration" * doctest::timeout(60)) {
    const Device odd{static_cast<DeviceKind>(7), 0};
    refused([&] { (void)nd::zeros({2}, DType::kFloat32, odd); }, "unknown device kind");
    NDArray a = nd::zeros({2}, DType::kFloat32, cpu());
    refused([&] { (void)a.copyto(odd); }, "unknown device kind");
  }
}
