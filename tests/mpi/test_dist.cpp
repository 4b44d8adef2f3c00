// lazydag::dist under mpirun (-np 2 and -np 3): every collective against a
// reference each rank computes for all ranks, collectives whose inputs
// become ready in a different order on each rank, a failure on one rank,
// staging from the sim device, and DataParallel against one process
// training on the whole batch. Exits 77 in a build without MPI.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <lazydag/lazydag.hpp>
#include <lazydag/dist.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>

using namespace lazydag;

namespace {

// Rank r's values for test `seed`: integers, so every reduction is exact.
std::vector<double> values_of(int r, std::int64_t n, std::uint32_t seed) {
  std::mt19937 rng(seed * 7919u + static_cast<std::uint32_t>(r) * 104729u);
  std::vector<double> v(static_cast<std::size_t>(n));
  for (auto& x : v) x = static_cast<double>(static_cast<int>(rng() % 201) - 100);
  return v;
}

NDArray array_of(const std::vector<double>& v, const Shape& s, DType t, Device dev = cpu()) {
  return nd::array(v, s, cpu()).astype(t).as_in_device(dev);
}

std::vector<double> read(const NDArray& a) { return a.astype(DType::kFloat64).to_vector<double>(); }

const std::vector<Shape>& shapes() {
  static const std::vector<Shape> s = {{0}, {}, {3, 4}, {1 << 18}};
  return s;
}

}  // namespace

TEST_CASE("allreduce, every op, dtype and shape class, against a reference") {
  const int n = dist::size();
  const int me = dist::rank();
  std::uint32_t seed = 1;
  for (DType t : {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64}) {
    for (const Shape& s : shapes()) {
      for (dist::ReduceOp op : {dist::ReduceOp::kSum, dist::ReduceOp::kMean, dist::ReduceOp::kMax, dist::ReduceOp::kMin}) {
        if (op == dist::ReduceOp::kMean && !is_floating(t)) continue;
        CAPTURE(to_string(t));
        CAPTURE(to_string(s));
        CAPTURE(static_cast<int>(op));
        ++seed;
        const std::int64_t count = numel(s);
        const NDArray out = dist::allreduce(array_of(values_of(me, count, seed), s, t), op);
        CHECK(out.shape() == s);
        CHECK(out.dtype() == t);
        std::vector<double> want(static_cast<std::size_t>(count));
        for (int r = 0; r < n; ++r) {
          const auto v = values_of(r, count, seed);
          for (std::size_t i = 0; i < want.size(); ++i) {
            if (r == 0) {
              want[i] = v[i];
            } else if (op == dist::ReduceOp::kMax) {
              want[i] = std::max(want[i], v[i]);
            } else if (op == dist::ReduceOp::kMin) {
              want[i] = std::min(want[i], v[i]);
            } else {
              want[i] += v[i];
            }
          }
        }
        if (op == dist::ReduceOp::kMean) {
          for (auto& w : want) w /= n;
        }
        const auto got = read(out);
        REQUIRE(got.size() == want.size());
        bool same = true;
        for (std::size_t i = 0; i < got.size(); ++i) same = same && std::abs(got[i] - want[i]) <= 1e-6 * (1 + std::abs(want[i]));
        CHECK(same);
      }
    }
  }
}

TEST_CASE("broadcast, allgather, reduce_scatter, send and recv") {
  const int n = dist::size();
  const int me = dist::rank();
  for (int root = 0; root < n; ++root) {
    const NDArray b = dist::broadcast(array_of(values_of(me, 12, 50), {3, 4}, DType::kInt64), root);
    CHECK(read(b) == values_of(root, 12, 50));
  }
  const NDArray g = dist::allgather(array_of(values_of(me, 6, 51), {2, 3}, DType::kFloat32));
  CHECK(g.shape() == Shape{2 * n, 3});
  std::vector<double> want;
  for (int r = 0; r < n; ++r) {
    const auto v = values_of(r, 6, 51);
    want.insert(want.end(), v.begin(), v.end());
  }
  CHECK(read(g) == want);
  CHECK(read(dist::allgather(nd::full({}, me, DType::kInt32, cpu()))) == [&] {
    std::vector<double> ranks;
    for (int r = 0; r < n; ++r) ranks.push_back(r);
    return ranks;
  }());
  const NDArray rs = dist::reduce_scatter(array_of(values_of(me, 4 * n, 52), {2 * n, 2}, DType::kFloat64));
  CHECK(rs.shape() == Shape{2, 2});
  std::vector<double> sum(static_cast<std::size_t>(4 * n), 0.0);
  for (int r = 0; r < n; ++r) {
    const auto v = values_of(r, 4 * n, 52);
    for (std::size_t i = 0; i < sum.size(); ++i) sum[i] += v[i];
  }
  CHECK(read(rs) == std::vector<double>(sum.begin() + me * 4, sum.begin() + me * 4 + 4));
  // a ring: each rank sends to the next and receives from the previous
  dist::send(array_of(values_of(me, 5, 53), {5}, DType::kInt32), (me + 1) % n, 7);
  const NDArray got = dist::recv({5}, DType::kInt32, (me + n - 1) % n, 7);
  CHECK(read(got) == values_of((me + n - 1) % n, 5, 53));

  CHECK_THROWS_AS((void)dist::broadcast(nd::ones({2}), n), InvalidArgument);
  CHECK_THROWS_AS((void)dist::allreduce(nd::ones({2}, DType::kInt32), dist::ReduceOp::kMean), InvalidArgument);
  CHECK_THROWS_AS((void)dist::allreduce(nd::ones({2}, DType::kBool)), InvalidArgument);
  CHECK_THROWS_AS(dist::send(nd::ones({2}), 0, 20000), InvalidArgument);
  CHECK_THROWS_AS((void)dist::reduce_scatter(nd::ones({n + 1})), InvalidArgument);
}

TEST_CASE("collectives whose inputs become ready in a different order on each rank") {
  // Record order is the same on every rank; readiness order is not: each
  // input is produced by a chain of ops whose length depends on the rank.
  // Issued in readiness order, the ranks would pair different collectives
  // (wrong sums, or a hang); issued by sequence number they cannot.
  const int n = dist::size();
  const int me = dist::rank();
  std::mt19937 rng(1000u + static_cast<std::uint32_t>(me));
  const int k = 24;
  std::vector<NDArray> outs;
  for (int i = 0; i < k; ++i) {
    NDArray x = nd::full({1000}, static_cast<double>(i * 10 + me), DType::kFloat64, cpu());
    const int delay = static_cast<int>(rng() % 40);
    for (int d = 0; d < delay; ++d) x = (x + 1.0) - 1.0;
    outs.push_back(dist::allreduce(x, i % 2 == 0 ? dist::ReduceOp::kSum : dist::ReduceOp::kMax));
  }
  for (int i = k; i-- > 0;) {  // read in reverse: the last is waited for first
    double want = 0;
    for (int r = 0; r < n; ++r) want = i % 2 == 0 ? want + (i * 10 + r) : std::max(want, static_cast<double>(i * 10 + r));
    const auto v = read(outs[static_cast<std::size_t>(i)]);
    CHECK(v.front() == want);
    CHECK(v.back() == want);
  }
}

TEST_CASE("an input failing on one rank fails the collective on every rank, and the next one works") {
  const int me = dist::rank();
  NDArray x = nd::ones({4}, DType::kFloat32, cpu());
  if (me == 1) {
    // an op that fails at run time on this rank only
    x = nd::take(nd::ones({2, 2}, DType::kFloat32, cpu()), nd::array(std::vector<std::int64_t>{5}, {1}, cpu()))
            .reshape({-1})
            .slice(0, 0, 1);
    x = nd::broadcast_to(x, {4});
  }
  const NDArray out = dist::allreduce(x);
  try {
    out.wait_to_read();
    FAIL("the failure did not reach rank " << me);
  } catch (const OpError& e) {
    const std::string m = e.what();
    if (me == 1) {
      CHECK(m.find("out of range") != std::string::npos);
    } else {
      CHECK(m.find("failed on another rank") != std::string::npos);
    }
  }
  const NDArray next = dist::allreduce(nd::ones({3}, DType::kFloat32, cpu()));
  CHECK(read(next) == std::vector<double>(3, static_cast<double>(dist::size())));
  try {
    nd::waitall();
  } catch (const OpError&) {
  }
}

TEST_CASE("sim-device arrays are staged through the host") {
  const int n = dist::size();
  const NDArray x = nd::full({3}, 2.0, DType::kFloat32, sim(0));
  const NDArray s = dist::allreduce(x);
  CHECK(s.device() == sim(0));
  CHECK(read(s) == std::vector<double>(3, 2.0 * n));
}

namespace {
// Trains `make()`'s model with DataParallel on this rank's shard of each
// global batch and a replica on the whole batch in this process; returns
// the largest relative difference of any parameter, after checking that
// every rank holds the same parameters.
template <class Make>
double data_parallel_vs_one_process(Make make, std::int64_t in, std::int64_t classes, std::int64_t batch, double lr,
                                    std::size_t bucket_bytes, bool adam) {
  const int n = dist::size();
  const int me = dist::rank();
  const std::int64_t shard = batch / n;
  // Rank-dependent initial values: DataParallel must broadcast rank 0's.
  const std::shared_ptr<nn::Sequential> local = make();
  if (me != 0) {
    autograd::NoGradGuard no_grad;
    for (auto& p : local->parameters()) p += 0.5;
  }
  const std::shared_ptr<nn::Sequential> reference = make();
  dist::DataParallel ddp(*local, bucket_bytes);
  CHECK(ddp.num_buckets() > 1);
  auto optimizer = [&](std::vector<NDArray> ps) -> std::unique_ptr<optim::Optimizer> {
    if (adam) return std::make_unique<optim::Adam>(std::move(ps), optim::AdamOptions{.lr = lr});
    return std::make_unique<optim::SGD>(std::move(ps), optim::SGDOptions{.lr = lr, .momentum = 0.9});
  };
  const auto opt = optimizer(local->parameters());
  const auto ref_opt = optimizer(reference->parameters());
  for (int step = 0; step < 6; ++step) {
    const NDArray x = nd::random_normal({batch, in}, cpu(), 500 + static_cast<std::uint64_t>(step));
    const NDArray y = nd::randint(0, classes, {batch}, 900 + static_cast<std::uint64_t>(step), cpu());
    opt->zero_grad();
    nd::cross_entropy((*local)(x.slice(0, me * shard, (me + 1) * shard)), y.slice(0, me * shard, (me + 1) * shard))
        .backward();
    opt->step();
    ref_opt->zero_grad();
    nd::cross_entropy((*reference)(x), y).backward();
    ref_opt->step();
  }
  double worst = 0;
  const auto a = local->parameters();
  const auto b = reference->parameters();
  for (std::size_t i = 0; i < a.size(); ++i) {
    const auto va = a[i].to_vector<float>();
    const auto vb = b[i].to_vector<float>();
    for (std::size_t j = 0; j < va.size(); ++j) {
      worst = std::max(worst, std::abs(static_cast<double>(va[j]) - vb[j]) / std::max(1e-3, std::abs(static_cast<double>(vb[j]))));
    }
  }
  // every rank holds the same parameters
  for (const auto& p : a) {
    const NDArray spread = dist::allreduce(p, dist::ReduceOp::kMax) - dist::allreduce(p, dist::ReduceOp::kMin);
    CHECK(spread.max().item<float>() == 0.0F);
  }
  return worst;
}
}  // namespace

TEST_CASE("DataParallel on shards gives the parameters of one process on the whole batch") {
  const int n = dist::size();
  const double small = data_parallel_vs_one_process(
      [] {
        nn::manual_seed(77);
        auto m = std::make_shared<nn::Sequential>();
        m->add<nn::Linear>(6, 16).add<nn::Tanh>().add<nn::Linear>(16, 3);
        return m;
      },
      6, 3, 12, 0.01, 256, /*adam=*/true);  // batch 12: divisible by 2 and by 3; several buckets
  // The digits MLP (64-128-10, ReLU) on digits-shaped random batches of 60,
  // with SGD and momentum: Adam divides each update by the root of the
  // squared gradients, which turns float32 rounding of a near-zero
  // gradient entry into a relative difference above 1e-5 (measured 2.8e-5
  // on 2 ranks), while the gradients themselves agree to rounding.
  const double digits = data_parallel_vs_one_process(
      [] {
        nn::manual_seed(78);
        auto m = std::make_shared<nn::Sequential>();
        m->add<nn::Linear>(64, 128).add<nn::ReLU>().add<nn::Linear>(128, 10);
        return m;
      },
      64, 10, 60, 0.05, std::size_t{16} << 10, /*adam=*/false);
  if (dist::rank() == 0) {
    std::printf("dist: ranks=%d max_relative_difference_vs_one_process=%.3g (6-16-3 MLP) %.3g (digits MLP)\n", n,
                small, digits);
  }
  CHECK(small < 1e-5);
  CHECK(digits < 1e-5);
}

int main(int argc, char** argv) {
  if (!dist::available()) {
    std::fprintf(stderr, "test_dist: this build has no MPI\n");
    return 77;
  }
  dist::init();
  doctest::Context ctx(argc, argv);
  const int rc = ctx.run();
  dist::finalize();
  return rc;
}
