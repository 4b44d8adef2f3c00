// What the frontend's sources share: access to a handle's state, and the
// storage version counter behind autograd's in-place check.
#pragma once

#include <lazydag/ndarray.hpp>

#include <cstdint>
#include <memory>
#include <string>

namespace lazydag::detail {

using StatePtr = std::shared_ptr<const ArrayState>;

struct Access {
  static const StatePtr& state(const NDArray& a, const char* op) {
    if (!a.state_) {
      throw InvalidArgument(std::string(op) + ": use of an empty or moved-from NDArray");
    }
    return a.state_;
  }
  static NDArray wrap(StatePtr s) {
    NDArray a;
    a.state_ = std::move(s);
    return a;
  }
  /// Null for an empty handle.
  static const ArrayState* peek(const NDArray& a) noexcept { return a.state_.get(); }
  static long use_count(const NDArray& a) noexcept { return a.state_.use_count(); }
};

/// How many in-place writes have been recorded into the storage so far.
[[nodiscard]] std::uint64_t storage_version(const ArrayState& s) noexcept;

}  // namespace lazydag::detail
