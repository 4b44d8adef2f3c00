// Distributed arrays over MPI: collectives recorded as engine nodes, and
// data-parallel training (docs/distributed.md).
//
// Every function records and returns at once, like any op; the results are
// ordinary arrays. Record collectives in the same order on every rank, from
// one thread per process: each takes a sequence number when recorded, and
// one communication thread issues them strictly in that order.
#pragma once

#include <lazydag/module.hpp>
#include <lazydag/ndarray.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace lazydag::dist {

enum class ReduceOp : std::uint8_t { kSum, kMean, kMax, kMin };

/// True when this build has MPI (the Meson option `mpi`).
[[nodiscard]] bool available() noexcept;
/// Starts MPI (on the communication thread). Idempotent; every other
/// function calls it. BackendUnavailable without MPI or after finalize().
void init();
/// Waits for everything recorded, then finalises MPI. Idempotent; also run
/// at exit when init() ran.
void finalize();
[[nodiscard]] int rank();
[[nodiscard]] int size();

/// Elementwise reduction over the ranks of equally shaped arrays (float32,
/// float64, int32, int64; mean: floats only). Sum, max and min are computed
/// by MPI; mean is the sum divided by size().
[[nodiscard]] NDArray allreduce(const NDArray& x, ReduceOp op = ReduceOp::kSum);
/// Rank `root`'s x on every rank (x gives the shape and dtype elsewhere).
[[nodiscard]] NDArray broadcast(const NDArray& x, int root = 0);
/// The ranks' arrays joined along axis 0 in rank order (a rank-0 array:
/// shape [size()]).
[[nodiscard]] NDArray allgather(const NDArray& x);
/// The reduction of the ranks' arrays, split along axis 0: rank r gets the
/// r-th of size() equal parts (axis 0 must divide evenly).
[[nodiscard]] NDArray reduce_scatter(const NDArray& x, ReduceOp op = ReduceOp::kSum);
/// Sends x to rank `dest` (matched by recv with the same tag, 0..16383).
void send(const NDArray& x, int dest, int tag = 0);
/// Receives an array of `shape` and `t` sent by rank `source` with `tag`.
[[nodiscard]] NDArray recv(const Shape& shape, DType t, int source, int tag = 0, Device dev = default_device());
/// Blocks until every rank reached it and everything recorded here is done.
void barrier();

/// Data-parallel training, as PyTorch's DistributedDataParallel: rank 0's
/// parameters are broadcast at construction, and during each backward() the
/// gradients are averaged over the ranks in buckets of about `bucket_bytes`
/// (parameters fused into one buffer per bucket, last layer first), each
/// bucket's allreduce recorded as soon as its last gradient is, so the
/// communication overlaps the rest of the backward pass. Every rank runs
/// the same model code on its own shard of each batch.
class DataParallel {
 public:
  /// overlap = false: buckets are averaged only by synchronize(), after
  /// backward() (for measuring what the overlap gains).
  explicit DataParallel(nn::Module& model, std::size_t bucket_bytes = std::size_t{1} << 20, bool overlap = true);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;
  /// Buckets whose parameters got no gradient in the last backward() are
  /// averaged now (zeros for the missing ones). Only needed when some
  /// parameters are unused.
  void synchronize();
  [[nodiscard]] std::size_t num_buckets() const noexcept;

 private:
  struct State;
  std::shared_ptr<State> state_;
};

}  // namespace lazydag::dist
