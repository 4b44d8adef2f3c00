// The digits MLP of train_digits.cpp trained data-parallel over MPI ranks:
// each rank trains on its own shard of the (seeded, shuffled) training rows
// with its share of the global batch of 64, and dist::DataParallel averages
// the gradients during backward. Run it under mpirun:
//
//   mpirun -np 2 train_digits_dist digits.csv [epochs] [minimum test accuracy]
//
// Every rank evaluates the test rows; rank 0 prints the accuracy and checks
// that all ranks hold the same parameters. Exits 77 when the data file is
// absent or this build has no MPI.
#include <lazydag/dist.hpp>
#include <lazydag/lazydag.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

using namespace lazydag;

int main(int argc, char** argv) {
  if (argc < 2 || !std::filesystem::exists(argv[1]) || !dist::available()) {
    std::fprintf(stderr, "train_digits_dist: no data file or no MPI (usage: train_digits_dist digits.csv)\n");
    return 77;
  }
  const int epochs = argc > 2 ? std::atoi(argv[2]) : 15;
  const double required = argc > 3 ? std::atof(argv[3]) : 0.0;
  dist::init();
  const int me = dist::rank();
  const int ranks = dist::size();

  NDArray all = data::read_csv(argv[1]);
  all = nd::take(all, nd::permutation(all.shape()[0], 2024));  // the "shuffled" split of train_digits
  const NDArray x = all.slice(1, 0, 64) / 16.0;
  const NDArray y = all.slice(1, 64, 65).reshape({-1}).astype(DType::kInt64);
  const std::int64_t train_rows = 1500;
  const std::int64_t shard = train_rows / ranks;  // equal shards: every rank runs as many steps
  const std::int64_t global_batch = 64;

  nn::manual_seed(0);
  nn::Sequential model;
  model.add<nn::Linear>(64, 128).add<nn::ReLU>().add<nn::Linear>(128, 10);
  dist::DataParallel ddp(model);  // rank 0's parameters everywhere, gradients averaged in backward
  optim::Adam opt(model.parameters(), {.lr = 2e-3});
  data::MiniBatches batches({x.slice(0, me * shard, (me + 1) * shard), y.slice(0, me * shard, (me + 1) * shard)},
                            global_batch / ranks, true, 1, /*drop_last=*/true);

  const auto start = std::chrono::steady_clock::now();
  for (int epoch = 0; epoch < epochs; ++epoch) {
    batches.start_epoch(epoch);
    while (auto b = batches.next()) {
      opt.zero_grad();
      nd::cross_entropy(model((*b)[0]), (*b)[1]).backward();
      opt.step();
    }
  }
  nd::waitall();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  autograd::NoGradGuard no_grad;
  // The ranks must agree on every parameter (same averaged gradients, same
  // optimizer steps): the largest difference from the ranks' maximum.
  double drift = 0;
  for (const NDArray& p : model.parameters()) {
    drift = std::max(drift, nd::abs(dist::allreduce(p, dist::ReduceOp::kMax) - p).max().astype(DType::kFloat64).item<double>());
  }
  const NDArray logits = model(x.slice(0, train_rows, x.shape()[0]));
  const NDArray hits = logits.argmax(1) == y.slice(0, train_rows, y.shape()[0]);
  const double accuracy = hits.astype(DType::kFloat64).mean().item<double>();
  if (me == 0) {
    std::printf("ranks=%d test_accuracy=%.4f seconds_per_epoch=%.4f parameter_drift=%g\n", ranks, accuracy,
                seconds / epochs, drift);
  }
  dist::finalize();
  return accuracy >= required && drift == 0 ? 0 : 1;
}
