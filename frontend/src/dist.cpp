// lazydag::dist: collectives as async engine nodes over the communication
// thread of engine/mpi/comm.hpp, and DataParallel on autograd's gradient
// hooks. Arrays on sim or gpu devices are staged through host copies
// (recorded; Debian's Open MPI is not CUDA-aware).
#include "config.hpp"
#include <lazydag/dist.hpp>

#include "autograd_internal.hpp"
#include "internal.hpp"

#include <atomic>
#include <climits>
#include <cstring>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <mutex>
#include <string>

#if LAZYDAG_HAVE_MPI
#include "comm.hpp"
#endif

namespace lazydag::dist {

#if !LAZYDAG_HAVE_MPI

bool available() noexcept { return false; }
namespace {
[[noreturn]] void unavailable() {
  throw BackendUnavailable("lazydag::dist: this build has no MPI (configure with -Dmpi=enabled and Open MPI installed)");
}
}  // namespace
void init() { unavailable(); }
void finalize() {}
int rank() { unavailable(); }
int size() { unavailable(); }
NDArray allreduce(const NDArray&, ReduceOp) { unavailable(); }
NDArray broadcast(const NDArray&, int) { unavailable(); }
NDArray allgather(const NDArray&) { unavailable(); }
NDArray reduce_scatter(const NDArray&, ReduceOp) { unavailable(); }
void send(const NDArray&, int, int) { unavailable(); }
NDArray recv(const Shape&, DType, int, int, Device) { unavailable(); }
void barrier() { unavailable(); }
struct DataParallel::State {};
DataParallel::DataParallel(nn::Module&, std::size_t, bool) { unavailable(); }
DataParallel::~DataParallel() = default;
void DataParallel::synchronize() { unavailable(); }
std::size_t DataParallel::num_buckets() const noexcept { return 0; }

#else

bool available() noexcept { return true; }

namespace {

using mpi::Comm;

std::once_flag g_exit_hook;

MPI_Datatype mpi_type(DType t, const char* op) {
  switch (t) {
    case DType::kFloat32: return MPI_FLOAT;
    case DType::kFloat64: return MPI_DOUBLE;
    case DType::kInt32: return MPI_INT32_T;
    case DType::kInt64: return MPI_INT64_T;
    case DType::kBool: break;
  }
  throw InvalidArgument(std::string(op) + ": bool arrays are not reduced or sent (use astype)");
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kMean: return MPI_SUM;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kMin: return MPI_MIN;
  }
  return MPI_SUM;
}

int checked_count(std::int64_t n, const char* op) {
  if (n > INT_MAX) {
    throw InvalidArgument(std::string(op) + ": " + std::to_string(n) +
                          " elements exceed MPI's count limit of 2147483647");
  }
  return static_cast<int>(n);
}

Comm& comm() {
  Comm& c = Comm::get();
  std::call_once(g_exit_hook, [] {
    std::atexit([] {
      try {
        finalize();
      } catch (const std::exception& e) {
        std::cerr << "lazydag::dist: finalize at exit: " << e.what() << '\n';
      }
    });
  });
  return c;
}

// What the comm thread's callbacks share with the node: the Completion,
// whether an input failed here, and the flag the ranks reduce so that a
// failure on any rank fails the collective on every rank.
struct Pending {
  engine::Completion done;
  std::exception_ptr local_failure;
  int failed_here = 0;
  int failed_anywhere = 0;
  std::string name;
};

// Records a collective on host arrays: `issue` makes its MPI calls, non-
// blocking (appending their requests) or, given no request list, blocking
// (the comm thread does that when nothing else is in flight, and only for
// collectives: a blocking send could wait for a rank that waits for it); a
// second, tiny allreduce of the failure flag follows it, in the same order
// on every rank.
using Issue = std::function<int(MPI_Comm, std::vector<MPI_Request>*, const std::vector<void*>&)>;

void record_collective(const char* kind, const std::vector<NDArray>& reads, const std::vector<NDArray>& writes,
                       Issue issue, bool exchange_failure = true, bool may_block = true) {
  Comm& c = comm();
  const std::uint64_t seq = c.next_seq();
  const std::string name = std::string(kind) + " #" + std::to_string(seq);
  detail::record_host_async(
      name, reads, writes,
      [&c, seq, name, issue = std::move(issue), exchange_failure, may_block](const std::vector<void*>& ptrs,
                                                                              const engine::RunContext& ctx,
                                                                              engine::Completion& done) {
        auto p = std::make_shared<Pending>();
        p->done = std::move(done);
        p->local_failure = ctx.failed_input;
        p->failed_here = ctx.failed_input ? 1 : 0;
        p->name = name;
        mpi::Comm::Op op;
        op.seq = seq;
        op.start = [p, ptrs, issue, exchange_failure](MPI_Comm comm, std::vector<MPI_Request>& reqs) {
          int rc = issue(comm, &reqs, ptrs);
          if (rc == MPI_SUCCESS && exchange_failure) {
            reqs.emplace_back();
            rc = MPI_Iallreduce(&p->failed_here, &p->failed_anywhere, 1, MPI_INT, MPI_MAX, comm, &reqs.back());
          }
          return rc;
        };
        if (may_block) {
          op.run = [p, ptrs, issue, exchange_failure](MPI_Comm comm) {
            if (!exchange_failure) return issue(comm, nullptr, ptrs);
            // The flag's exchange starts first, in the same place on every
            // rank, and progresses while the data's blocking call runs.
            MPI_Request flag = MPI_REQUEST_NULL;
            int rc = MPI_Iallreduce(&p->failed_here, &p->failed_anywhere, 1, MPI_INT, MPI_MAX, comm, &flag);
            if (rc != MPI_SUCCESS) return rc;
            rc = issue(comm, nullptr, ptrs);
            const int waited = MPI_Wait(&flag, MPI_STATUS_IGNORE);
            return rc != MPI_SUCCESS ? rc : waited;
          };
        }
        op.finish = [p, exchange_failure](int rc) {
          if (rc != MPI_SUCCESS) {
            p->done(std::make_exception_ptr(Error(p->name + ": " + Comm::error_string(rc))));
          } else if (p->local_failure) {
            p->done(p->local_failure);
          } else if (exchange_failure && p->failed_anywhere != 0) {
            p->done(std::make_exception_ptr(
                Error(p->name + ": the input failed on another rank; this rank's result is not valid")));
          } else {
            p->done();
          }
        };
        c.post(std::move(op));
      },
      /*run_on_failed_input=*/true);
}

// Host copies of arrays on stream devices; contiguous CPU arrays as they are.
NDArray to_host(const NDArray& x) {
  if (x.device().is_stream_device()) return x.copyto(cpu());
  return x.is_contiguous() ? x : x.copy();
}
NDArray back(const NDArray& host, Device dev) { return host.device() == dev ? host : host.copyto(dev); }

void check_valid(const NDArray& x, const char* op) {
  if (!x.valid()) throw InvalidArgument(std::string(op) + ": use of an empty NDArray");
}

NDArray reduce_impl(const NDArray& x, ReduceOp op, bool scatter) {
  const char* kind = scatter ? "reduce_scatter" : "allreduce";
  check_valid(x, kind);
  const MPI_Datatype type = mpi_type(x.dtype(), kind);
  if (op == ReduceOp::kMean && !is_floating(x.dtype())) {
    throw InvalidArgument(std::string(kind) + ": mean needs a float array, got " + std::string(to_string(x.dtype())));
  }
  const int n = size();
  Shape out_shape = x.shape();
  if (scatter) {
    if (x.ndim() == 0 || x.shape()[0] % n != 0) {
      throw InvalidArgument("reduce_scatter: axis 0 of shape " + to_string(x.shape()) + " does not split into " +
                            std::to_string(n) + " equal parts");
    }
    out_shape[0] /= n;
  }
  const int count = checked_count(numel(out_shape), kind);
  (void)checked_count(x.size(), kind);
  const NDArray in = to_host(x);
  NDArray out = detail::empty(out_shape, x.dtype(), in.device(), kind);
  const MPI_Op mop = mpi_op(op);
  record_collective(kind, {in}, {out}, [type, mop, count, scatter](MPI_Comm c, std::vector<MPI_Request>* reqs,
                                                                    const std::vector<void*>& p) {
    if (reqs == nullptr) {
      return scatter ? MPI_Reduce_scatter_block(p[0], p[1], count, type, mop, c)
                     : MPI_Allreduce(p[0], p[1], count, type, mop, c);
    }
    reqs->emplace_back();
    return scatter ? MPI_Ireduce_scatter_block(p[0], p[1], count, type, mop, c, &reqs->back())
                   : MPI_Iallreduce(p[0], p[1], count, type, mop, c, &reqs->back());
  });
  NDArray r = back(out, x.device());
  return op == ReduceOp::kMean ? r / static_cast<double>(n) : r;
}

}  // namespace

void init() { (void)comm(); }

void finalize() {
  if (!Comm::running()) return;
  nd::waitall();
  Comm::get().shutdown();
}

int rank() { return comm().rank(); }
int size() { return comm().size(); }

NDArray allreduce(const NDArray& x, ReduceOp op) { return reduce_impl(x, op, false); }
NDArray reduce_scatter(const NDArray& x, ReduceOp op) { return reduce_impl(x, op, true); }

NDArray broadcast(const NDArray& x, int root) {
  check_valid(x, "broadcast");
  const MPI_Datatype type = mpi_type(x.dtype(), "broadcast");
  const int n = size();
  if (root < 0 || root >= n) {
    throw InvalidArgument("broadcast: root " + std::to_string(root) + " is not a rank (0.." + std::to_string(n - 1) + ")");
  }
  const int count = checked_count(x.size(), "broadcast");
  const NDArray in = to_host(x);
  NDArray out = detail::empty(x.shape(), x.dtype(), in.device(), "broadcast");
  const std::size_t bytes = static_cast<std::size_t>(x.size()) * size_of(x.dtype());
  record_collective("broadcast", {in}, {out}, [type, count, root, bytes](MPI_Comm c, std::vector<MPI_Request>* reqs,
                                                                          const std::vector<void*>& p) {
    int me = 0;
    MPI_Comm_rank(c, &me);
    if (me == root && bytes != 0) std::memcpy(p[1], p[0], bytes);
    if (reqs == nullptr) return MPI_Bcast(p[1], count, type, root, c);
    reqs->emplace_back();
    return MPI_Ibcast(p[1], count, type, root, c, &reqs->back());
  });
  return back(out, x.device());
}

NDArray allgather(const NDArray& x) {
  check_valid(x, "allgather");
  const MPI_Datatype type = mpi_type(x.dtype(), "allgather");
  const int n = size();
  Shape out_shape = x.shape();
  if (out_shape.empty()) {
    out_shape = {n};
  } else {
    out_shape[0] = checked_dim_sum(0, out_shape[0] * n, "allgather");
  }
  const int count = checked_count(x.size(), "allgather");
  (void)checked_count(numel(out_shape), "allgather");
  const NDArray in = to_host(x);
  NDArray out = detail::empty(out_shape, x.dtype(), in.device(), "allgather");
  record_collective("allgather", {in}, {out}, [type, count](MPI_Comm c, std::vector<MPI_Request>* reqs,
                                                             const std::vector<void*>& p) {
    if (reqs == nullptr) return MPI_Allgather(p[0], count, type, p[1], count, type, c);
    reqs->emplace_back();
    return MPI_Iallgather(p[0], count, type, p[1], count, type, c, &reqs->back());
  });
  return back(out, x.device());
}

void send(const NDArray& x, int dest, int tag) {
  check_valid(x, "send");
  const MPI_Datatype type = mpi_type(x.dtype(), "send");
  if (dest < 0 || dest >= size()) throw InvalidArgument("send: rank " + std::to_string(dest) + " does not exist");
  if (tag < 0 || tag > 16383) throw InvalidArgument("send: tag " + std::to_string(tag) + " is outside 0..16383");
  const int count = checked_count(x.size(), "send");
  // The payload, then whether it is valid, as two messages in order.
  auto flag = std::make_shared<int>(0);
  record_collective("send", {to_host(x)}, {},
                    [type, count, dest, tag, flag](MPI_Comm c, std::vector<MPI_Request>* reqs,
                                                   const std::vector<void*>& p) {
                      reqs->emplace_back();
                      int rc = MPI_Isend(p[0], count, type, dest, 2 * tag, c, &reqs->back());
                      if (rc != MPI_SUCCESS) return rc;
                      reqs->emplace_back();
                      return MPI_Isend(flag.get(), 1, MPI_INT, dest, 2 * tag + 1, c, &reqs->back());
                    },
                    /*exchange_failure=*/false, /*may_block=*/false);
}

NDArray recv(const Shape& shape, DType t, int source, int tag, Device dev) {
  const MPI_Datatype type = mpi_type(t, "recv");
  if (source < 0 || source >= size()) throw InvalidArgument("recv: rank " + std::to_string(source) + " does not exist");
  if (tag < 0 || tag > 16383) throw InvalidArgument("recv: tag " + std::to_string(tag) + " is outside 0..16383");
  check_shape(shape, "recv");
  const int count = checked_count(numel(shape), "recv");
  NDArray out = detail::empty(shape, t, cpu(), "recv");
  auto flag = std::make_shared<int>(0);
  record_collective("recv", {}, {out},
                    [type, count, source, tag, flag](MPI_Comm c, std::vector<MPI_Request>* reqs,
                                                     const std::vector<void*>& p) {
                      reqs->emplace_back();
                      int rc = MPI_Irecv(p[0], count, type, source, 2 * tag, c, &reqs->back());
                      if (rc != MPI_SUCCESS) return rc;
                      reqs->emplace_back();
                      return MPI_Irecv(flag.get(), 1, MPI_INT, source, 2 * tag + 1, c, &reqs->back());
                    },
                    /*exchange_failure=*/false, /*may_block=*/false);
  return back(out, dev);
}

void barrier() {
  nd::waitall();
  NDArray token = nd::zeros({1}, DType::kInt32, cpu());
  allreduce(token).wait_to_read();
}

// ---- DataParallel ----

struct DataParallel::State {
  struct Bucket {
    std::vector<NDArray> params;  // last layer first
    std::size_t ready = 0;
    bool fired = false;
  };
  std::vector<NDArray> params;
  std::vector<Bucket> buckets;
  std::vector<std::size_t> bucket_of;  // per parameter
  std::mutex mu;

  // Averages a bucket's gradients: one flat buffer, one allreduce, then
  // each gradient replaced by its part (all recorded).
  void fire(Bucket& b) {
    b.fired = true;
    std::vector<NDArray> flat;
    for (const auto& p : b.params) {
      NDArray g = p.grad();
      flat.push_back(g.valid() ? g.reshape({-1}) : nd::zeros({p.size()}, p.dtype(), p.device()));
    }
    const NDArray reduced = allreduce(flat.size() == 1 ? flat[0] : nd::concat(flat), ReduceOp::kMean);
    std::int64_t at = 0;
    for (const auto& p : b.params) {
      detail::replace_grad(p, reduced.slice(0, at, at + p.size()).reshape(p.shape()));
      at += p.size();
    }
  }

  // A parameter's gradient was accumulated: once every parameter of its
  // bucket has one, the bucket is averaged; once every bucket was, the
  // round (one backward) ends.
  void on_grad(std::size_t i) {
    std::lock_guard g(mu);
    if (seen[i]) {
      late = true;  // a second contribution this round (a parameter used twice)
      return;
    }
    seen[i] = true;
    Bucket& b = buckets[bucket_of[i]];
    if (++b.ready != b.params.size() || !overlap) return;
    fire(b);
    bool all = true;
    for (const auto& x : buckets) all = all && x.fired;
    if (all) reset();
  }

  void reset() {
    for (auto& x : buckets) {
      x.ready = 0;
      x.fired = false;
    }
    seen.assign(params.size(), false);
  }

  std::vector<bool> seen;
  bool late = false;
  bool overlap = true;
};

DataParallel::DataParallel(nn::Module& model, std::size_t bucket_bytes, bool overlap)
    : state_(std::make_shared<State>()) {
  init();
  State& s = *state_;
  s.overlap = overlap;
  s.params = model.parameters();
  if (s.params.empty()) throw InvalidArgument("DataParallel: the model has no parameters");
  {
    autograd::NoGradGuard no_grad;
    for (auto& p : s.params) p.assign(broadcast(p, 0).as_in_device(p.device()));
  }
  // Buckets in reverse registration order: backward produces the last
  // layer's gradients first.
  s.bucket_of.assign(s.params.size(), 0);
  std::size_t bytes = 0;
  for (std::size_t k = s.params.size(); k-- > 0;) {
    const NDArray& p = s.params[k];
    const std::size_t pb = static_cast<std::size_t>(p.size()) * size_of(p.dtype());
    const bool fits = !s.buckets.empty() && bytes + pb <= bucket_bytes &&
                      s.buckets.back().params.front().dtype() == p.dtype() &&
                      s.buckets.back().params.front().device() == p.device();
    if (!fits) {
      s.buckets.emplace_back();
      bytes = 0;
    }
    s.buckets.back().params.push_back(p);
    s.bucket_of[k] = s.buckets.size() - 1;
    bytes += pb;
  }
  s.reset();
  std::weak_ptr<State> weak = state_;
  for (std::size_t k = 0; k < s.params.size(); ++k) {
    detail::set_grad_hook(s.params[k], [weak, k] {
      if (auto st = weak.lock()) st->on_grad(k);
    });
  }
}

DataParallel::~DataParallel() {
  for (auto& p : state_->params) {
    try {
      detail::set_grad_hook(p, {});
    } catch (...) {
    }
  }
}

void DataParallel::synchronize() {
  std::lock_guard g(state_->mu);
  autograd::NoGradGuard no_grad;
  for (auto& b : state_->buckets) {
    if (!b.fired && b.ready != 0) state_->fire(b);
  }
  state_->reset();
  if (state_->late) {
    state_->late = false;
    throw Error("DataParallel: a parameter received a gradient after its bucket was averaged (a parameter used "
                "twice in one forward); its gradient is not averaged over the ranks");
  }
}

std::size_t DataParallel::num_buckets() const noexcept { return state_->buckets.size(); }

#endif

}  // namespace lazydag::dist
