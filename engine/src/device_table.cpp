#include "device_table.hpp"

#include <string>

#include "cuda_backend.hpp"
#include "node_pool.hpp"
#include "sim_device.hpp"

namespace lazydag::engine::detail {

StreamDevice& DeviceTable::get(Device d) {
  if (d.kind != DeviceKind::kCpu && d.kind != DeviceKind::kSim && d.kind != DeviceKind::kGpu) {
    throw InvalidArgument("stream_device: " + d.str() + " is not a device (unknown device kind " +
                          std::to_string(static_cast<int>(d.kind)) + ")");
  }
  if (d.kind == DeviceKind::kCpu) {
    throw InvalidArgument("stream_device: " + d.str() + " is not a stream device");
  }
  if (d.id < 0 || d.id >= kMaxDevices) {
    throw InvalidArgument(d.str() + ": device ids are in [0, " + std::to_string(kMaxDevices) + ")");
  }
  const std::size_t i = index(d);
  if (StreamDevice* p = devices_[i].load(std::memory_order_acquire)) return *p;
  std::lock_guard lk(make_mu_);
  if (StreamDevice* p = devices_[i].load(std::memory_order_acquire)) return *p;
  std::unique_ptr<StreamDevice> dev;
  if (d.kind == DeviceKind::kSim) {
    dev = std::make_unique<SimDevice>(d.id, default_compute_streams(), sim_delay_us());
  } else {
    dev = make_cuda_device(d.id, default_compute_streams());  // throws BackendUnavailable
  }
  StreamDevice* p = dev.get();
  slots_[i].device = std::move(dev);
  devices_[i].store(p, std::memory_order_release);
  return *p;
}

DeviceTable::StreamUse DeviceTable::last_use(const StreamDevice* d, std::span<VarState* const> writes) {
  StreamUse use;
  auto consider = [&](const Node* p) {
    if (p != nullptr && p->sdev == d && p->stream < d->num_compute_streams() && p->seq > use.seq) {
      use = StreamUse{p->stream, p->seq};
    }
  };
  for (VarState* s : writes) {
    consider(s->last_writer);
    for (const Node* r : s->readers) consider(r);
  }
  return use;
}

int DeviceTable::choose_stream(const Node* n, StreamKind kind, StreamUse written) {
  StreamDevice* d = n->sdev;
  if (kind == StreamKind::kCopyIn) return d->copy_in_stream();
  if (kind == StreamKind::kCopyOut) return d->copy_out_stream();
  StreamUse best = written;
  for (const Node* p : n->preds) {
    if (p->sdev == d && p->stream < d->num_compute_streams() && p->seq > best.seq) best = StreamUse{p->stream, p->seq};
  }
  if (best.seq != 0) return best.stream;
  Slot& slot = slot_of(d->device());
  return static_cast<int>(slot.next_stream.fetch_add(1, std::memory_order_relaxed) %
                          static_cast<std::uint32_t>(d->num_compute_streams()));
}

bool DeviceTable::admit(Node* n) {
  Slot& d = slot_of(n->sdev->device());
  std::lock_guard g(d.mu);
  if (d.in_flight >= max_in_flight_ ||
      (d.in_flight != 0 && d.in_flight_bytes + n->bytes > max_in_flight_bytes_)) {
    n->state.store(NodeState::kDeferred, std::memory_order_relaxed);
    NodePool::retain(n);
    d.held.push_back(n);
    stalls_.fetch_add(1, std::memory_order_relaxed);
    return false;
  }
  ++d.in_flight;
  d.in_flight_bytes += n->bytes;
  return true;
}

void DeviceTable::leave(const Node* n, SmallVector<Node*, 8>& fit) {
  Slot& d = slot_of(n->sdev->device());
  std::lock_guard g(d.mu);
  --d.in_flight;
  d.in_flight_bytes -= n->bytes;
  std::size_t bytes = d.in_flight_bytes;
  std::size_t admitted = 0;
  while (!d.held.empty() && d.in_flight + admitted < max_in_flight_ &&
         (d.in_flight + admitted == 0 || bytes + d.held.front()->bytes <= max_in_flight_bytes_)) {
    bytes += d.held.front()->bytes;
    fit.push_back(d.held.front());
    d.held.pop_front();
    ++admitted;
  }
}

void DeviceTable::close() noexcept {
  for (std::size_t i = 0; i < slots_.size(); ++i) {
    devices_[i].store(nullptr, std::memory_order_release);
    slots_[i].device.reset();
  }
}

}  // namespace lazydag::engine::detail
