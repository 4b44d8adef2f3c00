#include "comm.hpp"

#include <lazydag/engine/error.hpp>

#include <atomic>
#include <chrono>
#include <memory>

namespace lazydag::mpi {

namespace {
std::mutex g_mu;
Comm* g_comm = nullptr;
std::atomic<bool> g_running{false};

struct Started {
  std::vector<MPI_Request> requests;
  std::function<void(int)> finish;
};
}  // namespace

Comm& Comm::get() {
  std::lock_guard g(g_mu);
  if (g_comm == nullptr) {
    auto* c = new Comm();  // lives until exit: dist::finalize stops it
    if (!c->init_error_.empty()) {
      const std::string why = c->init_error_;
      c->thread_.join();
      delete c;
      throw BackendUnavailable("MPI could not start: " + why);
    }
    g_comm = c;
    g_running.store(true);
  }
  if (!g_running.load()) throw BackendUnavailable("MPI was finalised (dist::finalize) and cannot start again");
  return *g_comm;
}

bool Comm::running() noexcept { return g_running.load(); }

std::string Comm::error_string(int code) {
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  if (MPI_Error_string(code, text, &len) != MPI_SUCCESS) return "MPI error " + std::to_string(code);
  return std::string(text, static_cast<std::size_t>(len));
}

Comm::Comm() {
  thread_ = std::thread([this] { loop(); });
  std::unique_lock lk(mu_);
  cv_.wait(lk, [&] { return ready_; });
}

std::uint64_t Comm::next_seq() {
  std::lock_guard g(mu_);
  return next_seq_++;
}

void Comm::post(Op op) {
  {
    std::lock_guard g(mu_);
    const auto seq = op.seq;
    posted_.emplace(seq, std::move(op));
  }
  cv_.notify_all();
}

std::uint64_t Comm::unfinished() const {
  std::lock_guard g(mu_);
  return next_seq_ - finished_;
}

void Comm::shutdown() {
  {
    std::lock_guard g(mu_);
    if (stopped_) return;
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  std::lock_guard g(mu_);
  stopped_ = true;
  g_running.store(false);
}

void Comm::loop() {
  MPI_Comm comm = MPI_COMM_NULL;
  {
    int provided = 0;
    int initialised = 0;
    MPI_Initialized(&initialised);
    int rc = initialised ? MPI_SUCCESS : MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_dup(MPI_COMM_WORLD, &comm);
    if (rc == MPI_SUCCESS) {
      MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN);
      MPI_Comm_rank(comm, &rank_);
      MPI_Comm_size(comm, &size_);
    }
    std::lock_guard g(mu_);
    if (rc != MPI_SUCCESS) init_error_ = initialised ? error_string(rc) : "MPI_Init_thread failed";
    ready_ = true;
    cv_.notify_all();
    if (rc != MPI_SUCCESS) return;
  }
  std::uint64_t next_start = 0;
  std::vector<Started> active;
  int idle_polls = 0;
  for (;;) {
    std::vector<Op> startable;
    {
      std::unique_lock lk(mu_);
      if (active.empty()) {
        cv_.wait(lk, [&] { return stop_ || (!posted_.empty() && posted_.begin()->first == next_start); });
      }
      while (!posted_.empty() && posted_.begin()->first == next_start) {
        startable.push_back(std::move(posted_.begin()->second));
        posted_.erase(posted_.begin());
        ++next_start;
      }
      // Stopping with nothing started or startable; a sequence number taken
      // whose op was never posted (its node never ran) cannot start either.
      if (stop_ && active.empty() && startable.empty()) break;
    }
    for (Op& op : startable) {
      if (op.run && active.empty()) {
        op.finish(op.run(comm));
        std::lock_guard g(mu_);
        ++finished_;
        continue;
      }
      Started s;
      const int rc = op.start(comm, s.requests);
      if (rc != MPI_SUCCESS) {
        // Complete what did start, so no request is left behind.
        if (!s.requests.empty()) MPI_Waitall(static_cast<int>(s.requests.size()), s.requests.data(), MPI_STATUSES_IGNORE);
        op.finish(rc);
        std::lock_guard g(mu_);
        ++finished_;
        continue;
      }
      s.finish = std::move(op.finish);
      active.push_back(std::move(s));
    }
    for (std::size_t i = 0; i < active.size();) {
      int done = 0;
      const int rc = MPI_Testall(static_cast<int>(active[i].requests.size()), active[i].requests.data(), &done,
                                 MPI_STATUSES_IGNORE);
      if (done || rc != MPI_SUCCESS) {
        active[i].finish(done ? MPI_SUCCESS : rc);
        active.erase(active.begin() + static_cast<std::ptrdiff_t>(i));
        std::lock_guard g(mu_);
        ++finished_;
      } else {
        ++i;
      }
    }
    if (!active.empty() && startable.empty()) {
      // Polling drives MPI's progress, but on a small machine it competes
      // with the workers for a core: spin briefly, then poll every 20 us
      // (a post wakes the thread at once).
      if (++idle_polls < 4096) {
        std::this_thread::yield();
      } else {
        std::unique_lock lk(mu_);
        cv_.wait_for(lk, std::chrono::microseconds(20),
                     [&] { return stop_ || (!posted_.empty() && posted_.begin()->first == next_start); });
      }
    } else {
      idle_polls = 0;
    }
  }
  MPI_Comm_free(&comm);
  MPI_Finalize();
}

}  // namespace lazydag::mpi
