// Modules, optimizers (against reference loops of PyTorch's update rules),
// .npy files, take/permutation/randint and the minibatch iterator.
#include "reference.hpp"

#include <lazydag/autograd.hpp>
#include <lazydag/data.hpp>
#include <lazydag/module.hpp>
#include <lazydag/nn.hpp>
#include <lazydag/optim.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>

using namespace lazydag;
using namespace lazydag::test;

namespace {

std::vector<double> randoms(std::size_t n, std::uint32_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

// Gives `p` the gradient `g`: backward of sum(p * g).
void set_grad(NDArray p, const std::vector<double>& g) {
  p.zero_grad();
  (p * nd::array(g, p.shape(), p.device())).sum().backward();
}

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("lazydag_test_" + std::to_string(::getpid()) + "_" + name)).string();
}

}  // namespace

TEST_CASE("Linear and Sequential: forward against a reference, parameters, zero_grad") {
  nn::manual_seed(42);
  nn::Sequential model;
  model.add<nn::Linear>(3, 4, true, default_device(), DType::kFloat64).add<nn::Tanh>().add<nn::Linear>(4, 2, false, default_device(), DType::kFloat64);
  CHECK(model.size() == 3);
  const auto named = model.named_parameters();
  REQUIRE(named.size() == 3);
  CHECK(named[0].first == "0.weight");
  CHECK(named[1].first == "0.bias");
  CHECK(named[2].first == "2.weight");
  for (const auto& p : model.parameters()) CHECK(p.requires_grad());
  const auto w1 = named[0].second.to_vector<double>();
  const auto b1 = named[1].second.to_vector<double>();
  const auto w2 = named[2].second.to_vector<double>();
  for (double w : w1) CHECK(std::abs(w) <= 1.0 / std::sqrt(3.0));
  const auto xv = randoms(5 * 3, 1);
  const NDArray y = model(nd::array(xv, {5, 3}));
  CHECK(y.shape() == Shape{5, 2});
  const auto got = y.to_vector<double>();
  for (int r = 0; r < 5; ++r) {
    double h[4];
    for (int j = 0; j < 4; ++j) {
      double s = b1[j];
      for (int k = 0; k < 3; ++k) s += xv[r * 3 + k] * w1[k * 4 + j];
      h[j] = std::tanh(s);
    }
    for (int j = 0; j < 2; ++j) {
      double s = 0;
      for (int k = 0; k < 4; ++k) s += h[k] * w2[k * 2 + j];
      CHECK(got[r * 2 + j] == doctest::Approx(s).epsilon(1e-12));
    }
  }
  y.sum().backward();
  for (const auto& p : model.parameters()) CHECK(p.grad().valid());
  model.zero_grad();
  for (const auto& p : model.parameters()) CHECK_FALSE(p.grad().valid());
  // the same seed builds the same model
  nn::manual_seed(42);
  nn::Linear again(3, 4, true, default_device(), DType::kFloat64);
  CHECK(again.weight.to_vector<double>() == w1);
  CHECK_THROWS_AS(nn::Linear(0, 3), InvalidArgument);
  CHECK_THROWS_AS((void)nn::Sequential().forward(nd::ones({1})), InvalidArgument);
}

TEST_CASE("initialisers have the documented spread") {
  const std::int64_t n = 20000;
  const auto k = nn::init::kaiming_normal({n}, 50, default_device(), DType::kFloat64).to_vector<double>();
  double s2 = 0;
  for (double v : k) s2 += v * v;
  CHECK(std::sqrt(s2 / n) == doctest::Approx(std::sqrt(2.0 / 50)).epsilon(0.03));
  const double b = std::sqrt(6.0 / (30 + 70));
  const auto x = nn::init::xavier_uniform({n}, 30, 70, default_device(), DType::kFloat64).to_vector<double>();
  double lo = 0, hi = 0;
  for (double v : x) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  CHECK(lo >= -b);
  CHECK(hi <= b);
  CHECK(hi - lo > 1.9 * b);
  CHECK_THROWS_AS((void)nn::init::uniform_fan_in({3}, 0), InvalidArgument);
}

TEST_CASE("SGD matches PyTorch's update rule: momentum, dampening, Nesterov, weight decay") {
  struct Case {
    optim::SGDOptions o;
  };
  std::vector<optim::SGDOptions> cases(4);
  cases[0].lr = 0.1;
  cases[1] = {0.05, 0.9, 0.0, 0.0, false};
  cases[2] = {0.05, 0.9, 0.1, 0.01, false};
  cases[3] = {0.02, 0.8, 0.0, 0.001, true};
  for (DType t : {DType::kFloat64, DType::kFloat32}) {
    for (std::size_t c = 0; c < cases.size(); ++c) {
      CAPTURE(c);
      const auto& o = cases[c];
      auto pv = randoms(6, 3);
      NDArray p = nd::array(pv, {2, 3}).astype(t).requires_grad(true);
      optim::SGD opt({p}, o);
      std::vector<double> buf(6, 0.0);
      for (int step = 0; step < 4; ++step) {
        const auto g = randoms(6, 10 + step);
        p.zero_grad();
        (p * nd::array(g, {2, 3}).astype(t)).sum().backward();
        opt.step();
        for (std::size_t i = 0; i < 6; ++i) {
          double d = g[i] + o.weight_decay * pv[i];
          if (o.momentum != 0) {
            buf[i] = step == 0 ? d : o.momentum * buf[i] + (1 - o.dampening) * d;
            d = o.nesterov ? d + o.momentum * buf[i] : buf[i];
          }
          pv[i] -= o.lr * d;
        }
      }
      check_close(values(p), pv, t == DType::kFloat64 ? 1e-12 : 1e-5);
      CHECK(opt.steps() == 4);
    }
  }
  NDArray q = nd::ones({2}).requires_grad(true);
  CHECK_THROWS_AS(optim::SGD({q}, {-0.1}), InvalidArgument);
  CHECK_THROWS_AS(optim::SGD({q}, {0.1, 0.0, 0.0, 0.0, true}), InvalidArgument);
  CHECK_THROWS_AS(optim::SGD({nd::ones({2})}, {}), InvalidArgument);
  CHECK_THROWS_AS(optim::SGD({q * 2.0}, {}), InvalidArgument);
  CHECK_THROWS_AS(optim::SGD({}, {}), InvalidArgument);
}

TEST_CASE("Adam and AdamW match the reference update; state saves and loads") {
  for (bool decoupled : {false, true}) {
    CAPTURE(decoupled);
    optim::AdamOptions o;
    o.lr = 0.01;
    o.weight_decay = 0.05;
    auto pv = randoms(5, 4);
    NDArray p = nd::array(pv, {5}).requires_grad(true);
    std::unique_ptr<optim::Adam> opt = decoupled ? std::make_unique<optim::AdamW>(std::vector<NDArray>{p}, o)
                                                 : std::make_unique<optim::Adam>(std::vector<NDArray>{p}, o);
    std::vector<double> m(5, 0.0), v(5, 0.0);
    for (int step = 1; step <= 5; ++step) {
      const auto g = randoms(5, 20 + step);
      set_grad(p, g);
      const double lr = step <= 2 ? o.lr : 0.003;  // a schedule: lowered from the third step
      if (step == 3) opt->set_lr(lr);
      CHECK(opt->lr() == lr);
      opt->step();
      for (std::size_t i = 0; i < 5; ++i) {
        double d = g[i];
        if (decoupled) {
          pv[i] *= 1 - lr * o.weight_decay;
        } else {
          d += o.weight_decay * pv[i];
        }
        m[i] = o.beta1 * m[i] + (1 - o.beta1) * d;
        v[i] = o.beta2 * v[i] + (1 - o.beta2) * d * d;
        const double mh = m[i] / (1 - std::pow(o.beta1, step));
        const double vh = v[i] / (1 - std::pow(o.beta2, step));
        pv[i] -= lr * mh / (std::sqrt(vh) + o.eps);
      }
    }
    CHECK_THROWS_AS(opt->set_lr(-1.0), InvalidArgument);
    CHECK(opt->lr() == 0.003);
    check_close(values(p), pv, 1e-12);

    // A second optimizer loaded with the first's state continues identically.
    NDArray p2 = p.detach().copy().requires_grad(true);
    optim::Adam opt2({p2}, opt->options());
    opt2.load_state(opt->state());
    CHECK(opt2.steps() == 5);
    const auto g = randoms(5, 99);
    set_grad(p, g);
    set_grad(p2, g);
    opt->step();
    opt2.step();
    CHECK(p2.to_vector<double>() == p.to_vector<double>());
  }
  NDArray q = nd::ones({2}).requires_grad(true);
  optim::AdamOptions bad;
  bad.beta1 = 1.0;
  CHECK_THROWS_AS(optim::Adam({q}, bad), InvalidArgument);
  optim::Adam fresh({q}, {});
  CHECK_THROWS_AS(fresh.load_state({}), InvalidArgument);
}

TEST_CASE("npy files round-trip every dtype and read Fortran order; malformed files are refused") {
  const std::string path = temp_path("a.npy");
  const NDArray f = nd::array(randoms(6, 5), {2, 3}).astype(DType::kFloat32);
  const NDArray d = nd::array(randoms(7, 6), {7});
  const NDArray i = nd::array(std::vector<std::int32_t>{-1, 2, 3}, {3, 1});
  const NDArray l = nd::array(std::vector<std::int64_t>{1LL << 40, -5}, {2});
  const NDArray b = nd::array(std::vector<bool>{true, false, true, true}, {2, 2});
  const NDArray s = nd::full({}, 2.5, DType::kFloat64);
  const NDArray z = nd::zeros({0, 3});
  for (const NDArray& a : {f, d, i, l, b, s, z}) {
    nd::save_npy(path, a);
    const NDArray r = nd::load_npy(path);
    CHECK(r.shape() == a.shape());
    CHECK(r.dtype() == a.dtype());
    CHECK(values(r) == values(a));
    std::ifstream in(path, std::ios::binary);
    std::string head(10, '\0');
    in.read(head.data(), 10);
    const std::size_t hlen = static_cast<unsigned char>(head[8]) | (static_cast<unsigned char>(head[9]) << 8);
    CHECK((10 + hlen) % 64 == 0);  // NumPy aligns the data
  }
  // A Fortran-order file as NumPy writes one (np.asfortranarray): the
  // column-major bytes of [[1, 2, 3], [4, 5, 6]].
  {
    std::string header = "{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3), }";
    header.append((64 - (10 + header.size() + 1) % 64) % 64, ' ');
    header += '\n';
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write("\x93NUMPY\x01\x00", 8);
    const char len[2] = {static_cast<char>(header.size()), 0};
    out.write(len, 2);
    out << header;
    for (double v : {1.0, 4.0, 2.0, 5.0, 3.0, 6.0}) out.write(reinterpret_cast<const char*>(&v), 8);
  }
  const NDArray fo = nd::load_npy(path);
  CHECK(fo.shape() == Shape{2, 3});
  CHECK(fo.to_vector<double>() == std::vector<double>{1, 2, 3, 4, 5, 6});
  for (const std::string& bad : {std::string("not numpy at all"),
                                 std::string("\x93NUMPY\x01\x00\x30\x00{'descr': '>f4', 'fortran_order': False, 'shape': (1,), }  \n", 58),
                                 std::string("\x93NUMPY\x01\x00\x30\x00{'descr': '<f8', 'fortran_order': False, 'shape': (4,), }  \n", 58)}) {
    std::ofstream(path, std::ios::binary | std::ios::trunc) << bad;
    CHECK_THROWS_AS((void)nd::load_npy(path), InvalidArgument);
  }
  std::remove(path.c_str());
  CHECK_THROWS_AS((void)nd::load_npy(path), InvalidArgument);
}

TEST_CASE("take gathers rows, fails on a bad index, and its gradient scatter-adds") {
  const auto av = randoms(5 * 3, 7);
  const NDArray a = nd::array(av, {5, 3});
  const std::vector<std::int64_t> iv = {4, 0, 4, 2};
  const NDArray t = nd::take(a, nd::array(iv, {2, 2}));
  CHECK(t.shape() == Shape{2, 2, 3});
  const auto tv = t.to_vector<double>();
  for (std::size_t k = 0; k < iv.size(); ++k) {
    for (std::size_t j = 0; j < 3; ++j) CHECK(tv[k * 3 + j] == av[static_cast<std::size_t>(iv[k]) * 3 + j]);
  }
  CHECK(nd::take(a.transpose(), nd::array(std::vector<std::int32_t>{1}, {1})).to_vector<double>() ==
        std::vector<double>{av[1], av[4], av[7], av[10], av[13]});
  const NDArray bad = nd::take(a, nd::array(std::vector<std::int64_t>{5}, {1}));
  CHECK_THROWS_AS(bad.wait_to_read(), OpError);
  CHECK_THROWS_AS((void)nd::take(a, nd::ones({1})), InvalidArgument);

  NDArray w = nd::array(av, {5, 3}).requires_grad(true);
  const auto gv = randoms(4 * 3, 8);
  (nd::take(w, nd::array(iv, {4})) * nd::array(gv, {4, 3})).sum().backward();
  std::vector<double> want(15, 0.0);
  for (std::size_t k = 0; k < iv.size(); ++k) {
    for (std::size_t j = 0; j < 3; ++j) want[static_cast<std::size_t>(iv[k]) * 3 + j] += gv[k * 3 + j];
  }
  check_close(values(w.grad()), want, 1e-12);
}

TEST_CASE("permutation and randint depend only on their seed") {
  const auto p = nd::permutation(1000, 3).to_vector<std::int64_t>();
  CHECK(std::set<std::int64_t>(p.begin(), p.end()).size() == 1000);
  CHECK(*std::min_element(p.begin(), p.end()) == 0);
  CHECK(*std::max_element(p.begin(), p.end()) == 999);
  CHECK(nd::permutation(1000, 3).to_vector<std::int64_t>() == p);
  CHECK(nd::permutation(1000, 4).to_vector<std::int64_t>() != p);
  CHECK(nd::permutation(0, 1).size() == 0);
  const auto r = nd::randint(-3, 4, {10000}, 9).to_vector<std::int64_t>();
  std::vector<int> counts(7, 0);
  for (auto v : r) {
    REQUIRE(v >= -3);
    REQUIRE(v < 4);
    ++counts[static_cast<std::size_t>(v + 3)];
  }
  for (int c : counts) CHECK(c > 1200);  // ~1429 each
  CHECK_THROWS_AS((void)nd::randint(2, 2, {1}, 0), InvalidArgument);
  CHECK_THROWS_AS((void)nd::permutation(-1, 0), InvalidArgument);
}

TEST_CASE("MiniBatches visits every row once per epoch, rows and labels together") {
  const std::int64_t n = 23;
  std::vector<double> xv(static_cast<std::size_t>(n * 2));
  std::vector<std::int64_t> yv(static_cast<std::size_t>(n));
  for (std::int64_t r = 0; r < n; ++r) {
    xv[r * 2] = static_cast<double>(r);
    xv[r * 2 + 1] = static_cast<double>(-r);
    yv[r] = r * 10;
  }
  data::MiniBatches loader({nd::array(xv, {n, 2}), nd::array(yv, {n})}, 5, true, 11);
  CHECK(loader.batches_per_epoch() == 5);
  std::vector<std::int64_t> first_order;
  for (int epoch = 0; epoch < 2; ++epoch) {
    loader.start_epoch(epoch);
    std::vector<std::int64_t> seen;
    int batches = 0;
    while (auto b = loader.next()) {
      ++batches;
      const auto x = (*b)[0].to_vector<double>();
      const auto y = (*b)[1].to_vector<std::int64_t>();
      REQUIRE(x.size() == y.size() * 2);
      for (std::size_t k = 0; k < y.size(); ++k) {
        CHECK(y[k] == static_cast<std::int64_t>(x[k * 2]) * 10);
        CHECK(x[k * 2 + 1] == -x[k * 2]);
        seen.push_back(static_cast<std::int64_t>(x[k * 2]));
      }
    }
    CHECK(batches == 5);
    CHECK(std::set<std::int64_t>(seen.begin(), seen.end()).size() == static_cast<std::size_t>(n));
    if (epoch == 0) first_order = seen;
    if (epoch == 1) CHECK(seen != first_order);  // reshuffled
  }
  loader.start_epoch(0);
  std::vector<std::int64_t> again;
  while (auto b = loader.next()) {
    for (double v : (*b)[0].slice(1, 0, 1).to_vector<double>()) again.push_back(static_cast<std::int64_t>(v));
  }
  CHECK(again == first_order);
  data::MiniBatches dropping({nd::array(xv, {n, 2})}, 5, false, 0, true);
  CHECK(dropping.batches_per_epoch() == 4);
  int count = 0;
  while (auto b = dropping.next()) {
    CHECK((*b)[0].shape()[0] == 5);
    ++count;
  }
  CHECK(count == 4);
  CHECK_THROWS_AS(data::MiniBatches({nd::ones({3}), nd::ones({4})}, 2), InvalidArgument);
  CHECK_THROWS_AS(data::MiniBatches({nd::ones({3})}, 0), InvalidArgument);
}

TEST_CASE("an MLP trained with Adam separates two classes") {
  nn::manual_seed(1);
  const std::int64_t n = 256;
  std::vector<float> xv(static_cast<std::size_t>(n * 2));
  std::vector<std::int64_t> yv(static_cast<std::size_t>(n));
  const auto r = randoms(static_cast<std::size_t>(n * 2), 12);
  for (std::int64_t i = 0; i < n; ++i) {
    xv[i * 2] = static_cast<float>(r[i * 2]);
    xv[i * 2 + 1] = static_cast<float>(r[i * 2 + 1]);
    yv[i] = xv[i * 2] * xv[i * 2 + 1] > 0 ? 1 : 0;  // XOR of the signs: not linearly separable
  }
  nn::Sequential model;
  model.add<nn::Linear>(2, 32).add<nn::ReLU>().add<nn::Linear>(32, 2);
  optim::Adam opt(model.parameters(), {0.02});
  data::MiniBatches loader({nd::array(xv, {n, 2}), nd::array(yv, {n})}, 32, true, 5);
  for (int epoch = 0; epoch < 60; ++epoch) {
    loader.start_epoch(epoch);
    while (auto b = loader.next()) {
      opt.zero_grad();
      nd::cross_entropy(model((*b)[0]), (*b)[1]).backward();
      opt.step();
    }
  }
  autograd::NoGradGuard no_grad;
  const NDArray pred = model(nd::array(xv, {n, 2})).argmax(1);
  const double acc = (pred == nd::array(yv, {n})).astype(DType::kFloat64).mean().item<double>();
  CHECK(acc > 0.9);
}
