// Trains a 64-128-10 MLP on the digits data set (1,797 8x8 images of
// handwritten digits, 10 classes; the first 1,500 rows train, the rest
// test) with Adam, logging the loss without a blocking read per step.
//
//   train_digits digits.csv [epochs] [minimum test accuracy] [first|shuffled]
//
// The split is the file's first 1,500 rows (default) or the first 1,500 of
// a seeded permutation of the rows ("shuffled"). The file's last 297 rows
// are the hardest: the same model in PyTorch also ends near 0.92 on them.
// `./dev train` fetches digits.csv (shipped in Debian's python3-sklearn)
// into the build directory and runs this. Exits 77 when the file is absent.
#include <lazydag/lazydag.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

using namespace lazydag;

int main(int argc, char** argv) {
  if (argc < 2 || !std::filesystem::exists(argv[1])) {
    std::fprintf(stderr, "train_digits: no data file (usage: train_digits digits.csv [epochs])\n");
    return 77;
  }
  const int epochs = argc > 2 ? std::atoi(argv[2]) : 30;
  const double required = argc > 3 ? std::atof(argv[3]) : 0.0;
  const bool shuffled = argc > 4 && std::string(argv[4]) == "shuffled";

  NDArray all = data::read_csv(argv[1]);  // 1797 rows: 64 pixels (0..16), label
  if (shuffled) all = nd::take(all, nd::permutation(all.shape()[0], 2024));
  const NDArray x = all.slice(1, 0, 64) / 16.0;
  const NDArray y = all.slice(1, 64, 65).reshape({-1}).astype(DType::kInt64);
  const std::int64_t train_rows = 1500;

  nn::manual_seed(0);
  nn::Sequential model;
  model.add<nn::Linear>(64, 128).add<nn::ReLU>().add<nn::Linear>(128, 10);
  optim::Adam opt(model.parameters(), {.lr = 2e-3});
  data::MiniBatches batches({x.slice(0, 0, train_rows), y.slice(0, 0, train_rows)}, 64, true, 1);

  int epoch = 0;
  MetricLog losses("loss", batches.batches_per_epoch(), [&](std::int64_t, std::span<const double> v) {
    double s = 0;
    for (double l : v) s += l;
    if (epoch % 5 == 0 || epoch == epochs - 1) std::printf("epoch %2d  mean loss %.4f\n", epoch, s / static_cast<double>(v.size()));
  });

  const auto start = std::chrono::steady_clock::now();
  for (; epoch < epochs; ++epoch) {
    batches.start_epoch(epoch);
    while (auto b = batches.next()) {  // the training step:
      opt.zero_grad();
      NDArray loss = nd::cross_entropy(model((*b)[0]), (*b)[1]);
      loss.backward();
      opt.step();
      losses.append(loss);  // no wait here: stored on the device, moved once per epoch
    }
  }
  nd::waitall();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  autograd::NoGradGuard no_grad;
  const NDArray logits = model(x.slice(0, train_rows, x.shape()[0]));
  const NDArray hits = logits.argmax(1) == y.slice(0, train_rows, y.shape()[0]);
  const double accuracy = hits.astype(DType::kFloat64).mean().item<double>();
  std::printf("split=%s test_accuracy=%.4f seconds_per_epoch=%.4f\n", shuffled ? "shuffled" : "first",
              accuracy, seconds / epochs);
  return accuracy >= required ? 0 : 1;
}
