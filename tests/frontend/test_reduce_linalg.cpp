// Reductions over everything and over each axis, and matmul (2-D and
// batched), against double-precision reference loops on random inputs.
#include "reference.hpp"

#include <lazydag/ops/kernels.hpp>
#include <oneapi/tbb/task_arena.h>

#include <cstring>
#include <limits>
#include <random>

using namespace lazydag;
using namespace lazydag::test;

namespace {

enum class R { kSum, kMean, kMax, kMin, kArgmax };

NDArray apply(R r, const NDArray& a, bool all, int axis, bool keep) {
  switch (r) {
    case R::kSum: return all ? a.sum() : a.sum(axis, keep);
    case R::kMean: return all ? a.mean() : a.mean(axis, keep);
    case R::kMax: return all ? a.max() : a.max(axis, keep);
    case R::kMin: return all ? a.min() : a.min(axis, keep);
    case R::kArgmax: return all ? a.argmax() : a.argmax(axis, keep);
  }
  return {};
}

// Reference reduction of `v` (row-major, shape s) over `axis` (or all).
std::vector<double> reference(R r, const std::vector<double>& v, const Shape& s, bool all, int axis) {
  std::int64_t outer = 1;
  std::int64_t len = 1;
  std::int64_t inner = 1;
  for (int d = 0; d < static_cast<int>(s.size()); ++d) {
    if (all || d == axis) len *= s[d];
    else if (d < axis) outer *= s[d];
    else inner *= s[d];
  }
  if (all) outer = inner = 1;
  std::vector<double> out;
  for (std::int64_t o = 0; o < outer * inner; ++o) {
    double acc = 0;
    double best = 0;
    std::int64_t bi = -1;
    for (std::int64_t k = 0; k < len; ++k) {
      const double x = v[(o / inner) * len * inner + k * inner + o % inner];
      acc += x;
      const bool better = bi < 0 || (r == R::kMin ? x < best : x > best);
      if (better) {
        best = x;
        bi = k;
      }
    }
    switch (r) {
      case R::kSum: out.push_back(acc); break;
      case R::kMean: out.push_back(len == 0 ? std::numeric_limits<double>::quiet_NaN() : acc / len); break;
      case R::kMax:
      case R::kMin: out.push_back(best); break;
      case R::kArgmax: out.push_back(static_cast<double>(bi)); break;
    }
  }
  return out;
}

// x @ y (2-D or batched) in double by a plain loop over contiguous copies.
std::vector<double> matmul_reference(const NDArray& x, const NDArray& y) {
  const auto vx = values(x.copy());
  const auto vy = values(y.copy());
  const bool batched = x.ndim() == 3;
  const std::int64_t nb = batched ? x.shape()[0] : 1;
  const std::int64_t m = x.shape()[batched ? 1 : 0];
  const std::int64_t k = x.shape()[batched ? 2 : 1];
  const std::int64_t n = y.shape()[batched ? 2 : 1];
  std::vector<double> out(static_cast<std::size_t>(nb * m * n), 0.0);
  for (std::int64_t q = 0; q < nb; ++q) {
    for (std::int64_t i = 0; i < m; ++i) {
      for (std::int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (std::int64_t l = 0; l < k; ++l) {
          acc += vx[static_cast<std::size_t>(q * m * k + i * k + l)] * vy[static_cast<std::size_t>(q * k * n + l * n + j)];
        }
        out[static_cast<std::size_t>(q * m * n + i * n + j)] = acc;
      }
    }
  }
  return out;
}

}  // namespace

TEST_SUITE("ndarray") {
  TEST_CASE("Reduce.EveryOpDtypeAndAxisMatchesReference" * doctest::timeout(180)) {
    // {300, 257} and {5, 3, 600}: sums over a leading axis in blocks of
    // 256 lanes, with a partial block, one and several outer rows.
    const std::vector<Shape> shapes = {{7}, {3, 4}, {2, 3, 5}, {4, 1, 6}, {200000}, {300, 257}, {5, 3, 600}};
    std::uint32_t seed = 100;
    for (DType t : numeric_dtypes()) {
      for (const Shape& s : shapes) {
        NDArray a = random_array(s, t, seed++, -40, 40);
        const auto va = values(a);
        for (R r : {R::kSum, R::kMean, R::kMax, R::kMin, R::kArgmax}) {
          CAPTURE(to_string(t));
          CAPTURE(to_string(s));
          CAPTURE(static_cast<int>(r));
          // over everything
          NDArray all = apply(r, a, true, 0, false);
          CHECK(all.shape() == Shape{});
          check_close(values(all), reference(r, va, s, true, 0), tolerance(all.dtype()) * 10);
          // over each axis, given positively and negatively, with and without keepdims
          const int rank = static_cast<int>(s.size());
          for (int axis = 0; axis < rank; ++axis) {
            for (bool keep : {false, true}) {
              NDArray red = apply(r, a, false, keep ? axis - rank : axis, keep);
              Shape want_shape = s;
              if (keep) want_shape[axis] = 1;
              else want_shape.erase(want_shape.begin() + axis);
              CHECK(red.shape() == want_shape);
              check_close(values(red), reference(r, va, s, false, axis), tolerance(red.dtype()) * 10);
            }
          }
        }
        // output dtypes
        CHECK(a.sum().dtype() == t);
        CHECK(a.argmax().dtype() == DType::kInt64);
        CHECK(a.mean().dtype() == (is_floating(t) ? t : DType::kFloat64));
      }
    }
  }

  TEST_CASE("Reduce.StridedViewsAndEmptyArrays" * doctest::timeout(60)) {
    NDArray a = random_array({5, 8}, DType::kFloat64, 7);
    const auto va = values(a);
    NDArray t = a.transpose();  // not contiguous: reduced through a copy
    std::vector<double> want(8, 0.0);
    for (int i = 0; i < 5; ++i) {
      for (int j = 0; j < 8; ++j) want[j] += va[i * 8 + j];
    }
    check_close(values(t.sum(1)), want, 1e-12);
    NDArray empty = nd::zeros({0, 3});
    CHECK(empty.sum().item<float>() == 0.0F);
    CHECK(values(empty.sum(0)) == std::vector<double>{0, 0, 0});
    CHECK(std::isnan(empty.mean().item<float>()));
    CHECK_THROWS_AS((void)empty.max(), InvalidArgument);
    CHECK_THROWS_AS((void)empty.argmax(0), InvalidArgument);
    CHECK_NOTHROW((void)empty.max(1));  // zero lanes of length 3: nothing to reduce
  }

  TEST_CASE("Reduce.BoolArraysCountAsNumPy" * doctest::timeout(60)) {
    // sum counts the true elements (int64), mean is the fraction (float64),
    // over everything and along each axis.
    const NDArray x = random_array({4, 7}, DType::kFloat64, 77, -1, 1);
    const NDArray b = x > 0.0;
    const auto v = values(x);
    std::int64_t total = 0;
    std::vector<std::int64_t> rows(4, 0);
    std::vector<std::int64_t> cols(7, 0);
    for (int i = 0; i < 4; ++i) {
      for (int j = 0; j < 7; ++j) {
        const bool t = v[static_cast<std::size_t>(i * 7 + j)] > 0;
        total += t;
        rows[static_cast<std::size_t>(i)] += t;
        cols[static_cast<std::size_t>(j)] += t;
      }
    }
    CHECK(b.sum().dtype() == DType::kInt64);
    CHECK(b.sum().item<std::int64_t>() == total);
    CHECK(b.sum(1).to_vector<std::int64_t>() == rows);
    CHECK(b.sum(0, true).shape() == Shape{1, 7});
    CHECK(b.sum(0, true).to_vector<std::int64_t>() == cols);
    CHECK(b.mean().dtype() == DType::kFloat64);
    CHECK(b.mean().item<double>() == doctest::Approx(static_cast<double>(total) / 28));
    const auto mr = b.mean(1).to_vector<double>();
    for (int i = 0; i < 4; ++i) CHECK(mr[static_cast<std::size_t>(i)] == doctest::Approx(rows[static_cast<std::size_t>(i)] / 7.0));
    CHECK_THROWS_AS((void)b.max(), InvalidArgument);  // still refused: no order on bool
  }

  TEST_CASE("Reduce.ResultsDoNotDependOnTheNumberOfThreads" * doctest::timeout(120)) {
    // The CPU kernel called directly in arenas of 1 to 4 threads: the same
    // bits each time (partials are combined in a fixed order). float64
    // values of mixed magnitudes make a sum's last bits depend on the order
    // of its additions; argmax's input has many ties (the first wins).
    const std::int64_t rows = 2048;
    const std::int64_t cols = 640;  // 1.3M elements: several parallel chunks
    std::vector<double> v = random_values<double>(rows * cols, 41, -1.0, 1.0);
    const std::vector<double> scale = random_values<double>(rows * cols, 42, -8.0, 8.0);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = v[i] * std::pow(10.0, std::floor(scale[i]));
    std::vector<double> ties(v.size());
    for (std::size_t i = 0; i < v.size(); ++i) ties[i] = std::floor(v[i] / std::pow(10.0, 6.0));
    const Shape shape{rows, cols};
    const Strides strides{cols, 1};
    struct Case {
      ops::ReduceOp op;
      const std::vector<double>* in;
      bool all;
      int axis;
    };
    const Case cases[] = {
        {ops::ReduceOp::kSum, &v, true, 0},      {ops::ReduceOp::kSum, &v, false, 0},
        {ops::ReduceOp::kSum, &v, false, 1},     {ops::ReduceOp::kMean, &v, true, 0},
        {ops::ReduceOp::kMean, &v, false, 0},    {ops::ReduceOp::kMax, &v, true, 0},
        {ops::ReduceOp::kMin, &v, false, 1},     {ops::ReduceOp::kArgmax, &ties, true, 0},
        {ops::ReduceOp::kArgmax, &ties, false, 0}, {ops::ReduceOp::kArgmax, &ties, false, 1},
    };
    for (const Case& c : cases) {
      CAPTURE(static_cast<int>(c.op));
      CAPTURE(c.all);
      CAPTURE(c.axis);
      const std::int64_t out_n = c.all ? 1 : (c.axis == 0 ? cols : rows);
      const DType out_type = c.op == ops::ReduceOp::kArgmax ? DType::kInt64 : DType::kFloat64;
      const ops::TensorView in{const_cast<double*>(c.in->data()), DType::kFloat64, shape, strides, 0};
      auto run = [&](int threads) {
        std::vector<std::uint64_t> bits(static_cast<std::size_t>(out_n));
        const ops::TensorView out{bits.data(), out_type, c.all ? Shape{} : Shape{out_n},
                                  c.all ? Strides{} : Strides{1}, 0};
        tbb::task_arena arena(threads);
        arena.execute([&] { ops::cpu::reduce(c.op, in, c.all, c.axis, out); });
        return bits;
      };
      const std::vector<std::uint64_t> one = run(1);
      for (int threads : {2, 3, 4, 4, 4}) CHECK(run(threads) == one);
      // And the same bits as the NDArray op under this run's engine.
      NDArray a = nd::array(*c.in, shape);
      NDArray r = apply(c.op == ops::ReduceOp::kSum    ? R::kSum
                        : c.op == ops::ReduceOp::kMean ? R::kMean
                        : c.op == ops::ReduceOp::kMax  ? R::kMax
                        : c.op == ops::ReduceOp::kMin  ? R::kMin
                                                       : R::kArgmax,
                        a, c.all, c.axis, false);
      std::vector<std::uint64_t> got(static_cast<std::size_t>(out_n));
      if (out_type == DType::kInt64) {
        const auto x = r.to_vector<std::int64_t>();
        std::memcpy(got.data(), x.data(), got.size() * 8);
      } else {
        const auto x = r.to_vector<double>();
        std::memcpy(got.data(), x.data(), got.size() * 8);
      }
      CHECK(got == one);
    }
  }

  TEST_CASE("Reduce.MaxMinArgmaxKeepNaNZeroAndTieRules" * doctest::timeout(120)) {
    // The vectorised scans against an element-by-element reference with
    // NumPy's rules: the first NaN wins, then the extreme, and the first of
    // equal values (so the sign of a zero is that of the first zero that is
    // the extreme); over one lane and over the last axis, for lengths
    // around the scan's width and across its parallel chunks.
    auto check = [](auto zero, std::int64_t n, int pattern, std::uint32_t seed) {
      using T = decltype(zero);
      constexpr bool kFloat = std::is_floating_point_v<T>;
      std::vector<T> v = random_values<T>(n, seed, -50, 50);
      std::mt19937 rng(seed);
      auto at = [&] { return static_cast<std::size_t>(rng() % static_cast<std::uint32_t>(n)); };
      if (pattern == 1) {
        for (auto& e : v) e = static_cast<T>(7);  // all equal
      } else if (pattern == 2) {
        const T top = static_cast<T>(60);
        for (int k = 0; k < 3; ++k) v[at()] = top;  // ties of the max
        v[at()] = static_cast<T>(-60);
      } else if (pattern == 3 && kFloat) {
        for (auto& e : v) e = e > 0 ? -e : e;  // every value <= 0, zeros of both signs
        for (int k = 0; k < 4; ++k) v[at()] = (k % 2 == 0) ? T(-0.0) : T(0.0);
      } else if (pattern == 4 && kFloat) {
        v[at()] = std::numeric_limits<T>::quiet_NaN();
        v[at()] = static_cast<T>(90);
      }
      auto reference = [&](const T* x, std::int64_t len, bool min) {
        T best = x[0];
        std::int64_t idx = 0;
        for (std::int64_t i = 1; i < len; ++i) {
          const bool nan = x[i] != x[i] && best == best;
          if (nan || (min ? x[i] < best : x[i] > best)) {
            best = x[i];
            idx = i;
          }
        }
        return std::make_pair(best, idx);
      };
      auto same_bits = [](T a, T b) { return std::memcmp(&a, &b, sizeof(T)) == 0; };
      NDArray a = nd::array(v, {n});
      const auto [mx, mx_i] = reference(v.data(), n, false);
      const auto [mn, mn_i] = reference(v.data(), n, true);
      CHECK(same_bits(a.max().template item<T>(), mx));
      CHECK(same_bits(a.min().template item<T>(), mn));
      CHECK(a.argmax().template item<std::int64_t>() == mx_i);
      // The same values as rows of 2 (the last axis).
      if (n % 2 == 0) {
        NDArray r = a.reshape({2, n / 2});
        const auto maxes = r.max(1, false).template to_vector<T>();
        const auto mins = r.min(1, false).template to_vector<T>();
        const auto args = r.argmax(1, false).template to_vector<std::int64_t>();
        for (std::int64_t row = 0; row < 2; ++row) {
          const T* x = v.data() + row * (n / 2);
          CHECK(same_bits(maxes[static_cast<std::size_t>(row)], reference(x, n / 2, false).first));
          CHECK(same_bits(mins[static_cast<std::size_t>(row)], reference(x, n / 2, true).first));
          CHECK(args[static_cast<std::size_t>(row)] == reference(x, n / 2, false).second);
        }
      }
    };
    std::uint32_t seed = 500;
    for (std::int64_t n : {5, 31, 32, 33, 64, 65, 1000, 4096, 70001, 200002}) {
      for (int pattern = 0; pattern < 5; ++pattern) {
        CAPTURE(n);
        CAPTURE(pattern);
        check(0.0F, n, pattern, ++seed);
        check(0.0, n, pattern, ++seed);
        check(std::int32_t{0}, n, pattern, ++seed);
        check(std::int64_t{0}, n, pattern, ++seed);
      }
    }
  }

  TEST_CASE("Linalg.MatmulMatchesReference" * doctest::timeout(180)) {
    struct Case {
      Shape a;
      Shape b;
    };
    const std::vector<Case> cases = {
        {{1, 1}, {1, 1}},       {{3, 4}, {4, 5}},          {{17, 33}, {33, 9}},
        {{130, 70}, {70, 150}}, {{2, 3, 4}, {2, 4, 6}},    {{3, 70, 90}, {3, 90, 80}},
        {{4, 0}, {0, 3}},       {{0, 5}, {5, 2}},
    };
    std::uint32_t seed = 500;
    for (DType t : {DType::kFloat32, DType::kFloat64}) {
      for (const auto& c : cases) {
        CAPTURE(to_string(t));
        CAPTURE(to_string(c.a));
        CAPTURE(to_string(c.b));
        NDArray a = random_array(c.a, t, seed++, -1, 1);
        NDArray b = random_array(c.b, t, seed++, -1, 1);
        NDArray p = nd::matmul(a, b);
        check_close(values(p), matmul_reference(a, b), t == DType::kFloat32 ? 1e-4 : 1e-10);
      }
    }
    // transposed (strided) operands and dot == matmul
    NDArray a = random_array({40, 30}, DType::kFloat64, 9);
    NDArray b = random_array({40, 20}, DType::kFloat64, 10);
    NDArray atb = nd::dot(a.transpose(), b);
    CHECK(atb.shape() == Shape{30, 20});
    const auto va = values(a);
    const auto vb = values(b);
    double want00 = 0;
    for (int l = 0; l < 40; ++l) want00 += va[l * 30] * vb[l * 20];
    CHECK(values(atb)[0] == doctest::Approx(want00).epsilon(1e-12));
  }

  TEST_CASE("Linalg.TransposedSlicedAndBatchedViewsAreReadInPlace" * doctest::timeout(120)) {
    // Operands built as views of random arrays: transposed, column- and
    // row-sliced, batched with permuted axes; each product against the
    // reference loop over contiguous copies.
    std::uint32_t seed = 900;
    for (DType t : {DType::kFloat32, DType::kFloat64}) {
      CAPTURE(to_string(t));
      const double tol = t == DType::kFloat32 ? 1e-4 : 1e-10;
      const NDArray big = random_array({90, 140}, t, seed++, -1, 1);
      const NDArray other = random_array({140, 90}, t, seed++, -1, 1);
      const NDArray batch = random_array({3, 40, 50}, t, seed++, -1, 1);
      struct Case {
        const char* what;
        NDArray x;
        NDArray y;
        bool in_place;  // both operands usable by BLAS as they are
      };
      const std::vector<Case> cases = {
          {"A^T B", big.transpose(), big.slice(1, 0, 70), true},
          {"A B^T", big, big.transpose(), true},
          {"A^T B^T", other.transpose(), big.transpose(), true},
          {"column slices", big.slice(1, 10, 50), other.slice(0, 3, 43), true},
          {"row and column slices", big.slice(0, 5, 65).slice(1, 7, 107), other.slice(0, 20, 120), true},
          {"a transposed slice", big.slice(1, 30, 100).transpose(), big.slice(1, 0, 20), true},
          {"batched transposes", batch.transpose({0, 2, 1}), batch, true},
          {"batched slice", batch.slice(2, 5, 45), batch.transpose({0, 2, 1}).slice(1, 5, 45), true},
          // (50, 3, 40) with strides (1, 2000, 50): no unit stride in the matrix
          {"batched, axes rotated", batch.transpose({2, 0, 1}), random_array({50, 40, 7}, t, seed++, -1, 1), false},
          {"a row vector", big.slice(0, 7, 8), other, true},
          {"a column of a transpose", big.transpose().slice(1, 3, 4).transpose(), other.slice(1, 0, 9), true},
      };
      for (const Case& c : cases) {
        CAPTURE(c.what);
        const auto before = nd::engine().stats().nodes_recorded;
        const NDArray p = nd::matmul(c.x, c.y);
        // In place: the product is the only node recorded (no copy first).
        if (c.in_place) CHECK(nd::engine().stats().nodes_recorded == before + 1);
        if (!c.in_place) CHECK(nd::engine().stats().nodes_recorded > before + 1);
        check_close(values(p), matmul_reference(c.x, c.y), tol);
      }
    }
  }

  TEST_CASE("Linalg.LargeProductIsIndependentOfTheBlocking" * doctest::timeout(120)) {
    // Large enough for the row-blocked parallel path; the same product twice
    // must be bit-identical (fixed blocking), and close to the reference.
    NDArray a = nd::random_uniform({300, 200}, cpu(), 3, -1, 1);
    NDArray b = nd::random_uniform({200, 250}, cpu(), 4, -1, 1);
    auto p1 = nd::matmul(a, b).to_vector<float>();
    auto p2 = nd::matmul(a, b).to_vector<float>();
    CHECK(p1 == p2);
    const auto va = a.to_vector<float>();
    const auto vb = b.to_vector<float>();
    for (int i : {0, 63, 64, 150, 299}) {
      for (int j : {0, 249}) {
        double acc = 0;
        for (int l = 0; l < 200; ++l) acc += double(va[i * 200 + l]) * vb[l * 250 + j];
        CHECK(p1[i * 250 + j] == doctest::Approx(acc).epsilon(1e-4));
      }
    }
  }
}
