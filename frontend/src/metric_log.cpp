// MetricLog: values appended on the device by recorded ops, moved to the
// host one block at a time.
#include <lazydag/metric_log.hpp>

#include <fstream>
#include <iostream>
#include <memory>

namespace lazydag {

MetricLog::MetricLog(std::string name, std::int64_t flush_every, Sink sink, Device dev)
    : name_(std::move(name)), flush_every_(flush_every), sink_(std::move(sink)), device_(dev) {
  if (flush_every_ < 1) {
    throw InvalidArgument("MetricLog '" + name_ + "': flush_every must be >= 1, got " +
                          std::to_string(flush_every_));
  }
  if (!sink_) throw InvalidArgument("MetricLog '" + name_ + "': empty sink");
  buffer_ = nd::zeros({flush_every_}, DType::kFloat64, device_);
}

namespace {

MetricLog::Sink csv_sink(const std::string& name, const std::string& path) {
  auto out = std::make_shared<std::ofstream>(path, std::ios::app);
  if (!*out) throw InvalidArgument("MetricLog '" + name + "': cannot open " + path);
  if (out->tellp() == 0) *out << "step,name,value\n";
  return [out, name](std::int64_t first, std::span<const double> values) {
    for (std::size_t i = 0; i < values.size(); ++i) {
      *out << first + static_cast<std::int64_t>(i) << ',' << name << ',' << values[i] << '\n';
    }
    out->flush();
  };
}

}  // namespace

MetricLog::MetricLog(std::string name, std::int64_t flush_every, const std::string& csv_path,
                     Device dev)
    : MetricLog(name, flush_every, csv_sink(name, csv_path), dev) {}

MetricLog::~MetricLog() {
  try {
    flush();
  } catch (const std::exception& e) {
    std::cerr << "lazydag: MetricLog '" << name_ << "' could not flush: " << e.what() << '\n';
  }
}

void MetricLog::append(const NDArray& value, std::source_location where) {
  if (value.size() != 1 || value.dtype() == DType::kBool) {
    throw InvalidArgument("MetricLog '" + name_ + "': append needs a numeric array of one element, got " +
                          std::string(to_string(value.dtype())) + " " + to_string(value.shape()));
  }
  if (!(value.device() == device_)) {
    throw DeviceMismatch("MetricLog '" + name_ + "' lives on " + device_.str() + ", the value on " +
                         value.device().str() + "; move it with copyto(device)");
  }
  // The values only: the log keeps no gradient graph alive.
  NDArray v = value.detach();
  if (v.dtype() != DType::kFloat64) v = v.astype(DType::kFloat64);
  buffer_.slice(0, pending_, pending_ + 1).assign(v.reshape({1}));
  ++pending_;
  ++steps_;
  if (pending_ == flush_every_) flush(where);
}

void MetricLog::flush(std::source_location where) {
  if (pending_ == 0) return;
  const std::int64_t n = pending_;
  pending_ = 0;
  const std::vector<double> values = buffer_.slice(0, 0, n).to_vector<double>(where);  // one transfer
  sink_(steps_ - n, values);
}

}  // namespace lazydag
