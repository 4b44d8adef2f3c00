// Autograd: every differentiable op's gradient against central finite
// differences on random float64 inputs, and the semantics around it
// (accumulation, retain_graph, grad mode, detach, the in-place version
// check, release of saved arrays, asynchronous backward).
#include "reference.hpp"

#include <array>
#include <lazydag/autograd.hpp>
#include <lazydag/nn.hpp>

#include <atomic>
#include <cmath>
#include <functional>
#include <random>
#include <string>

using namespace lazydag;
using namespace lazydag::test;

namespace {

using Fn = std::function<NDArray(const std::vector<NDArray>&)>;

struct Input {
  Shape shape;
  double lo = -2.0;
  double hi = 2.0;
};

std::vector<double> uniform_values(std::int64_t n, double lo, double hi, std::uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = u(rng);
  return v;
}

// The scalar sum(f(xs) * w) for fixed random weights w: every output
// element's gradient is exercised, each with its own weight.
double weighted(const NDArray& out, const std::vector<double>& w) {
  const auto v = out.astype(DType::kFloat64).to_vector<double>();
  double s = 0;
  for (std::size_t i = 0; i < v.size(); ++i) s += v[i] * w[i];
  return s;
}

// backward() of sum(f(xs) * w) against (L(x + h) - L(x - h)) / 2h per element.
void check_gradient(const char* name, const Fn& f, const std::vector<Input>& inputs, std::uint32_t seed = 7) {
  const std::string op = name;
  CAPTURE(op);
  std::vector<std::vector<double>> values;
  std::vector<NDArray> xs;
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    values.push_back(uniform_values(numel(inputs[i].shape), inputs[i].lo, inputs[i].hi,
                                    seed + static_cast<std::uint32_t>(i) * 101));
    xs.push_back(nd::array(values.back(), inputs[i].shape));
    xs.back().requires_grad(true);
  }
  const NDArray out = f(xs);
  REQUIRE(out.requires_grad());
  const auto w = uniform_values(out.size(), 0.5, 1.5, seed + 999);
  const NDArray weights = nd::array(w, out.shape(), out.device()).astype(out.dtype());
  (out * weights).sum().backward();
  const double h = 1e-6;
  for (std::size_t i = 0; i < xs.size(); ++i) {
    CAPTURE(i);
    const NDArray g = xs[i].grad();
    REQUIRE(g.valid());
    CHECK(g.shape() == inputs[i].shape);
    const auto got = g.to_vector<double>();
    autograd::NoGradGuard no_grad;
    for (std::size_t j = 0; j < values[i].size(); ++j) {
      auto at = [&](double delta) {
        std::vector<NDArray> ys = xs;
        auto v = values[i];
        v[j] += delta;
        ys[i] = nd::array(v, inputs[i].shape);
        return weighted(f(ys), w);
      };
      const double want = (at(h) - at(-h)) / (2 * h);
      CAPTURE(j);
      CHECK(got[j] == doctest::Approx(want).epsilon(1e-5).scale(1.0));
    }
  }
}

NDArray positive(const NDArray& x) { return nd::abs(x) + 0.5; }

// Everything recorded has run, including anything recorded while the first
// waitall released the ops that held the arrays.
void settle() {
  nd::waitall();
  nd::waitall();
}

}  // namespace

TEST_CASE("elementwise gradients with broadcasting match finite differences") {
  check_gradient("add", [](auto& x) { return x[0] + x[1]; }, {{{3, 1}}, {{4}}});
  check_gradient("sub", [](auto& x) { return x[0] - x[1]; }, {{{2, 3}}, {{3}}});
  check_gradient("mul", [](auto& x) { return x[0] * x[1]; }, {{{2, 1, 3}}, {{4, 1}}});
  check_gradient("div", [](auto& x) { return x[0] / x[1]; }, {{{3, 2}}, {{2}, 0.5, 2.0}});
  check_gradient("pow", [](auto& x) { return nd::pow(x[0], x[1]); }, {{{5}, 0.5, 2.0}, {{5}, -1.5, 1.5}});
  check_gradient("maximum", [](auto& x) { return nd::maximum(x[0], x[1]); }, {{{4, 3}}, {{4, 3}}});
  check_gradient("minimum", [](auto& x) { return nd::minimum(x[0], x[1]); }, {{{4, 3}}, {{3}}});
  check_gradient("same input twice", [](auto& x) { return x[0] * x[0] + x[0]; }, {{{6}}});
  check_gradient("rank 0", [](auto& x) { return x[0] * x[1]; }, {{{}}, {{3, 2}}});
}

TEST_CASE("scalar gradients match finite differences") {
  check_gradient("a + s", [](auto& x) { return x[0] + 3.0; }, {{{5}}});
  check_gradient("s - a", [](auto& x) { return 3.0 - x[0]; }, {{{5}}});
  check_gradient("a - s", [](auto& x) { return x[0] - 3.0; }, {{{5}}});
  check_gradient("a * s", [](auto& x) { return x[0] * -2.5; }, {{{5}}});
  check_gradient("a / s", [](auto& x) { return x[0] / 4.0; }, {{{5}}});
  check_gradient("s / a", [](auto& x) { return 2.0 / x[0]; }, {{{5}, 0.5, 2.0}});
  check_gradient("a ^ s", [](auto& x) { return nd::pow(x[0], 2.5); }, {{{5}, 0.5, 2.0}});
  check_gradient("maximum(a, s)", [](auto& x) { return nd::maximum(x[0], 0.1); }, {{{8}}});
  check_gradient("minimum(a, s)", [](auto& x) { return nd::minimum(x[0], 0.1); }, {{{8}}});
  check_gradient("clip", [](auto& x) { return nd::clip(x[0], -1.0, 1.0); }, {{{10}}});
}

TEST_CASE("unary gradients match finite differences") {
  check_gradient("neg", [](auto& x) { return -x[0]; }, {{{4}}});
  check_gradient("abs", [](auto& x) { return nd::abs(x[0]); }, {{{6}, 0.1, 2.0}});
  check_gradient("abs negative", [](auto& x) { return nd::abs(x[0]); }, {{{6}, -2.0, -0.1}});
  check_gradient("exp", [](auto& x) { return nd::exp(x[0]); }, {{{2, 3}}});
  check_gradient("log", [](auto& x) { return nd::log(x[0]); }, {{{2, 3}, 0.5, 3.0}});
  check_gradient("log1p", [](auto& x) { return nd::log1p(x[0]); }, {{{2, 3}, -0.5, 3.0}});
  check_gradient("sqrt", [](auto& x) { return nd::sqrt(x[0]); }, {{{2, 3}, 0.5, 3.0}});
  check_gradient("tanh", [](auto& x) { return nd::tanh(x[0]); }, {{{7}}});
  check_gradient("sigmoid", [](auto& x) { return nd::sigmoid(x[0]); }, {{{7}}});
  check_gradient("relu", [](auto& x) { return nd::relu(x[0]); }, {{{9}}});
  check_gradient("chain", [](auto& x) { return nd::tanh(nd::exp(x[0]) * x[0]) / positive(x[0]); }, {{{5}}});
}

TEST_CASE("reduction gradients match finite differences") {
  check_gradient("sum", [](auto& x) { return x[0].sum(); }, {{{3, 4}}});
  check_gradient("sum axis", [](auto& x) { return x[0].sum(1); }, {{{3, 4}}});
  check_gradient("sum axis keepdims", [](auto& x) { return x[0].sum(0, true); }, {{{3, 4}}});
  check_gradient("mean", [](auto& x) { return x[0].mean(); }, {{{3, 4}}});
  check_gradient("mean axis", [](auto& x) { return x[0].mean(-1); }, {{{2, 3, 4}}});
  check_gradient("max", [](auto& x) { return x[0].max(); }, {{{3, 4}}});
  check_gradient("max axis", [](auto& x) { return x[0].max(1); }, {{{3, 4}}});
  check_gradient("min axis keepdims", [](auto& x) { return x[0].min(0, true); }, {{{3, 4}}});
}

TEST_CASE("views, copies and structure ops pass gradients through") {
  check_gradient("reshape", [](auto& x) { return x[0].reshape({3, 4}) * x[1]; }, {{{2, 6}}, {{4}}});
  check_gradient("transpose", [](auto& x) { return x[0].transpose() * x[1]; }, {{{3, 2}}, {{3}}});
  check_gradient("transpose perm", [](auto& x) { return x[0].transpose({2, 0, 1}) * x[1]; },
                 {{{2, 3, 4}}, {{3}}});
  check_gradient("slice", [](auto& x) { return nd::exp(x[0].slice(1, 1, 3)); }, {{{3, 4}}});
  check_gradient("slice of slice", [](auto& x) { return x[0].slice(0, 1, 3).slice(1, -2, -1) * 3.0; },
                 {{{4, 5}}});
  check_gradient("copy", [](auto& x) { return x[0].copy() * x[0]; }, {{{5}}});
  check_gradient("broadcast_to", [](auto& x) { return nd::broadcast_to(x[0], {3, 2, 4}); }, {{{2, 1}}});
  check_gradient("concat", [](auto& x) { return nd::concat({x[0], x[1] * 2.0, x[0]}, 1); },
                 {{{2, 3}}, {{2, 1}}});
  check_gradient("where", [](auto& x) { return nd::where(x[0] > 0.0, x[0] * x[1], x[1]); },
                 {{{3, 4}}, {{4}}});
  check_gradient("copyto", [](auto& x) { return x[0].copyto(cpu(1)).copyto(x[0].device()) * x[0]; },
                 {{{4}}});
}

TEST_CASE("relu's mask comes from its result: NaN and zeros of either sign pass no gradient") {
  NDArray x = nd::array<double>({-1.0, -0.0, 0.0, 2.0, std::nan(""), 3.0}, {6});
  x.requires_grad(true);
  NDArray h = nd::relu(x);
  h.sum().backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{0, 0, 0, 1, 0, 1});
  // Its result is saved, so writing it in place before backward is refused,
  // as in PyTorch; writing x is not.
  NDArray y = nd::random_normal({4}, default_device(), 5, 0.0, 1.0, DType::kFloat64);
  y.requires_grad(true);
  NDArray r = nd::relu(y);
  r += 1.0;
  CHECK_THROWS_AS(r.sum().backward(), InvalidArgument);
  NDArray z = nd::random_normal({4}, default_device(), 6, 0.0, 1.0, DType::kFloat64);
  z.requires_grad(true);
  NDArray q = nd::relu(z);
  z.detach() += 1.0;
  CHECK_NOTHROW(q.sum().backward());
}

TEST_CASE("matmul gradients, 2-D and batched") {
  check_gradient("matmul", [](auto& x) { return nd::matmul(x[0], x[1]); }, {{{3, 4}}, {{4, 2}}});
  check_gradient("matmul of views", [](auto& x) { return nd::matmul(x[0].transpose(), x[1]); },
                 {{{4, 3}}, {{4, 2}}});
  check_gradient("batched", [](auto& x) { return nd::matmul(x[0], x[1]); }, {{{2, 3, 4}}, {{2, 4, 2}}});
  check_gradient("mlp", [](auto& x) { return nd::tanh(nd::matmul(x[0], x[1]) + x[2]); },
                 {{{5, 3}}, {{3, 4}}, {{4}}});
}

TEST_CASE("softmax, logsumexp and the losses: values and gradients") {
  check_gradient("softmax", [](auto& x) { return nd::softmax(x[0], 1); }, {{{3, 4}}});
  check_gradient("log_softmax", [](auto& x) { return nd::log_softmax(x[0]); }, {{{3, 4}}});
  check_gradient("logsumexp", [](auto& x) { return nd::logsumexp(x[0], 0); }, {{{3, 4}}});
  const NDArray labels = nd::array(std::vector<std::int64_t>{2, 0, 3}, {3});
  check_gradient("cross_entropy", [&](auto& x) { return nd::cross_entropy(x[0], labels.as_in_device(x[0].device())); },
                 {{{3, 4}}});
  check_gradient("cross_entropy, smoothed",
                 [&](auto& x) { return nd::cross_entropy(x[0], labels.as_in_device(x[0].device()), 0.3); },
                 {{{3, 4}}});
  check_gradient("mse_loss", [](auto& x) { return nd::mse_loss(x[0], x[1]); }, {{{2, 3}}, {{2, 3}}});

  // Values against a double-precision reference, with large logits that
  // overflow exp() unless the maximum is subtracted.
  const std::vector<double> v = {1000.0, 1001.0, 999.0, -3.0, 0.5, 2.0};
  const NDArray x = nd::array(v, {2, 3});
  const auto lse = nd::logsumexp(x, 1).to_vector<double>();
  const auto sm = nd::softmax(x, 1).to_vector<double>();
  for (int r = 0; r < 2; ++r) {
    const double m = std::max({v[r * 3], v[r * 3 + 1], v[r * 3 + 2]});
    double s = 0;
    for (int c = 0; c < 3; ++c) s += std::exp(v[r * 3 + c] - m);
    CHECK(lse[r] == doctest::Approx(m + std::log(s)).epsilon(1e-12));
    for (int c = 0; c < 3; ++c) CHECK(sm[r * 3 + c] == doctest::Approx(std::exp(v[r * 3 + c] - m) / s));
  }
  const NDArray logits = nd::array(std::vector<double>{2.0, 1.0, 0.1, 0.5, 2.5, 0.3}, {2, 3});
  const NDArray y = nd::array(std::vector<std::int32_t>{0, 1}, {2});
  const double ce = nd::cross_entropy(logits, y).item<double>();
  auto nll = [](double a, double b, double c, double pick) { return std::log(std::exp(a) + std::exp(b) + std::exp(c)) - pick; };
  CHECK(ce == doctest::Approx((nll(2.0, 1.0, 0.1, 2.0) + nll(0.5, 2.5, 0.3, 2.5)) / 2));
  // Smoothed targets: 1 - e on the label and e / C on every class.
  auto smoothed = [&](double a, double b, double c, double pick, double e) {
    return (1 - e) * nll(a, b, c, pick) + e / 3 * (nll(a, b, c, a) + nll(a, b, c, b) + nll(a, b, c, c));
  };
  CHECK(nd::cross_entropy(logits, y, 0.4).item<double>() ==
        doctest::Approx((smoothed(2.0, 1.0, 0.1, 2.0, 0.4) + smoothed(0.5, 2.5, 0.3, 2.5, 0.4)) / 2).epsilon(1e-12));
  CHECK(nd::cross_entropy(logits, y, 0.0).item<double>() == ce);
  CHECK_THROWS_AS((void)nd::cross_entropy(logits, y, 1.5), InvalidArgument);
  CHECK_THROWS_AS((void)nd::cross_entropy(logits, y, -0.1), InvalidArgument);
  CHECK(nd::one_hot(y, 3).to_vector<float>() == std::vector<float>{1, 0, 0, 0, 1, 0});
  CHECK_THROWS_AS((void)nd::one_hot(logits, 3), InvalidArgument);
  CHECK_THROWS_AS(nd::cross_entropy(logits, nd::array(std::vector<std::int32_t>{0, 3}, {2})).wait_to_read(), OpError);
  // float32 logits: the same value, to float precision
  CHECK(nd::cross_entropy(logits.astype(DType::kFloat32), y).item<float>() == doctest::Approx(ce).epsilon(1e-6));
  CHECK_THROWS_AS((void)nd::cross_entropy(logits, nd::array(std::vector<std::int64_t>{0}, {1})), InvalidArgument);
}

TEST_CASE("gradients accumulate until zero_grad; retain_graph allows a second backward") {
  NDArray w = nd::array(std::vector<double>{1, 2, 3}, {3});
  w.requires_grad(true);
  CHECK(w.is_leaf());
  CHECK_FALSE(w.grad().valid());
  NDArray loss = (w * w).sum();
  CHECK_FALSE(loss.is_leaf());
  loss.backward({}, /*retain_graph=*/true);
  CHECK(w.grad().to_vector<double>() == std::vector<double>{2, 4, 6});
  loss.backward();
  CHECK(w.grad().to_vector<double>() == std::vector<double>{4, 8, 12});
  // The saved arrays are gone now: a third backward is refused, naming the op.
  try {
    loss.backward();
    FAIL("a backward through released saved arrays was accepted");
  } catch (const InvalidArgument& e) {
    CHECK(std::string(e.what()).find("retain_graph") != std::string::npos);
  }
  CHECK(w.grad().to_vector<double>() == std::vector<double>{4, 8, 12});
  w.zero_grad();
  CHECK_FALSE(w.grad().valid());
  (w * 3.0).sum().backward();
  CHECK(w.grad().to_vector<double>() == std::vector<double>{3, 3, 3});
  // an explicit output gradient
  w.zero_grad();
  (w * 2.0).backward(nd::array(std::vector<double>{1, 10, 100}, {3}));
  CHECK(w.grad().to_vector<double>() == std::vector<double>{2, 20, 200});
  // the leaf itself
  w.zero_grad();
  w.backward(nd::array(std::vector<double>{5, 6, 7}, {3}));
  CHECK(w.grad().to_vector<double>() == std::vector<double>{5, 6, 7});
}

TEST_CASE("two leaves given one gradient array do not share it") {
  NDArray a = nd::array(std::vector<double>{1, 2}, {2});
  NDArray b = nd::array(std::vector<double>{3, 4}, {2});
  a.requires_grad(true);
  b.requires_grad(true);
  (a + b).sum().backward();
  CHECK_FALSE(a.grad().shares_storage_with(b.grad()));
  {
    autograd::NoGradGuard no_grad;
    NDArray ga = a.grad();
    ga *= 5.0;
  }
  CHECK(a.grad().to_vector<double>() == std::vector<double>{5, 5});
  CHECK(b.grad().to_vector<double>() == std::vector<double>{1, 1});
}

TEST_CASE("leaves' gradients share no buffer with the caller's seed or with each other") {
  NDArray a = nd::array(std::vector<double>{1, 2}, {2});
  NDArray b = nd::array(std::vector<double>{3, 4}, {2});
  a.requires_grad(true);
  b.requires_grad(true);
  NDArray seed = nd::array(std::vector<double>{2, 3}, {2});
  (a + b).backward(seed);  // the sum's derivative passes the seed itself on
  CHECK_FALSE(a.grad().shares_storage_with(seed));
  CHECK_FALSE(b.grad().shares_storage_with(seed));
  CHECK_FALSE(a.grad().shares_storage_with(b.grad()));
  seed *= 10.0;
  CHECK(a.grad().to_vector<double>() == std::vector<double>{2, 3});
  CHECK(b.grad().to_vector<double>() == std::vector<double>{2, 3});
  // A gradient the walk made and passed on through a chain of identities to
  // two leaves and a non-leaf (concat's derivative gives views of one buffer).
  NDArray c = nd::array(std::vector<double>{5, 6}, {2});
  c.requires_grad(true);
  a.zero_grad();
  b.zero_grad();
  NDArray y = nd::concat({a, b * 1.0, c}, 0);
  (y * 2.0).sum().backward();
  CHECK_FALSE(a.grad().shares_storage_with(c.grad()));
  CHECK_FALSE(b.grad().shares_storage_with(c.grad()));
  CHECK_FALSE(a.grad().shares_storage_with(b.grad()));
  {
    autograd::NoGradGuard no_grad;
    NDArray ga = a.grad();
    ga *= 5.0;
  }
  CHECK(a.grad().to_vector<double>() == std::vector<double>{10, 10});
  CHECK(b.grad().to_vector<double>() == std::vector<double>{2, 2});
  CHECK(c.grad().to_vector<double>() == std::vector<double>{2, 2});
}

TEST_CASE("grad mode, detach and what carries no gradient") {
  NDArray w = nd::array(std::vector<double>{1, 2}, {2});
  w.requires_grad(true);
  {
    autograd::NoGradGuard no_grad;
    CHECK_FALSE(autograd::is_grad_enabled());
    NDArray y = w * 2.0;
    CHECK_FALSE(y.requires_grad());
    w -= 1.0;  // an optimizer step: allowed under the guard
    {
      autograd::NoGradGuard nested;
    }
    CHECK_FALSE(autograd::is_grad_enabled());
  }
  CHECK(autograd::is_grad_enabled());
  CHECK(w.to_vector<double>() == std::vector<double>{0, 1});
  CHECK_THROWS_AS(w -= 1.0, InvalidArgument);
  CHECK_THROWS_AS(w.assign(nd::zeros({2}, DType::kFloat64, w.device())), InvalidArgument);
  NDArray y = w * 3.0;
  CHECK_THROWS_AS(w.slice(0, 0, 1) += 1.0, InvalidArgument);  // a view of a leaf that requires grad
  CHECK_THROWS_AS(y.requires_grad(false), InvalidArgument);

  NDArray d = w.detach();
  CHECK(d.shares_storage_with(w));
  CHECK_FALSE(d.requires_grad());
  (d * w).sum().backward();  // the detached factor is a constant
  CHECK(w.grad().to_vector<double>() == std::vector<double>{0, 1});

  CHECK_THROWS_AS(nd::zeros({2}, DType::kInt64).requires_grad(true), InvalidArgument);
  CHECK_FALSE((w > 0.5).requires_grad());
  CHECK_FALSE(w.argmax().requires_grad());
  CHECK_THROWS_AS((w * 2.0).backward(), InvalidArgument);  // two elements: gradient needed
  CHECK_THROWS_AS(nd::ones({1}).backward(), InvalidArgument);
  CHECK_THROWS_AS((w * 2.0).backward(nd::ones({3}, DType::kFloat64, w.device())), InvalidArgument);
  CHECK_THROWS_AS((w * 2.0).backward(nd::ones({2}, DType::kFloat32, w.device())), InvalidArgument);
  w.requires_grad(false);
  CHECK_FALSE((w * 2.0).requires_grad());
}

TEST_CASE("in-place ops on arrays in the gradient graph match finite differences") {
  // Each in-place form of the DSL on a result of a differentiable op (and
  // on an array that required no grad until a source that does was added
  // in), with broadcasting; the operands the derivative needs are the
  // values before each write.
  check_gradient("in-place chain", [](const std::vector<NDArray>& x) {
    NDArray y = x[0] * 2.0;
    y += x[1];        // broadcast row
    y *= x[0];        // needs y's old values for x[0]'s gradient
    y -= 0.5;
    y /= x[1] * x[1] + 1.0;
    y *= 3.0;
    NDArray acc = nd::zeros({3, 4}, DType::kFloat64, x[0].device());
    acc += y;          // acc required no grad before: it joins the graph
    acc += acc;        // reads what it writes
    return acc;
  }, {{{3, 4}}, {{4}}});
  check_gradient("assign", [](const std::vector<NDArray>& x) {
    NDArray y = x[0] * 3.0;   // (exp would save y for its derivative: the write would be refused)
    NDArray keep = y + x[0];  // reads y before the write (a sum saves nothing)
    y.assign(x[1] * 2.0);     // broadcast: the gradient is summed back to x[1]'s shape
    return y * keep;
  }, {{{2, 3}}, {{3}}});
}

TEST_CASE("a handle made before an in-place write with a gradient is refused by backward") {
  NDArray x = nd::array(std::vector<double>{1, 2, 3, 4}, {4});
  x.requires_grad(true);
  NDArray y = x * 2.0;
  NDArray before = y.slice(0, 0, 2);
  NDArray early = (before * 1.0).sum();  // read before the write: fine
  y += 1.0;
  NDArray late = (before * 1.0).sum();  // read after it through the old handle
  const auto recorded = nd::engine().stats().nodes_recorded;
  try {
    late.backward();
    FAIL("backward routed a gradient through a stale view");
  } catch (const InvalidArgument& e) {
    CHECK(std::string(e.what()).find("written in place") != std::string::npos);
  }
  CHECK(nd::engine().stats().nodes_recorded == recorded);  // refused before recording
  CHECK_FALSE(x.grad().valid());
  early.backward(NDArray(), /*retain_graph=*/true);  // y's history before the write is used again below
  CHECK(x.grad().to_vector<double>() == std::vector<double>{2, 2, 0, 0});
  x.zero_grad();
  (y.slice(0, 0, 2) * 1.0).sum().backward(NDArray(), true);  // a view made after the write
  CHECK(x.grad().to_vector<double>() == std::vector<double>{2, 2, 0, 0});
  // A write through a view stales the other handles of the buffer too.
  NDArray first = y.slice(0, 0, 1);
  y.slice(0, 2, 4) *= x.slice(0, 2, 4);
  CHECK_THROWS_AS((first * 1.0).sum().backward(), InvalidArgument);
  // A slot of an array outside the graph joins it through its base (as in
  // PyTorch); the values are those after the write.
  NDArray log = nd::zeros({3}, DType::kFloat64, x.device());
  log.slice(0, 0, 1).assign((y.slice(0, 0, 2) * 1.0).sum().reshape({1}));
  CHECK(log.requires_grad());
  CHECK(log.to_vector<double>()[0] == doctest::Approx(8.0));  // (2 + 1) + (4 + 1)
  x.zero_grad();
  (log * 2.0).sum().backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{4, 4, 0, 0});
  // A view of a leaf that requires grad is refused at the call site,
  // recording nothing.
  const auto before_view = nd::engine().stats().nodes_recorded;
  CHECK_THROWS_AS(x.slice(0, 1, 3) *= y.slice(0, 1, 3), InvalidArgument);
  CHECK_THROWS_AS(x.reshape({2, 2}).transpose().slice(0, 0, 1).assign(y.slice(0, 0, 2).reshape({1, 2})),
                  InvalidArgument);
  CHECK(nd::engine().stats().nodes_recorded == before_view);
}

TEST_CASE("writes through views match finite differences") {
  // PyTorch's CopySlices: a write through a view changes its base's values
  // and history; outside the view the gradient goes to the base's values
  // before the write, inside it to the written values.
  check_gradient("through views", [](const std::vector<NDArray>& x) {
    const Device dev = x[0].device();
    NDArray y = x[0] * 2.0;                                 // [3, 4]
    y.slice(0, 1, 2) += x[1];                                // a row, x[1] broadcast
    y.slice(1, 0, 2) *= x[0].slice(1, 2, 4);                 // needs the view's old values
    y.transpose().slice(0, 3, 4).assign(x[1].slice(0, 0, 3).reshape({1, 3}));  // a view of a view
    y.reshape({12}).slice(0, 5, 9) -= x[1] * x[1];           // through a reshape
    NDArray v = y.slice(0, 2, 3);
    v /= x[1] + 3.0;                                         // the view is used after the write too
    NDArray acc = nd::zeros({3, 4}, DType::kFloat64, dev);  // outside the graph until written
    acc.slice(0, 0, 2) += y.slice(0, 1, 3);
    acc.slice(1, 3, 4).assign(nd::ones({3, 1}, DType::kFloat64, dev));  // constants: no gradient inside
    return acc * y + v;
  }, {{{3, 4}}, {{4}, 0.5, 2.0}});
  // A write with no gradient inside the view cuts it from the base's old
  // values there.
  check_gradient("constant through a view", [](const std::vector<NDArray>& x) {
    NDArray y = nd::exp(x[0]) * 1.0;  // (exp saves its output: the multiply is the array written)
    y.slice(0, 0, 1).assign(nd::zeros({1, 2}, DType::kFloat64, x[0].device()));
    return y * y;
  }, {{{2, 2}}});
}

TEST_CASE("an array saved for backward and modified in place since is refused, recording nothing") {
  NDArray x = nd::array(std::vector<double>{1, 2, 3}, {3});
  x.requires_grad(true);
  NDArray a = nd::array(std::vector<double>{4, 5, 6}, {3});
  NDArray loss = (x * a).sum();
  a += 1.0;
  try {
    loss.backward();
    FAIL("backward read an array modified since it was saved");
  } catch (const InvalidArgument& e) {
    const std::string m = e.what();
    CHECK(m.find("'mul'") != std::string::npos);
    CHECK(m.find("modified in place") != std::string::npos);
  }
  CHECK_FALSE(x.grad().valid());
  // A write through a view of the saved array counts too.
  NDArray b = nd::array(std::vector<double>{4, 5, 6}, {3});
  NDArray loss2 = (nd::exp(x) * b).sum();
  b.slice(0, 1, 2).assign(nd::zeros({1}, DType::kFloat64, b.device()));
  CHECK_THROWS_AS(loss2.backward(), InvalidArgument);
  // Nothing written: accepted.
  NDArray c = nd::array(std::vector<double>{4, 5, 6}, {3});
  (x * c).sum().backward();
  CHECK(x.grad().to_vector<double>() == std::vector<double>{4, 5, 6});
}

TEST_CASE("a training step's memory returns to its level before the step") {
  const Device dev = default_device();
  NDArray w1 = nd::random_normal({16, 32}, dev, 1, 0.0, 0.3, DType::kFloat64).requires_grad(true);
  NDArray b1 = nd::zeros({32}, DType::kFloat64, dev).requires_grad(true);
  NDArray w2 = nd::random_normal({32, 4}, dev, 2, 0.0, 0.3, DType::kFloat64).requires_grad(true);
  const NDArray x = nd::random_uniform({64, 16}, dev, 3, -1.0, 1.0, DType::kFloat64);
  const NDArray t = nd::random_uniform({64, 4}, dev, 4, -1.0, 1.0, DType::kFloat64);
  std::vector<NDArray> params = {w1, b1, w2};
  std::vector<double> losses;
  std::int64_t before = 0;
  for (int step = 0; step < 4; ++step) {
    for (auto& p : params) p.zero_grad();
    settle();
    if (step == 2) before = nd::device_memory_in_use(dev);
    NDArray loss = nd::mse_loss(nd::matmul(nd::relu(nd::matmul(x, w1) + b1), w2), t);
    loss.backward();
    {
      autograd::NoGradGuard no_grad;
      for (auto& p : params) p -= p.grad() * 0.1;
    }
    settle();
    if (step == 2) {
      // Still holding the loss (so the graph's nodes are alive): only the
      // loss and the new gradients remain, no saved activation.
      const std::int64_t grads = static_cast<std::int64_t>((16 * 32 + 32 + 32 * 4) * sizeof(double));
      CHECK(nd::device_memory_in_use(dev) == before + grads + static_cast<std::int64_t>(sizeof(double)));
    }
    losses.push_back(loss.item<double>());
  }
  CHECK(losses.back() < losses.front());
}

TEST_CASE("backward returns before the gradients are computed") {
  if (nd::engine().policy() == engine::Policy::kNaive) return;  // runs every op at record time
  NDArray w = nd::array(std::vector<double>{1, 2}, {2});
  w.requires_grad(true);
  NDArray loss = (w * w).sum();
  // A gate: an op writing w (which mul's derivative reads) that finishes
  // only once the test has returned from backward(). A backward that
  // waited for its gradients would never return.
  std::atomic<bool> open{false};
  const engine::Var writes[] = {w.var()};
  nd::engine().push(
      [&open](const engine::RunContext&) {
        while (!open.load(std::memory_order_acquire)) {
        }
      },
      {}, writes);
  loss.backward();
  open.store(true, std::memory_order_release);
  CHECK(w.grad().to_vector<double>() == std::vector<double>{2, 4});
}

TEST_CASE("stack, squeeze, unsqueeze, multi-axis sums, var and std: values and gradients") {
  check_gradient("stack", [](auto& x) { return nd::stack({x[0], x[1] * 2.0}, 1); }, {{{2, 3}}, {{2, 3}}});
  check_gradient("unsqueeze", [](auto& x) { return nd::unsqueeze(x[0], -1) * x[1]; }, {{{3}}, {{1, 2}}});
  check_gradient("squeeze", [](auto& x) { return nd::exp(nd::squeeze(x[0], 1)); }, {{{3, 1, 2}}});
  check_gradient("sum axes", [](auto& x) { return nd::sum(x[0], {0, 2}); }, {{{2, 3, 4}}});
  check_gradient("mean axes", [](auto& x) { return nd::mean(x[0], {-1, 0}, true); }, {{{2, 3, 4}}});
  check_gradient("var", [](auto& x) { return nd::var(x[0], 1, 1); }, {{{3, 5}}});
  check_gradient("std", [](auto& x) { return nd::std(x[0], 0); }, {{{4, 2}}});

  const std::vector<double> v = {1, 2, 4, 7, 11, 16};
  const NDArray a = nd::array(v, {2, 3});
  CHECK(nd::stack({a, a}, 0).shape() == Shape{2, 2, 3});
  CHECK(nd::stack({a, a}, -1).shape() == Shape{2, 3, 2});
  CHECK(nd::squeeze(nd::unsqueeze(a, 0), 0).shape() == a.shape());
  CHECK_THROWS_AS((void)nd::squeeze(a, 0), InvalidArgument);
  CHECK_THROWS_AS((void)nd::stack({a, a.transpose()}), InvalidArgument);
  CHECK_THROWS_AS((void)nd::sum(a, {1, -1}), InvalidArgument);
  CHECK(nd::sum(a, {0, 1}).item<double>() == 41.0);
  CHECK(nd::sum(a > 3.0, {0, 1}).item<std::int64_t>() == 4);
  // NumPy: np.var([1, 2, 4], ddof=1) = 2.3333..., np.std([[1,2,4],[7,11,16]], axis=0)
  const auto var1 = nd::var(a, 1, 1).to_vector<double>();
  CHECK(var1[0] == doctest::Approx(7.0 / 3.0));
  CHECK(var1[1] == doctest::Approx(61.0 / 3.0));
  const auto sd = nd::std(a, 0).to_vector<double>();
  CHECK(sd[0] == doctest::Approx(3.0));
  CHECK(sd[2] == doctest::Approx(6.0));
  CHECK_THROWS_AS((void)nd::var(a, 1, 3), InvalidArgument);
}

TEST_CASE("matmul with 1-D operands, as NumPy") {
  check_gradient("vec @ mat", [](auto& x) { return nd::matmul(x[0], x[1]); }, {{{3}}, {{3, 2}}});
  check_gradient("mat @ vec", [](auto& x) { return nd::matmul(x[0], x[1]); }, {{{2, 3}}, {{3}}});
  check_gradient("vec @ vec", [](auto& x) { return nd::matmul(x[0], x[1]); }, {{{4}}, {{4}}});
  check_gradient("batch @ vec", [](auto& x) { return nd::matmul(x[0], x[1]); }, {{{2, 3, 4}}, {{4}}});
  const NDArray v = nd::array(std::vector<double>{1, 2, 3}, {3});
  const NDArray m = nd::array(std::vector<double>{1, 0, 0, 1, 1, 1}, {3, 2});
  CHECK(nd::matmul(v, v).shape() == Shape{});
  CHECK(nd::matmul(v, v).item<double>() == 14.0);
  CHECK(nd::matmul(v, m).to_vector<double>() == std::vector<double>{4, 5});
  CHECK(nd::matmul(m.transpose(), v).to_vector<double>() == std::vector<double>{4, 5});
  CHECK_THROWS_AS((void)nd::matmul(v, nd::ones({2}, DType::kFloat64, v.device())), InvalidArgument);
}

TEST_CASE("take, argsort, sort, take_along_axis and topk along any axis, against references") {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> d(-4, 4);  // ties on purpose
  const Shape shape{3, 5, 4};
  std::vector<double> v(60);
  for (auto& x : v) x = d(rng);
  const NDArray a = nd::array(v, shape);
  auto at = [&](std::int64_t i, std::int64_t j, std::int64_t k) { return v[static_cast<std::size_t>((i * 5 + j) * 4 + k)]; };
  for (int axis : {0, 1, 2, -2}) {
    CAPTURE(axis);
    const int ax = axis < 0 ? axis + 3 : axis;
    const std::int64_t len = shape[static_cast<std::size_t>(ax)];
    for (bool desc : {false, true}) {
      const NDArray idx = nd::argsort(a, axis, desc);
      const NDArray sorted = nd::sort(a, axis, desc);
      CHECK(idx.shape() == shape);
      const auto vi = idx.to_vector<std::int64_t>();
      const auto vs = sorted.to_vector<double>();
      // every line along the axis, stably sorted by std::stable_sort
      for (std::int64_t p = 0; p < 60 / len; ++p) {
        const std::int64_t inner = ax == 2 ? 5 : 4;  // extent of the last axis other than ax
        const std::int64_t fixed[2] = {p / inner, p % inner};
        auto pos = [&](std::int64_t t) {
          std::int64_t c[3];
          int f = 0;
          for (int q = 0; q < 3; ++q) c[q] = q == ax ? t : fixed[f++];
          return std::array<std::int64_t, 3>{c[0], c[1], c[2]};
        };
        std::vector<std::int64_t> want(static_cast<std::size_t>(len));
        for (std::int64_t t = 0; t < len; ++t) want[static_cast<std::size_t>(t)] = t;
        std::stable_sort(want.begin(), want.end(), [&](std::int64_t x, std::int64_t y) {
          const auto px = pos(x);
          const auto py = pos(y);
          const double ux = at(px[0], px[1], px[2]);
          const double uy = at(py[0], py[1], py[2]);
          return desc ? ux > uy : ux < uy;
        });
        for (std::int64_t t = 0; t < len; ++t) {
          const auto pt = pos(t);
          const auto flat = static_cast<std::size_t>((pt[0] * 5 + pt[1]) * 4 + pt[2]);
          CHECK(vi[flat] == want[static_cast<std::size_t>(t)]);
          const auto pw = pos(want[static_cast<std::size_t>(t)]);
          CHECK(vs[flat] == at(pw[0], pw[1], pw[2]));
        }
      }
    }
    // take along the axis: indices of shape (2, 2)
    const NDArray ti = nd::array(std::vector<std::int64_t>{len - 1, 0, 1, len - 1}, {2, 2});
    const NDArray taken = nd::take(a, ti, axis);
    Shape want_shape;
    for (int q = 0; q < ax; ++q) want_shape.push_back(shape[static_cast<std::size_t>(q)]);
    want_shape.push_back(2);
    want_shape.push_back(2);
    for (int q = ax + 1; q < 3; ++q) want_shape.push_back(shape[static_cast<std::size_t>(q)]);
    CHECK(taken.shape() == want_shape);
    const auto tv = taken.to_vector<double>();
    const std::int64_t tiv[4] = {len - 1, 0, 1, len - 1};
    // the result in row-major order: (pre..., the 4 indices, post...)
    std::vector<double> want_taken;
    if (ax == 0) {
      for (std::int64_t w = 0; w < 4; ++w)
        for (std::int64_t j = 0; j < 5; ++j)
          for (std::int64_t k = 0; k < 4; ++k) want_taken.push_back(at(tiv[w], j, k));
    } else if (ax == 1) {
      for (std::int64_t i = 0; i < 3; ++i)
        for (std::int64_t w = 0; w < 4; ++w)
          for (std::int64_t k = 0; k < 4; ++k) want_taken.push_back(at(i, tiv[w], k));
    } else {
      for (std::int64_t i = 0; i < 3; ++i)
        for (std::int64_t j = 0; j < 5; ++j)
          for (std::int64_t w = 0; w < 4; ++w) want_taken.push_back(at(i, j, tiv[w]));
    }
    CHECK(tv == want_taken);
    // topk along the axis is the head of the descending sort
    const auto top = nd::topk(a, 2, axis, true);
    const NDArray head = nd::sort(a, axis, true).slice(ax, 0, 2);
    CHECK(top.values.to_vector<double>() == head.to_vector<double>());
    CHECK(top.indices.to_vector<std::int64_t>() == nd::argsort(a, axis, true).slice(ax, 0, 2).to_vector<std::int64_t>());
  }
  CHECK_THROWS_AS((void)nd::argsort(a, 3, false), InvalidArgument);
  CHECK_THROWS_AS((void)nd::take_along_axis(a, nd::zeros({3, 5}, DType::kInt64, a.device()), 1), InvalidArgument);
  // gradients through the transposed views
  check_gradient("sort axis 0", [](auto& x) { return nd::sort(x[0], 0, false); }, {{{4, 3}}});
  check_gradient("take axis 1", [](auto& x) {
    return nd::take(x[0], nd::array(std::vector<std::int64_t>{2, 0, 2}, {3}, x[0].device()), 1);
  }, {{{2, 3, 2}}});
  check_gradient("topk axis 0", [](auto& x) { return nd::topk(x[0], 2, 0, false).values; }, {{{5, 2}}});
}

TEST_CASE("argsort, sort and topk against std::stable_sort; sort's gradient") {
  std::mt19937 rng(5);
  std::uniform_int_distribution<int> d(-5, 5);  // ties on purpose
  std::vector<double> v(4 * 9);
  for (auto& x : v) x = d(rng);
  const NDArray a = nd::array(v, {4, 9});
  for (bool desc : {false, true}) {
    const auto idx = nd::argsort(a, desc).to_vector<std::int64_t>();
    const auto sorted = nd::sort(a, desc).to_vector<double>();
    for (int r = 0; r < 4; ++r) {
      std::vector<std::int64_t> want(9);
      for (int i = 0; i < 9; ++i) want[i] = i;
      std::stable_sort(want.begin(), want.end(), [&](std::int64_t i, std::int64_t j) {
        return desc ? v[r * 9 + i] > v[r * 9 + j] : v[r * 9 + i] < v[r * 9 + j];
      });
      for (int i = 0; i < 9; ++i) {
        CHECK(idx[r * 9 + i] == want[i]);
        CHECK(sorted[r * 9 + i] == v[r * 9 + want[i]]);
      }
    }
  }
  const auto top = nd::topk(a, 3);
  CHECK(top.values.shape() == Shape{4, 3});
  CHECK(top.indices.dtype() == DType::kInt64);
  const auto tv = top.values.to_vector<double>();
  const auto sv = nd::sort(a, true).to_vector<double>();
  for (int r = 0; r < 4; ++r) {
    for (int i = 0; i < 3; ++i) CHECK(tv[r * 3 + i] == sv[r * 9 + i]);
  }
  const auto nan_sorted = nd::sort(nd::array(std::vector<double>{2, std::nan(""), 1}, {3})).to_vector<double>();
  CHECK(nan_sorted[0] == 1.0);
  CHECK(std::isnan(nan_sorted[2]));
  CHECK_THROWS_AS((void)nd::topk(a, 10), InvalidArgument);
  CHECK_THROWS_AS((void)nd::take_along_last(a, nd::zeros({3, 2}, DType::kInt64, a.device())), InvalidArgument);
  // continuous random inputs: no ties, so the gradient is defined
  check_gradient("sort", [](auto& x) { return nd::sort(x[0]); }, {{{3, 5}}});
  check_gradient("topk", [](auto& x) { return nd::topk(x[0], 2, false).values; }, {{{2, 6}}});
}
