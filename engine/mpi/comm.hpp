// The communication thread behind lazydag::dist: the one thread that calls
// MPI (it initialises and finalises it: MPI_THREAD_FUNNELED suffices).
//
// Every operation carries a sequence number taken at record time. The
// thread starts operations strictly in that order, whatever order the
// engine ran their nodes in, so every rank issues its collectives in one
// order (MPI requires it; a rank that issued them in readiness order could
// deadlock against another). Starting means issuing non-blocking calls
// (MPI_Iallreduce, ...); the thread then polls every started operation with
// MPI_Testall and reports each completion. No engine worker ever blocks in
// MPI: the engine nodes are async nodes completed from here.
#pragma once

#include <mpi.h>

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace lazydag::mpi {

class Comm {
 public:
  struct Op {
    std::uint64_t seq = 0;
    /// On the comm thread, in sequence order: issue non-blocking calls on
    /// `comm`, appending their requests; returns an MPI error code.
    std::function<int(MPI_Comm comm, std::vector<MPI_Request>& requests)> start;
    /// On the comm thread once every request completed (or start failed):
    /// MPI_SUCCESS or the first error code.
    std::function<void(int error)> finish;
    /// Optional: the whole operation as blocking calls on `comm`, used
    /// instead of `start` when nothing else is in flight on this rank (a
    /// rank with nothing pending owes no other rank progress, so blocking
    /// cannot deadlock). Open MPI's blocking collectives use faster
    /// algorithms than the non-blocking ones, which progress only when
    /// tested. Returns an MPI error code.
    std::function<int(MPI_Comm comm)> run;
  };

  /// The process's communicator, started (MPI initialised on its thread) on
  /// first use. Throws BackendUnavailable when MPI cannot start.
  static Comm& get();
  /// Started and not yet shut down.
  static bool running() noexcept;

  [[nodiscard]] int rank() const noexcept { return rank_; }
  [[nodiscard]] int size() const noexcept { return size_; }
  /// The next sequence number (record order on this process).
  std::uint64_t next_seq();
  /// Hands an operation to the thread. Thread-safe.
  void post(Op op);
  /// Sequence numbers taken and not yet finished.
  [[nodiscard]] std::uint64_t unfinished() const;
  /// Finishes what was posted, stops the thread and finalises MPI. Idempotent.
  void shutdown();
  /// MPI's text for an error code.
  static std::string error_string(int code);

 private:
  Comm();
  void loop();

  int rank_ = 0;
  int size_ = 1;
  std::string init_error_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::uint64_t, Op> posted_;
  std::uint64_t next_seq_ = 0;
  std::uint64_t finished_ = 0;
  bool ready_ = false;
  bool stop_ = false;
  bool stopped_ = false;
  std::thread thread_;
};

}  // namespace lazydag::mpi
