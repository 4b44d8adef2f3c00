// MetricLog: the cure for logging a loss to the host every minibatch.
// Appending records an op that stores the value in a buffer on the arrays'
// device; only every `flush_every` appends (or flush()) does the block move
// to the host, in one blocking copy.
#pragma once

#include <cstdint>
#include <functional>
#include <source_location>
#include <span>
#include <string>

#include <lazydag/ndarray.hpp>

namespace lazydag {

class MetricLog {
 public:
  /// Receives each flushed block: the step of its first value, the values.
  using Sink = std::function<void(std::int64_t first_step, std::span<const double> values)>;

  /// Throws InvalidArgument when flush_every < 1 or the sink is empty.
  MetricLog(std::string name, std::int64_t flush_every, Sink sink, Device dev = default_device());
  /// Appends "step,name,value" lines to `csv_path` (header when the file is new).
  MetricLog(std::string name, std::int64_t flush_every, const std::string& csv_path,
            Device dev = default_device());
  /// Flushes what is pending (blocks); an error is printed, not thrown.
  ~MetricLog();
  MetricLog(const MetricLog&) = delete;
  MetricLog& operator=(const MetricLog&) = delete;

  /// Non-blocking unless this append fills the block: records a copy of the
  /// size-1 numeric array `value` (same device) into the device buffer.
  void append(const NDArray& value, std::source_location where = std::source_location::current());
  /// Blocks once (one transfer) when values are pending; none otherwise.
  void flush(std::source_location where = std::source_location::current());

  [[nodiscard]] const std::string& name() const noexcept { return name_; }
  /// Values appended so far (flushed or not).
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }

 private:
  std::string name_;
  std::int64_t flush_every_;
  Sink sink_;
  Device device_;
  NDArray buffer_;  // {flush_every} float64 on device_
  std::int64_t pending_ = 0;
  std::int64_t steps_ = 0;
};

}  // namespace lazydag
