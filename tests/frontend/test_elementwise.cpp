// Elementwise ops against double-precision reference loops on random inputs,
// for every dtype they support, with NumPy broadcasting edge cases.
#include <lazydag/ops/kernels.hpp>

#include "reference.hpp"

#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <random>

using namespace lazydag;
using namespace lazydag::test;

namespace {

struct ShapePair {
  Shape a;
  Shape b;
};

// size-1 dims, size-0 dims, rank-0 scalars, mismatched ranks, strided-free.
const std::vector<ShapePair>& shape_pairs() {
  static const std::vector<ShapePair> v = {
      {{3, 4}, {3, 4}}, {{3, 4}, {4}},       {{2, 1, 4}, {3, 1}}, {{5}, {}},
      {{}, {}},         {{4, 1}, {1, 5}},    {{0, 3}, {1, 3}},    {{2, 3, 0}, {3, 1}},
      {{1}, {7}},       {{2, 1, 3, 1}, {4, 1, 5}}, {{40000}, {40000}}, {{300, 200}, {200}},
  };
  return v;
}

using Ref = std::function<double(double, double)>;

void check_binary(const char* name, const std::function<NDArray(const NDArray&, const NDArray&)>& op,
                  const Ref& ref, DType t, double lo, double hi, bool nonzero_b = false) {
  std::uint32_t seed = 1;
  for (const auto& p : shape_pairs()) {
    CAPTURE(name);
    CAPTURE(to_string(t));
    CAPTURE(to_string(p.a));
    CAPTURE(to_string(p.b));
    NDArray a = random_array(p.a, t, seed++, lo, hi);
    NDArray b = random_array(p.b, t, seed++, lo, hi);
    if (nonzero_b) b = nd::where(b == 0.0, nd::full(p.b, 1.0, t), b);
    NDArray c = op(a, b);
    const Shape out = ops::broadcast_shapes(p.a, p.b, "test");
    CHECK(c.shape() == out);
    CHECK(c.dtype() == t);
    const auto va = values(a);
    const auto vb = values(b);
    std::vector<double> want(static_cast<std::size_t>(numel(out)));
    for (std::int64_t i = 0; i < numel(out); ++i) {
      double r = ref(va[broadcast_index(out, p.a, i)], vb[broadcast_index(out, p.b, i)]);
      if (is_integral(t)) r = t == DType::kInt32 ? static_cast<double>(static_cast<std::int32_t>(r)) : std::trunc(r);
      want[i] = r;
    }
    check_close(values(c), want, tolerance(t));
  }
}

}  // namespace

TEST_SUITE("ndarray") {
  TEST_CASE("Elementwise.ArithmeticMatchesReference" * doctest::timeout(120)) {
    for (DType t : numeric_dtypes()) {
      check_binary("add", [](auto& a, auto& b) { return a + b; }, std::plus<>(), t, -50, 50);
      check_binary("sub", [](auto& a, auto& b) { return a - b; }, std::minus<>(), t, -50, 50);
      check_binary("mul", [](auto& a, auto& b) { return a * b; }, std::multiplies<>(), t, -50, 50);
      check_binary("div", [](auto& a, auto& b) { return a / b; },
                   [t](double x, double y) { return is_integral(t) ? std::trunc(x / y) : x / y; }, t,
                   -50, 50, /*nonzero_b=*/true);
      check_binary("maximum", [](auto& a, auto& b) { return nd::maximum(a, b); },
                   [](double x, double y) { return std::max(x, y); }, t, -50, 50);
      check_binary("minimum", [](auto& a, auto& b) { return nd::minimum(a, b); },
                   [](double x, double y) { return std::min(x, y); }, t, -50, 50);
      if (is_floating(t)) {
        check_binary("pow", [](auto& a, auto& b) { return nd::pow(a, b); },
                     [](double x, double y) { return std::pow(x, y); }, t, 0.5, 2.0);
      }
    }
  }

  TEST_CASE("Elementwise.ViewsAndLargeArraysMatchReference" * doctest::timeout(120)) {
    // Strided operands (transposes, slices), row and column broadcasts and
    // arrays large enough to be split across workers inside a row: every
    // path of the kernels' loop nests, against a reference loop.
    struct Case {
      NDArray a;
      NDArray b;
    };
    std::uint32_t seed = 100;
    for (DType t : {DType::kFloat32, DType::kInt64}) {
      CAPTURE(to_string(t));
      auto r = [&](const Shape& s) { return random_array(s, t, seed++, -20, 20); };
      std::vector<Case> cases;
      cases.push_back({r({100003}), r({100003})});                   // dense, split inside one row
      cases.push_back({r({513, 257}), r({513, 1})});                 // column broadcast, split
      cases.push_back({r({513, 257}), r({257})});                    // row broadcast, split
      cases.push_back({r({257, 513}).transpose(), r({513, 257})});   // a transposed
      cases.push_back({r({300, 9}).slice(1, 2, 7), r({300, 5})});    // a sliced along the inner dim
      cases.push_back({r({4, 300, 9}).transpose({2, 0, 1}), r({300})});
      cases.push_back({r({70000}).slice(0, 1, 69999), r({})});       // a scalar operand
      cases.push_back({r({6, 1, 5}), r({1, 70000, 1}).slice(1, 0, 7)});
      for (const Case& c : cases) {
        CAPTURE(to_string(c.a.shape()));
        CAPTURE(to_string(c.b.shape()));
        const Shape out = ops::broadcast_shapes(c.a.shape(), c.b.shape(), "test");
        const auto va = values(c.a);
        const auto vb = values(c.b);
        std::vector<double> sum(static_cast<std::size_t>(numel(out)));
        std::vector<double> less(sum.size());
        std::vector<double> neg(va.size());
        for (std::int64_t i = 0; i < numel(out); ++i) {
          const double x = va[broadcast_index(out, c.a.shape(), i)];
          const double y = vb[broadcast_index(out, c.b.shape(), i)];
          sum[i] = x + y;
          less[i] = x < y ? 1 : 0;
        }
        for (std::size_t i = 0; i < va.size(); ++i) neg[i] = -va[i];
        check_close(values(c.a + c.b), sum, tolerance(t));
        check_close(values(c.a < c.b), less, 0);
        check_close(values(-c.a), neg, 0);
        check_close(values(nd::where(c.a < c.b, c.a, c.b)),
                    [&] {
                      std::vector<double> w(sum.size());
                      for (std::int64_t i = 0; i < numel(out); ++i) {
                        const double x = va[broadcast_index(out, c.a.shape(), i)];
                        const double y = vb[broadcast_index(out, c.b.shape(), i)];
                        w[i] = x < y ? x : y;
                      }
                      return w;
                    }(),
                    0);
        check_close(values(c.a.astype(DType::kFloat64)), va, 0);
      }
    }
  }

  TEST_CASE("Elementwise.VectorMathIsWithinTwoUlp" * doctest::timeout(120)) {
    // exp, log, tanh, sigmoid and log1p on the CPU (SLEEF's 1-ULP routines) against
    // a wider reference rounded to the dtype: at most 2 ULP apart (1 for the
    // routine, up to 1/2 for the reference's own rounding), special values
    // exact. Inputs span the whole useful range of each function.
    // Under LAZYDAG_VMATH_ISA (ndarray.elementwise.avx2, .sse2) the
    // narrower loops are the ones under test.
    if (const char* cap = std::getenv("LAZYDAG_VMATH_ISA")) {
      const std::string isa = ops::cpu::vector_math_isa();
      CAPTURE(isa);
      if (std::string(cap) == "sse2") CHECK(isa == "sse2");
      if (std::string(cap) == "avx2") CHECK((isa == "avx2" || isa == "sse2"));
    }
    auto ulp32 = [](float a, float b) {
      auto key = [](float f) {
        std::int32_t i = 0;
        std::memcpy(&i, &f, 4);
        return i < 0 ? std::int64_t{INT32_MIN} - i : std::int64_t{i};
      };
      return std::abs(key(a) - key(b));
    };
    auto ulp64 = [](double a, double b) {
      auto key = [](double f) {
        std::int64_t i = 0;
        std::memcpy(&i, &f, 8);
        return i < 0 ? INT64_MIN - i : i;
      };
      std::int64_t d = 0;
      if (__builtin_sub_overflow(key(a), key(b), &d)) return 1e30;
      return std::abs(static_cast<double>(d));
    };
    struct Fn {
      const char* name;
      NDArray (*op)(const NDArray&);
      long double (*ref)(long double);
      double lo;
      double hi;
      bool log_uniform;
    };
    const Fn fns[] = {
        {"exp", nd::exp, [](long double x) { return std::exp(x); }, -100, 100, false},
        {"log", nd::log, [](long double x) { return std::log(x); }, -40, 40, true},
        {"tanh", nd::tanh, [](long double x) { return std::tanh(x); }, -20, 20, false},
        {"sigmoid", nd::sigmoid, [](long double x) { return 1.0L / (1.0L + std::exp(-x)); }, -60, 60, false},
        {"log1p", nd::log1p, [](long double x) { return std::log1p(x); }, -40, 30, true},
    };
    for (const Fn& f : fns) {
      CAPTURE(f.name);
      std::mt19937_64 rng(7);
      std::uniform_real_distribution<double> u(f.lo, f.hi);
      std::vector<double> xs(20000);
      for (double& x : xs) x = f.log_uniform ? std::pow(10.0, u(rng)) : u(rng);
      // every tail length of the vector loops, and the special values
      for (double x : {0.0, -0.0, 1.0, 1e-30, 88.7, -103.9, 709.7, -745.1}) xs.push_back(x);
      // and log1p's negative side, down to -1
      if (std::string(f.name) == "log1p") {
        for (double x = -0.999; x < 0; x += 0.0137) xs.push_back(x);
        xs.push_back(-1.0);
      }
      const std::int64_t n = static_cast<std::int64_t>(xs.size());
      NDArray a64 = nd::array<double>(xs, {n}, cpu());
      NDArray a32 = a64.astype(DType::kFloat32);
      const auto in32 = a32.to_vector<float>();
      const auto got32 = f.op(a32).to_vector<float>();
      const auto got64 = f.op(a64).to_vector<double>();
      double worst32 = 0;
      double worst64 = 0;
      for (std::int64_t i = 0; i < n; ++i) {
        const float want32 = static_cast<float>(f.ref(static_cast<long double>(in32[i])));
        const double want64 = static_cast<double>(f.ref(static_cast<long double>(xs[i])));
        if (std::isfinite(want32) || std::isfinite(got32[i])) {
          worst32 = std::max(worst32, static_cast<double>(ulp32(got32[i], want32)));
        }
        if (std::isfinite(want64) || std::isfinite(got64[i])) worst64 = std::max(worst64, ulp64(got64[i], want64));
      }
      CHECK(worst32 <= 2);
      CHECK(worst64 <= 2);
      // special values
      NDArray sp = nd::array<float>({INFINITY, -INFINITY, NAN}, {3}, cpu());
      const auto s = f.op(sp).to_vector<float>();
      CHECK(std::isnan(s[2]));
      if (std::string(f.name) == "exp") CHECK((s[0] == INFINITY && s[1] == 0.0F));
      if (std::string(f.name) == "tanh") CHECK((s[0] == 1.0F && s[1] == -1.0F));
      if (std::string(f.name) == "sigmoid") CHECK((s[0] == 1.0F && s[1] == 0.0F));
      if (std::string(f.name) == "log") CHECK((s[0] == INFINITY && std::isnan(s[1])));
      if (std::string(f.name) == "log1p") CHECK((s[0] == INFINITY && std::isnan(s[1])));
    }
    // log of 0 and of a negative number
    const auto l = nd::log(nd::array<float>({0.0F, -1.0F}, {2}, cpu())).to_vector<float>();
    CHECK(l[0] == -INFINITY);
    CHECK(std::isnan(l[1]));
    // log1p of -1 and below it
    const auto l1 = nd::log1p(nd::array<float>({-1.0F, -2.0F}, {2}, cpu())).to_vector<float>();
    CHECK(l1[0] == -INFINITY);
    CHECK(std::isnan(l1[1]));
  }

  TEST_CASE("Elementwise.PowIsWithinTwoUlp" * doctest::timeout(120)) {
    // pow on the CPU (SLEEF's 1-ULP vector pow) against a long double
    // reference rounded to the dtype, over bases and exponents that span
    // the finite range of the result, with scalar and array exponents and
    // bases; C99's special values exactly as std::pow gives them.
    auto ulps = [](auto a, auto b) {
      using T = decltype(a);
      using I = std::conditional_t<sizeof(T) == 4, std::int32_t, std::int64_t>;
      auto key = [](T f) {
        I i = 0;
        std::memcpy(&i, &f, sizeof(T));
        return i < 0 ? static_cast<long double>(std::numeric_limits<I>::min()) - i : static_cast<long double>(i);
      };
      return std::fabs(key(a) - key(b));
    };
    auto run = [&](auto zero) {
      using T = decltype(zero);
      const DType t = std::is_same_v<T, float> ? DType::kFloat32 : DType::kFloat64;
      const double max_log = std::is_same_v<T, float> ? 80.0 : 700.0;  // |log(result)| below the overflow
      std::mt19937_64 rng(41);
      std::uniform_real_distribution<double> u(-1, 1);
      std::vector<T> xs;
      std::vector<T> es;
      for (int i = 0; i < 20000; ++i) {
        const double lx = u(rng) * (i % 2 == 0 ? 5 : 40);  // log(x)
        const double e = u(rng) * std::min(60.0, max_log / std::max(std::fabs(lx), 1e-3));
        // negative bases with integer exponents (odd and even)
        const bool neg = i % 7 == 0;
        xs.push_back(static_cast<T>(neg ? -std::exp(lx) : std::exp(lx)));
        es.push_back(static_cast<T>(neg ? std::round(e) : e));
      }
      const auto n = static_cast<std::int64_t>(xs.size());
      NDArray x = nd::array<T>(xs, {n}, cpu());
      NDArray e = nd::array<T>(es, {n}, cpu());
      const auto got = nd::pow(x, e).template to_vector<T>();
      long double worst = 0;
      for (std::size_t i = 0; i < xs.size(); ++i) {
        const T want = static_cast<T>(std::pow(static_cast<long double>(xs[i]), static_cast<long double>(es[i])));
        if (std::isfinite(want)) worst = std::max(worst, ulps(got[i], want));
      }
      CHECK(worst <= 2);
      // A scalar exponent, and a scalar base (2 ** x)
      for (double k : {0.5, 3.0, -1.5, 1.0 / 3}) {
        CAPTURE(k);
        const auto gx = nd::pow(x, k).template to_vector<T>();
        long double w = 0;
        for (std::size_t i = 0; i < xs.size(); ++i) {
          const T want = static_cast<T>(std::pow(static_cast<long double>(xs[i]), static_cast<long double>(T(k))));
          if (std::isfinite(want) || std::isfinite(gx[i])) w = std::max(w, ulps(gx[i], want));
        }
        CHECK(w <= 2);
      }
      NDArray small = e * 0.1;
      const auto gs = nd::pow(nd::full({n}, 2.0, t, cpu()), small).template to_vector<T>();
      const auto vs = small.template to_vector<T>();
      long double ws = 0;
      for (std::size_t i = 0; i < vs.size(); ++i) {
        ws = std::max(ws, ulps(gs[i], static_cast<T>(std::pow(2.0L, static_cast<long double>(vs[i])))));
      }
      CHECK(ws <= 2);
      // special values
      const T inf = std::numeric_limits<T>::infinity();
      const T nan = std::numeric_limits<T>::quiet_NaN();
      const std::vector<std::pair<T, T>> special = {
          {T(0), T(-3)},  {T(-0.0), T(-3)}, {T(0), T(-2)},   {T(-0.0), T(-2.5)}, {T(0), T(3)},   {T(-0.0), T(3)},
          {T(-0.0), T(2.5)}, {T(-1), inf},  {T(-1), -inf},   {T(1), nan},        {nan, T(0)},    {T(-2), T(0.5)},
          {T(0.5), -inf}, {T(2), -inf},     {T(0.5), inf},   {T(2), inf},        {-inf, T(-3)},  {-inf, T(-2)},
          {-inf, T(3)},   {-inf, T(2)},     {inf, T(-1)},    {inf, T(1)},        {T(-2), T(3)},  {nan, T(1)},
          {T(3), nan},    {T(-8), T(1) / T(3)}, {T(0), T(0)}, {inf, T(0)}};
      std::vector<T> sx;
      std::vector<T> se;
      for (const auto& [a, b] : special) {
        sx.push_back(a);
        se.push_back(b);
      }
      const auto m = static_cast<std::int64_t>(sx.size());
      const auto sp = nd::pow(nd::array<T>(sx, {m}, cpu()), nd::array<T>(se, {m}, cpu())).template to_vector<T>();
      for (std::size_t i = 0; i < sx.size(); ++i) {
        CAPTURE(sx[i]);
        CAPTURE(se[i]);
        const T want = std::pow(sx[i], se[i]);
        CHECK((std::memcmp(&sp[i], &want, sizeof(T)) == 0 || (std::isnan(sp[i]) && std::isnan(want))));
      }
    };
    run(0.0F);
    run(0.0);
  }

  TEST_CASE("Elementwise.PowOfTwoIsTheSquare" * doctest::timeout(60)) {
    // An exponent of exactly 2 gives x * x, bit for bit, whether it is a
    // scalar (the square loop), a broadcast one-element array, a dense
    // array or a step of a fused chain; other exponents are SLEEF's pow
    // (Elementwise.PowIsWithinTwoUlp), the same bits on every path.
    auto run = [](auto zero) {
      using T = decltype(zero);
      const DType t = std::is_same_v<T, float> ? DType::kFloat32 : DType::kFloat64;
      std::mt19937_64 rng(31);
      std::uniform_real_distribution<double> mag(-40, 40);
      std::vector<T> xs;
      for (int i = 0; i < 3000; ++i) {
        const double v = std::pow(10.0, mag(rng)) * ((rng() & 1) != 0 ? -1 : 1);
        xs.push_back(static_cast<T>(v));
      }
      for (T v : {T(0), T(-0.0), std::numeric_limits<T>::infinity(), -std::numeric_limits<T>::infinity(),
                  std::numeric_limits<T>::quiet_NaN(), std::numeric_limits<T>::denorm_min(),
                  std::numeric_limits<T>::max(), T(1), T(-1), T(3)}) {
        xs.push_back(v);
      }
      const auto n = static_cast<std::int64_t>(xs.size());
      NDArray x = nd::array<T>(xs, {n});  // on the default device (sim under ndarray.*.sim)
      std::vector<T> exps(xs.size());
      for (std::size_t i = 0; i < exps.size(); ++i) exps[i] = i % 3 == 0 ? T(2) : static_cast<T>(0.25 * (i % 11));
      NDArray e = nd::array<T>(exps, {n});
      const auto scalar = nd::pow(x, 2.0).template to_vector<T>();
      const auto one = nd::pow(x, nd::full({1}, 2.0, t)).template to_vector<T>();
      const auto fused = nd::pow(x * 1.0, 2.0).template to_vector<T>();
      const auto mixed = nd::pow(x, e).template to_vector<T>();
      const auto mixed_fused = nd::pow(x * 1.0, e + 0.0).template to_vector<T>();
      const auto mixed_strided =
          nd::pow(x.reshape({1, n}).transpose(), e.reshape({1, n}).transpose()).reshape({n}).template to_vector<T>();
      auto same_bits = [](T a, T b) { return std::memcmp(&a, &b, sizeof(T)) == 0 || (std::isnan(a) && std::isnan(b)); };
      int wrong = 0;
      for (std::size_t i = 0; i < xs.size(); ++i) {
        const T sq = xs[i] * xs[i];
        if (!same_bits(scalar[i], sq) || !same_bits(one[i], sq) || !same_bits(fused[i], sq) ||
            (exps[i] == T(2) && !same_bits(mixed[i], sq)) || !same_bits(mixed_fused[i], mixed[i]) ||
            !same_bits(mixed_strided[i], mixed[i])) {
          ++wrong;
        }
      }
      CHECK(wrong == 0);
      CHECK(nd::pow(x, 2.0).dtype() == t);
    };
    run(0.0F);
    run(0.0);
  }

  TEST_CASE("Elementwise.ScalarOperandsTakeTheArrayDtype" * doctest::timeout(60)) {
    for (DType t : numeric_dtypes()) {
      CAPTURE(to_string(t));
      NDArray a = random_array({6, 7}, t, 11, 1, 40);
      const auto va = values(a);
      auto check = [&](const NDArray& got, const std::function<double(double)>& f) {
        CHECK(got.dtype() == t);
        std::vector<double> want;
        for (double x : va) {
          double r = f(x);
          want.push_back(is_integral(t) ? std::trunc(r) : r);
        }
        check_close(values(got), want, tolerance(t));
      };
      check(a + 3.0, [](double x) { return x + 3; });
      check(3.0 - a, [](double x) { return 3 - x; });
      check(a * 2.0, [](double x) { return x * 2; });
      check(a / 4.0, [](double x) { return x / 4; });
      check(100.0 / a, [](double x) { return 100 / x; });
      check(-a, [](double x) { return -x; });
    }
  }

  TEST_CASE("Elementwise.UnaryOpsMatchReference" * doctest::timeout(60)) {
    struct U {
      const char* name;
      NDArray (*op)(const NDArray&);
      double (*ref)(double);
      bool floats_only;
      double lo;
      double hi;
    };
    const U cases[] = {
        {"neg", nd::neg, [](double x) { return -x; }, false, -5, 5},
        {"abs", nd::abs, [](double x) { return std::abs(x); }, false, -5, 5},
        {"relu", nd::relu, [](double x) { return x > 0 ? x : 0.0; }, false, -5, 5},
        {"exp", nd::exp, [](double x) { return std::exp(x); }, true, -5, 5},
        {"log", nd::log, [](double x) { return std::log(x); }, true, 0.01, 5},
        {"log1p", nd::log1p, [](double x) { return std::log1p(x); }, true, -0.99, 5},
        {"sqrt", nd::sqrt, [](double x) { return std::sqrt(x); }, true, 0, 5},
        {"tanh", nd::tanh, [](double x) { return std::tanh(x); }, true, -5, 5},
        {"sigmoid", nd::sigmoid, [](double x) { return 1.0 / (1.0 + std::exp(-x)); }, true, -8, 8},
    };
    for (const auto& u : cases) {
      for (DType t : numeric_dtypes()) {
        CAPTURE(u.name);
        CAPTURE(to_string(t));
        if (u.floats_only && !is_floating(t)) {
          CHECK_THROWS_AS((void)u.op(nd::ones({2}, t)), InvalidArgument);
          continue;
        }
        for (const Shape& s : {Shape{}, Shape{0}, Shape{3, 5}, Shape{50000}}) {
          NDArray a = random_array(s, t, 21, u.lo, u.hi);
          std::vector<double> want;
          for (double x : values(a)) want.push_back(u.ref(x));
          NDArray r = u.op(a);
          CHECK(r.shape() == s);
          check_close(values(r), want, tolerance(t) * 4);
        }
      }
    }
  }

  TEST_CASE("Elementwise.ComparisonsAndWhere" * doctest::timeout(60)) {
    for (DType t : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64, DType::kBool}) {
      CAPTURE(to_string(t));
      NDArray a = random_array({4, 5}, t, 5, -3, 3);
      NDArray b = random_array({5}, t, 6, -3, 3);
      const auto va = values(a);
      const auto vb = values(b);
      const Shape out{4, 5};
      auto check = [&](const NDArray& got, const std::function<bool(double, double)>& f) {
        CHECK(got.dtype() == DType::kBool);
        std::vector<double> want;
        for (std::int64_t i = 0; i < 20; ++i) {
          want.push_back(f(va[broadcast_index(out, {4, 5}, i)], vb[broadcast_index(out, {5}, i)]) ? 1 : 0);
        }
        check_close(values(got), want, 0);
      };
      check(a == b, std::equal_to<>());
      check(a != b, std::not_equal_to<>());
      check(a < b, std::less<>());
      check(a <= b, std::less_equal<>());
      check(a > b, std::greater<>());
      check(a >= b, std::greater_equal<>());
      // where picks from broadcast operands
      NDArray w = nd::where(a > b, a, nd::full({1}, 0.0, t));
      std::vector<double> want;
      for (std::int64_t i = 0; i < 20; ++i) {
        const double x = va[i];
        want.push_back(x > vb[i % 5] ? x : 0.0);
      }
      check_close(values(w), want, 0);
    }
    NDArray x = nd::arange(0, 10, 1, DType::kInt32);
    CHECK(values(x < 4.5) == std::vector<double>{1, 1, 1, 1, 1, 0, 0, 0, 0, 0});
  }

  TEST_CASE("Elementwise.AstypeConverts" * doctest::timeout(60)) {
    NDArray a = nd::array<double>({-2.7, -0.5, 0.0, 0.5, 3.9}, {5});
    CHECK(a.astype(DType::kInt32).to_vector<std::int32_t>() == std::vector<std::int32_t>{-2, 0, 0, 0, 3});
    CHECK(a.astype(DType::kBool).to_vector<bool>() == std::vector<bool>{true, true, false, true, true});
    CHECK(a.astype(DType::kFloat32).to_vector<float>() ==
          std::vector<float>{-2.7F, -0.5F, 0.0F, 0.5F, 3.9F});
    NDArray b = nd::array<bool>({true, false}, {2});
    CHECK(b.astype(DType::kInt64).to_vector<std::int64_t>() == std::vector<std::int64_t>{1, 0});
  }

  TEST_CASE("Elementwise.InPlaceOpsAreRecordedWrites" * doctest::timeout(60)) {
    for (DType t : numeric_dtypes()) {
      CAPTURE(to_string(t));
      NDArray a = random_array({3, 4}, t, 31, -20, 20);
      NDArray b = random_array({4}, t, 32, 1, 20);
      const auto va = values(a);
      const auto vb = values(b);
      NDArray before = a.copy();  // recorded before the writes: sees the old values
      NDArray alias = a;          // a handle copy shares the storage
      a += b;
      a *= 2.0;
      a -= b;
      std::vector<double> want;
      for (int i = 0; i < 12; ++i) want.push_back((va[i] + vb[i % 4]) * 2 - vb[i % 4]);
      check_close(values(alias), want, tolerance(t));
      check_close(values(before), va, 0);
      NDArray c = alias.copy();
      c /= b;
      std::vector<double> wq;
      for (int i = 0; i < 12; ++i) {
        double q = want[i] / vb[i % 4];
        wq.push_back(is_integral(t) ? std::trunc(q) : q);
      }
      check_close(values(c), wq, tolerance(t));
    }
  }

  TEST_CASE("Elementwise.WritesThroughViewsAreOrderedWithReadsOfTheBase" * doctest::timeout(60)) {
    NDArray base = nd::zeros({4, 6}, DType::kFloat64);
    NDArray row = base.slice(0, 1, 2);        // a view of row 1
    NDArray col = base.transpose().slice(0, 2, 3);  // a view of column 2
    NDArray snapshot0 = base.sum();           // recorded before any write
    row += 1.0;
    NDArray snapshot1 = base.sum();           // after the row write
    col += nd::full({1, 4}, 10.0, DType::kFloat64);
    NDArray snapshot2 = base.sum();
    CHECK(snapshot0.item<double>() == 0.0);
    CHECK(snapshot1.item<double>() == 6.0);
    CHECK(snapshot2.item<double>() == 46.0);
    auto v = base.to_vector<double>();
    CHECK(v[1 * 6 + 2] == 11.0);
    CHECK(v[0 * 6 + 2] == 10.0);
    CHECK(v[1 * 6 + 0] == 1.0);
    // a += a.T reads what it writes through another view: a copy is taken first
    NDArray sq = nd::array<double>({1, 2, 3, 4}, {2, 2});
    sq += sq.transpose();
    CHECK(sq.to_vector<double>() == std::vector<double>{2, 5, 5, 8});
  }

  TEST_CASE("Elementwise.IntegerDivisionByZeroFailsTheOpOnHostDevicesAndGivesZeroOnAGpu" *
            doctest::timeout(60)) {
    NDArray a = nd::array<std::int32_t>({1, 2, 3}, {3});
    NDArray z = nd::array<std::int32_t>({1, 0, 1}, {3});
    NDArray q = a / z;
    if (a.device().kind == DeviceKind::kGpu) {
      // A kernel cannot throw: the GPU gives 0 (docs/devices.md).
      CHECK(q.to_vector<std::int32_t>() == std::vector<std::int32_t>{1, 0, 3});
    } else {
      // cpu and sim run the CPU kernels, which report it.
      CHECK_THROWS_AS(q.wait_to_read(), OpError);
    }
    NDArray fine = a + 1.0;  // the engine is unaffected
    CHECK(fine.to_vector<std::int32_t>() == std::vector<std::int32_t>{2, 3, 4});
  }
}

TEST_CASE("elementwise math methods are the free functions") {
  NDArray x = random_array({5, 7}, DType::kFloat64, 21, 0.1, 3.0);
  NDArray n = random_array({5, 7}, DType::kInt32, 22);
  CHECK(values(n.abs()) == values(nd::abs(n)));
  CHECK(values(x.abs()) == values(nd::abs(x)));
  CHECK(values(x.exp()) == values(nd::exp(x)));
  CHECK(values(x.log()) == values(nd::log(x)));
  CHECK(values(x.log1p()) == values(nd::log1p(x)));
  CHECK(values(x.sqrt()) == values(nd::sqrt(x)));
  CHECK(values(x.tanh()) == values(nd::tanh(x)));
  CHECK(values(x.sigmoid()) == values(nd::sigmoid(x)));
  CHECK(values((x - 1.0).relu()) == values(nd::relu(x - 1.0)));
  const auto a = values(n);
  const auto got = values(n.abs());
  for (std::size_t i = 0; i < a.size(); ++i) CHECK(got[i] == std::abs(a[i]));
}
