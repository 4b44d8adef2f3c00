// lazydag::dist under mpirun: allreduce bus bandwidth through lazydag
// beside a raw MPI_Allreduce loop in the same run (4 KiB .. 64 MiB of
// float32), and a data-parallel training step with the gradient averaging
// overlapped with backward (DataParallel) versus averaged after it.
//   mpirun -np N bench_dist
// Prints key=value lines on rank 0. Exits 77 without MPI.
#include <lazydag/dist.hpp>
#include <lazydag/lazydag.hpp>

#include "bench_util.hpp"
#include "comm.hpp"

#include <algorithm>
#include <cstdio>
#include <future>
#include <vector>

using namespace lazydag;

namespace {

// Bus bandwidth of an allreduce of `bytes`: 2 (n - 1) / n of them cross
// each rank's link (the convention of nccl-tests). With one rank: bytes / s.
double bus_gbps(double bytes, double seconds, int n) {
  const double factor = n > 1 ? 2.0 * (n - 1) / n : 1.0;
  return bytes * factor / seconds / 1e9;
}

// The peer: `iters` blocking MPI_Allreduce calls back to back, run on the
// communication thread itself (MPI is FUNNELED to it), as one sequenced
// operation so every rank runs it at the same point.
double raw_allreduce_seconds(std::int64_t count, int iters) {
  auto& comm = mpi::Comm::get();
  std::vector<float> a(static_cast<std::size_t>(count), 1.0F), b(a.size());
  std::promise<double> took;
  mpi::Comm::Op op;
  op.seq = comm.next_seq();
  op.start = [&](MPI_Comm c, std::vector<MPI_Request>&) {
    MPI_Barrier(c);
    const auto t0 = bench::Clock::now();
    for (int i = 0; i < iters; ++i) {
      MPI_Allreduce(a.data(), b.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, c);
    }
    took.set_value(bench::since(t0));
    return MPI_SUCCESS;
  };
  op.finish = [](int) {};
  comm.post(std::move(op));
  return took.get_future().get();
}

}  // namespace

int main() {
  if (!dist::available()) return 77;
  dist::init();
  const int n = dist::size();
  const int me = dist::rank();
  const int repeats = bench::repeats(7);
  for (std::int64_t bytes = 4096; bytes <= (std::int64_t{64} << 20); bytes *= 4) {
    const std::int64_t count = bytes / 4;
    const int iters = static_cast<int>(std::clamp<std::int64_t>((std::int64_t{128} << 20) / bytes, 4, 2000));
    NDArray x = nd::ones({count}, DType::kFloat32, cpu());
    std::vector<double> ours, raw;
    for (int r = 0; r < repeats + 1; ++r) {  // the first of each is a warm-up
      dist::barrier();
      const auto t0 = bench::Clock::now();
      for (int i = 0; i < iters; ++i) x = dist::allreduce(x);
      x.wait_to_read();
      if (r > 0) ours.push_back(bench::since(t0));
      const double t = raw_allreduce_seconds(count, iters);
      if (r > 0) raw.push_back(t);
    }
    std::sort(ours.begin(), ours.end());
    std::sort(raw.begin(), raw.end());
    const double o = ours[ours.size() / 2] / iters;
    const double p = raw[raw.size() / 2] / iters;
    if (me == 0) {
      std::printf("bench=dist workload=allreduce ranks=%d bytes=%lld lazydag_busbw_gbps=%.3f raw_mpi_busbw_gbps=%.3f "
                  "ratio_vs_mpi=%.2f\n",
                  n, static_cast<long long>(bytes), bus_gbps(static_cast<double>(bytes), o, n),
                  bus_gbps(static_cast<double>(bytes), p, n), p / o);
    }
  }

  // Training: the digits-sized MLP on random data, global batch 64 split
  // over the ranks; overlapped averaging vs averaging after backward.
  const std::int64_t batch = 64 / n * n;
  const std::int64_t shard = batch / n;
  const NDArray xs = nd::random_normal({batch, 64}, cpu(), 3);
  const NDArray ys = nd::randint(0, 10, {batch}, 4, cpu());
  const NDArray x = xs.slice(0, me * shard, (me + 1) * shard);
  const NDArray y = ys.slice(0, me * shard, (me + 1) * shard);
  double step_us[2] = {0, 0};
  for (int overlap = 1; overlap >= 0; --overlap) {
    nn::manual_seed(0);
    nn::Sequential model;
    model.add<nn::Linear>(64, 128).add<nn::ReLU>().add<nn::Linear>(128, 10);
    dist::DataParallel ddp(model, std::size_t{32} << 10, overlap == 1);
    optim::Adam opt(model.parameters(), {.lr = 1e-3});
    const int steps = 100;
    const double t = bench::median_seconds(
        [&] {
          for (int s = 0; s < steps; ++s) {
            opt.zero_grad();
            nd::cross_entropy(model(x), y).backward();
            if (overlap == 0) ddp.synchronize();
            opt.step();
          }
          nd::waitall();
        },
        repeats);
    step_us[overlap] = t / steps * 1e6;
  }
  if (me == 0) {
    std::printf("bench=dist workload=train ranks=%d step_us_overlap=%.1f step_us_after_backward=%.1f overlap_gain=%.2f\n",
                n, step_us[1], step_us[0], step_us[0] / step_us[1]);
  }
  dist::finalize();
  return 0;
}
