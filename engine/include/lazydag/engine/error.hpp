// The typed errors every lazydag layer throws; all derive from lazydag::Error.
#pragma once

#include <cstdint>
#include <exception>
#include <stdexcept>
#include <string>

namespace lazydag {

/// Base of every error lazydag throws.
class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Bad input refused at the call site (unknown or deleted var, empty
/// function, bad shape, dtype or axis); nothing was recorded.
class InvalidArgument : public Error {
 public:
  using Error::Error;
};

/// Operands that live on different devices; nothing was recorded.
class DeviceMismatch : public Error {
 public:
  using Error::Error;
};

/// A device kind that this build or this machine cannot run.
class BackendUnavailable : public Error {
 public:
  using Error::Error;
};

/// A failed CUDA runtime or library call: the call, the error's name and
/// the op it served. Thrown through LAZYDAG_CUDA_CHECK.
class CudaError : public Error {
 public:
  /// Which library's status code() is.
  enum class Library : std::uint8_t { kRuntime, kCublas };
  CudaError(int code, const std::string& message, Library library = Library::kRuntime)
      : Error(message), code_(code), library_(library) {}
  /// The failed call's status: a cudaError_t when library() is kRuntime, a
  /// cublasStatus_t when it is kCublas.
  [[nodiscard]] int code() const noexcept { return code_; }
  [[nodiscard]] Library library() const noexcept { return library_; }

 private:
  int code_;
  Library library_;
};

/// A blocking call made while sync debugging is in `error` mode.
class BlockingCallError : public Error {
 public:
  using Error::Error;
};

/// A wait outlived the watchdog (EngineOptions::watchdog_seconds); the
/// message lists the pending nodes it was waiting for.
class WatchdogTimeout : public Error {
 public:
  using Error::Error;
};

/// A recorded op failed (or inherited the failure of an op it depends on).
/// Thrown by the waits; carries the failing op's name and the original
/// exception, which is also nested (std::rethrow_if_nested reaches it).
class OpError : public Error, public std::nested_exception {
 public:
  OpError(std::string op_name, const std::string& cause_message, std::exception_ptr cause)
      : Error("op '" + op_name + "' failed: " + cause_message),
        op_name_(std::move(op_name)),
        cause_(std::move(cause)) {}

  /// Name of the op that threw (the one given in PushOptions::name).
  [[nodiscard]] const std::string& op_name() const noexcept { return op_name_; }
  /// The exception the op threw.
  [[nodiscard]] std::exception_ptr cause() const noexcept { return cause_; }

 private:
  std::string op_name_;
  std::exception_ptr cause_;
};

}  // namespace lazydag
