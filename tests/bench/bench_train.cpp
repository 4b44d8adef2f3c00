// The digits MLP's training step beside PyTorch's in the same run
// (tests/bench/torch_digits.py at 1 and 2 threads, with OpenBLAS as the
// environment configures it and choosing by the CPU, its best taken): Adam,
// batch 64, shuffled minibatches of the shuffled split's 1,500 rows, for
//   digits_mlp        64-128-10, lr 2e-3 (the first model), and
//   digits_mlp_large  64-512-256-10, lr 1e-3, label smoothing 0.5 (the model
//                     of docs/examples/train_digits.cpp; its augmented data
//                     only makes an epoch longer, not a step).
//   bench_train digits.csv torch_digits.py [python]
// Prints, per workload, lazydag_step_us, torch_step_us, ratio_vs_torch,
// ops_per_step and overhead_share (ops_per_step x the per-op cost of a tiny
// recorded op, measured here, over the step time). Exits 77 without the
// data file.
#include <lazydag/lazydag.hpp>

#include "bench_util.hpp"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

using namespace lazydag;

namespace {

double torch_step_us(const std::string& python, const std::string& script, const std::string& csv, int threads,
                     int epochs, const std::string& hidden, double lr, double smoothing, bool blas_detects) {
  const std::string cmd = std::string(blas_detects ? "env -u OPENBLAS_CORETYPE " : "") + "'" + python + "' '" + script + "' '" + csv + "' " + std::to_string(threads) + " " +
                          std::to_string(epochs) + " shuffled " + hidden + " " + std::to_string(lr) + " " +
                          std::to_string(smoothing) + " 2>&1";
  std::unique_ptr<FILE, int (*)(FILE*)> p(popen(cmd.c_str(), "r"), pclose);
  if (!p) return -1;
  char line[512];
  double us = -1;
  while (std::fgets(line, sizeof line, p.get()) != nullptr) {
    std::string s(line);
    if (s.rfind("step_us=", 0) == 0) us = std::stod(s.substr(8));
    if (s.rfind("skipped=", 0) == 0) std::printf("bench=train peer=torch %s", line);
  }
  return us;
}

struct Workload {
  const char* name;
  std::vector<std::int64_t> hidden;
  const char* hidden_arg;  // for the peer script
  double lr;
  double smoothing;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3 || !std::filesystem::exists(argv[1])) {
    std::fprintf(stderr, "bench_train: no data file (usage: bench_train digits.csv torch_digits.py)\n");
    return 77;
  }
  const int epochs = bench::repeats(15);

  NDArray all = data::read_csv(argv[1]);
  all = nd::take(all, nd::permutation(all.shape()[0], 2024));
  const NDArray x = all.slice(1, 0, 64) / 16.0;
  const NDArray y = all.slice(1, 64, 65).reshape({-1}).astype(DType::kInt64);
  // The per-op cost of the frontend and engine: tiny recorded ops.
  const NDArray one = nd::ones({1});
  const int tiny = 20000;
  const double tiny_s = bench::median_seconds([&] {
    for (int i = 0; i < tiny; ++i) (void)(one + 1.0);
    nd::waitall();
  });
  const double op_us = tiny_s / tiny * 1e6;

  const Workload workloads[] = {{"digits_mlp", {128}, "128", 2e-3, 0.0},
                                {"digits_mlp_large", {512, 256}, "512,256", 1e-3, 0.5}};
  for (const Workload& w : workloads) {
    nn::manual_seed(0);
    nn::Sequential model;
    std::int64_t in = 64;
    for (std::int64_t h : w.hidden) {
      model.add<nn::Linear>(in, h).add<nn::ReLU>();
      in = h;
    }
    model.add<nn::Linear>(in, 10);
    optim::Adam opt(model.parameters(), {.lr = w.lr});
    data::MiniBatches batches({x.slice(0, 0, 1500), y.slice(0, 0, 1500)}, 64, true, 1);
    MetricLog losses("loss", batches.batches_per_epoch(), [](std::int64_t, std::span<const double>) {});

    std::int64_t epoch = 0;
    std::uint64_t ops = 0;
    std::int64_t steps = 0;
    const double epoch_s = bench::median_of(
        [&] {
          const auto recorded = nd::engine().stats().nodes_recorded;
          const auto t0 = bench::Clock::now();
          batches.start_epoch(epoch++);
          steps = 0;
          while (auto b = batches.next()) {
            opt.zero_grad();
            NDArray loss = nd::cross_entropy(model((*b)[0]), (*b)[1], w.smoothing);
            loss.backward();
            opt.step();
            losses.append(loss);
            ++steps;
          }
          nd::waitall();
          ops = nd::engine().stats().nodes_recorded - recorded;
          return bench::since(t0);
        },
        epochs);
    const double step_us = epoch_s / static_cast<double>(steps) * 1e6;
    const double ops_per_step = static_cast<double>(ops) / static_cast<double>(steps);

    // PyTorch's products go through OpenBLAS, whose kernels the environment
    // may choose (OPENBLAS_CORETYPE); lazydag's float32 products go through
    // oneDNN, which chooses by the CPU. The peer is timed both as the
    // environment says and with OpenBLAS choosing by the CPU, and its best
    // is taken.
    const bool coretype_set = std::getenv("OPENBLAS_CORETYPE") != nullptr;
    double best = -1;
    for (const bool blas_detects : {false, true}) {
      if (blas_detects && !coretype_set) continue;
      for (int threads : {1, 2}) {
        const double t = torch_step_us(argc > 3 ? argv[3] : "python3", argv[2], argv[1], threads, epochs,
                                       w.hidden_arg, w.lr, w.smoothing, blas_detects);
        if (t > 0) {
          std::printf("bench=train workload=%s peer=torch threads=%d openblas=%s step_us=%.1f\n", w.name, threads,
                      blas_detects ? "detected" : "as_configured", t);
          if (best < 0 || t < best) best = t;
        }
      }
    }
    std::printf("bench=train workload=%s lazydag_step_us=%.1f\n", w.name, step_us);
    std::printf("bench=train workload=%s ops_per_step=%.1f op_us=%.2f overhead_share=%.2f\n", w.name, ops_per_step,
                op_us, ops_per_step * op_us / step_us);
    if (best > 0) {
      std::printf("bench=train workload=%s torch_step_us=%.1f\n", w.name, best);
      std::printf("bench=train workload=%s ratio_vs_torch=%.2f\n", w.name, step_us / best);
    }
  }
  return 0;
}
