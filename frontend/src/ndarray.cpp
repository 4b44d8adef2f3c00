// NDArray: record-time checks (shapes, dtypes, devices), storage and views,
// and the recording of every operator as an engine node running a kernel.
#include <lazydag/ndarray.hpp>

#include <lazydag/engine/stream.hpp>
#include <lazydag/ops/kernels.hpp>

#include "autograd_internal.hpp"
#include "host_pool.hpp"
#include "object_pool.hpp"
#include "internal.hpp"
#include "storage.hpp"
#include "fusion.hpp"

#include <array>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <sstream>
#include <utility>

namespace lazydag {

Device cpu(int id) {
  if (id < 0) throw InvalidArgument("cpu(" + std::to_string(id) + "): device ids are >= 0");
  return Device{DeviceKind::kCpu, id};
}

Device sim(int id) {
  if (id < 0) throw InvalidArgument("sim(" + std::to_string(id) + "): device ids are >= 0");
  return Device{DeviceKind::kSim, id};
}

Device gpu(int id) {
  if (id < 0) throw InvalidArgument("gpu(" + std::to_string(id) + "): device ids are >= 0");
  return Device{DeviceKind::kGpu, id};
}

Device parse_device(std::string_view text) {
  auto fail = [&]() -> Device {
    throw InvalidArgument("'" + std::string(text) + "' is not a device (expected cpu(N), sim(N) or gpu(N))");
  };
  DeviceKind kind{};
  std::string_view rest;
  for (auto [name, k] : {std::pair{std::string_view("cpu"), DeviceKind::kCpu},
                         std::pair{std::string_view("sim"), DeviceKind::kSim},
                         std::pair{std::string_view("gpu"), DeviceKind::kGpu}}) {
    if (text.substr(0, 3) == name) {
      kind = k;
      rest = text.substr(3);
      break;
    }
  }
  if (text.size() < 3 || (text.substr(0, 3) != "cpu" && text.substr(0, 3) != "sim" && text.substr(0, 3) != "gpu")) {
    return fail();
  }
  int id = 0;
  if (!rest.empty()) {
    if (rest.size() < 3 || rest.front() != '(' || rest.back() != ')') return fail();
    id = 0;
    for (char c : rest.substr(1, rest.size() - 2)) {
      if (c < '0' || c > '9' || id > 1000) return fail();
      id = id * 10 + (c - '0');
    }
  }
  return Device{kind, id};
}

namespace {
std::atomic<std::uint32_t> g_default_device{0xFFFFFFFFU};  // kind << 16 | id; unset
}  // namespace

Device default_device() {
  std::uint32_t v = g_default_device.load(std::memory_order_acquire);
  if (v == 0xFFFFFFFFU) {
    Device d = cpu();
    if (const char* e = std::getenv("LAZYDAG_DEFAULT_DEVICE"); e != nullptr && *e != '\0') d = parse_device(e);
    const std::uint32_t enc = static_cast<std::uint32_t>(d.kind) << 16 | static_cast<std::uint32_t>(d.id);
    g_default_device.compare_exchange_strong(v, enc, std::memory_order_acq_rel);
    v = g_default_device.load(std::memory_order_acquire);
  }
  return Device{static_cast<DeviceKind>(v >> 16), static_cast<int>(v & 0xFFFFU)};
}

void set_default_device(Device dev) {
  if (dev.id < 0 || dev.id > 0xFFFF) throw InvalidArgument("set_default_device: bad id in " + dev.str());
  g_default_device.store(static_cast<std::uint32_t>(dev.kind) << 16 | static_cast<std::uint32_t>(dev.id),
                         std::memory_order_release);
}

namespace detail {

std::uint64_t storage_version(const ArrayState& s) noexcept {
  return s.storage->version.load(std::memory_order_relaxed);
}

std::uint64_t grad_generation(const ArrayState& s) noexcept {
  return s.storage->grad_generation.load(std::memory_order_relaxed);
}

std::uint64_t bump_grad_generation(const ArrayState& s) noexcept {
  return s.storage->grad_generation.fetch_add(1, std::memory_order_relaxed) + 1;
}

std::uint64_t storage_mark() noexcept { return t_storages_made; }

bool made_since(const ArrayState& s, std::uint64_t mark) noexcept {
  return s.storage->made_by == t_thread_number && s.storage->made_at > mark;
}

const void* storage_id(const ArrayState& s) noexcept { return s.storage.get(); }

bool covers_storage(const ArrayState& s) {
  return s.offset == 0 && s.strides == contiguous_strides(s.shape) &&
         static_cast<std::size_t>(numel(s.shape)) * size_of(s.dtype) == s.storage->bytes;
}

}  // namespace detail

namespace {

using detail::Access;
using detail::ArrayState;
using detail::StatePtr;
using detail::Storage;
namespace grad = detail::grad;

ops::TensorView view(const ArrayState& s) {
  return ops::TensorView{s.storage->data, s.dtype, s.shape, s.strides, s.offset};
}

// Refuses a device this op cannot use here (BackendUnavailable names why),
// before anything is recorded.
void check_device(Device dev, const char* op) {
  if (dev.id < 0) throw InvalidArgument(std::string(op) + ": device ids are >= 0, got " + dev.str());
  if (!dev.is_stream_device()) return;
  try {
    (void)nd::engine().stream_device(dev);
  } catch (const BackendUnavailable& e) {
    throw BackendUnavailable(std::string(op) + ": " + e.what());
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(std::string(op) + ": " + e.what());
  }
}

engine::PushOptions push_options(Device dev, const char* name, std::size_t bytes,
                                 engine::StreamKind stream = engine::StreamKind::kCompute) {
  engine::PushOptions o;
  o.device = dev;
  o.name = name;
  o.stream = dev.is_stream_device() ? stream : engine::StreamKind::kCompute;
  o.bytes = dev.is_stream_device() ? bytes : 0;
  return o;
}

StatePtr new_array(const Shape& shape, DType t, Device dev, const char* op) {
  // A fused group spans consecutive elementwise ops: an op with an array
  // of its own records the thread's group first.
  detail::fusion::flush_mine();
  check_shape(shape, op);  // the byte count below cannot overflow
  check_device(dev, op);
  const std::size_t bytes = static_cast<std::size_t>(numel(shape)) * size_of(t);
  auto st = detail::make_pooled<ArrayState>();
  try {
    st->storage = detail::make_pooled<Storage>(nd::engine(), dev, bytes);
  } catch (const std::bad_alloc&) {
    throw Error(std::string(op) + ": out of memory allocating " + std::to_string(bytes) +
                " bytes for a " + std::string(to_string(t)) + " array of shape " + to_string(shape) +
                " on " + dev.str());
  }
  st->shape = shape;
  st->strides = contiguous_strides(shape);
  st->dtype = t;
  return st;
}

StatePtr make_view(const StatePtr& base, Shape shape, Strides strides, std::int64_t offset) {
  auto st = detail::make_pooled<ArrayState>();
  st->storage = base->storage;
  st->shape = std::move(shape);
  st->strides = std::move(strides);
  st->offset = offset;
  st->dtype = base->dtype;
  st->base = base->base.expired() ? std::weak_ptr<const ArrayState>(base) : base->base;
  return st;
}

bool contiguous(const ArrayState& s) { return s.strides == contiguous_strides(s.shape); }

using detail::covers_storage;

// Operands must share one device: data never moves implicitly.
Device common_device(std::initializer_list<const ArrayState*> xs, const char* op) {
  const Device d = (*xs.begin())->storage->device;
  for (const ArrayState* x : xs) {
    if (!(x->storage->device == d)) {
      std::string msg = std::string(op) + ": operands live on different devices (";
      int i = 0;
      for (const ArrayState* y : xs) {
        msg += (i ? ", " : "") + std::string("operand ") + std::to_string(i) + " on " +
               y->storage->device.str();
        ++i;
      }
      throw DeviceMismatch(msg + "); move one with copyto(device) or as_in_device(device)");
    }
  }
  return d;
}

void same_dtype(const ArrayState& a, const ArrayState& b, const char* op) {
  if (a.dtype != b.dtype) {
    throw InvalidArgument(std::string(op) + ": dtype mismatch, " + std::string(to_string(a.dtype)) +
                          " vs " + std::string(to_string(b.dtype)) +
                          " (lazydag does not promote; convert one with astype)");
  }
}

void numeric(const ArrayState& a, const char* op) {
  if (a.dtype == DType::kBool) {
    throw InvalidArgument(std::string(op) + ": not defined for bool arrays (use astype)");
  }
}

void floating(const ArrayState& a, const char* op) {
  if (!is_floating(a.dtype)) {
    throw InvalidArgument(std::string(op) + ": needs a float32 or float64 array, got " +
                          std::string(to_string(a.dtype)) + " (use astype)");
  }
}

// The arrays a recorded kernel reads (at most three), for the call.
struct Inputs {
  static constexpr std::size_t kMax = 3;
  std::array<const ArrayState*, kMax> items{};
  std::size_t count = 0;
  const ArrayState* operator[](std::size_t i) const { return items[i]; }
  [[nodiscard]] std::size_t size() const { return count; }
};

// The same arrays kept alive by a node that runs after its push returned.
// Inline, so recording an op allocates nothing beyond its output.
struct KeptInputs {
  std::array<StatePtr, Inputs::kMax> items;
  std::size_t count = 0;
  [[nodiscard]] Inputs borrow() const {
    Inputs in;
    for (; in.count < count; ++in.count) in.items[in.count] = items[in.count].get();
    return in;
  }
};

// The inputs of record and elementwise are references: a list of
// StatePtr copies cost an atomic increment and decrement per input and
// call (perf of a recorded x + 1 had 13% of its samples in shared_ptr
// reference counts).
using StateRefs = std::initializer_list<std::reference_wrapper<const StatePtr>>;

// Records one node reading `inputs` and writing `out`; `kernel` gets views.
// A node the engine runs before push returns (small, ready, under eager)
// runs on borrowed states; only one that runs later keeps copies of the
// states' pointers (perf of a recorded x + 1 had 13% of its samples in
// those copies' reference counts and the moves of the function holding them).
template <class Kernel>
void record(const char* name, StateRefs inputs, const StatePtr& out, Kernel kernel) {
  if (inputs.size() > Inputs::kMax) throw Error(std::string(name) + ": too many inputs for one kernel");
  std::array<engine::Var, Inputs::kMax> reads;
  Inputs in;
  std::size_t touched = out->storage->bytes;  // the cost hint: every buffer, whole
  for (const StatePtr& a : inputs) {
    reads[in.count] = a->storage->var;
    in.items[in.count++] = a.get();
    touched += a->storage->bytes;
  }
  const engine::Var writes[] = {out->storage->var};
  engine::PushOptions options = push_options(out->storage->device, name, out->storage->bytes);
  options.cost_bytes = std::max<std::size_t>(touched, 1);
  auto run = [&](const engine::RunContext& ctx) {
    out->storage->ensure(ctx);
    kernel(ctx, in, *out);
  };
  auto keep = [&]() -> engine::Function {
    KeptInputs kept;
    for (const StatePtr& a : inputs) kept.items[kept.count++] = a;
    return [kept = std::move(kept), out, kernel](const engine::RunContext& ctx) {
      out->storage->ensure(ctx);
      kernel(ctx, kept.borrow(), *out);
    };
  };
  nd::engine().push_or_run(run, keep, std::span<const engine::Var>(reads.data(), in.count), writes, options);
}

// A contiguous version of `a`: `a` itself, or a recorded copy.
StatePtr dense(const StatePtr& a) {
  if (contiguous(*a)) return a;
  StatePtr out = new_array(a->shape, a->dtype, a->storage->device, "copy");
  record("copy", {a}, out, [](const engine::RunContext& ctx, const Inputs& in, const ArrayState& o) {
    ops::copy_cast(ctx, view(*in[0]), view(o));
  });
  return out;
}

// An elementwise op's result: joined to the thread's fused group when
// fusion is on for `dev`, otherwise a new array that `rec` records (after
// the inputs' groups are recorded). Ops that can fail at run time (integer
// division) are not fused: a fused node fails as a whole.
template <class Rec>
StatePtr elementwise(ops::FusedStep step, StateRefs inputs, const Shape& shape, DType t, Device dev,
                     const char* name, Rec rec, bool fusible = true) {
  if (fusible && detail::fusion::active()) {
    check_shape(shape, name);
    return detail::fusion::append(step, std::span(inputs.begin(), inputs.size()), shape, t, dev, name);
  }
  for (const StatePtr& p : inputs) detail::fusion::settle(*p);
  StatePtr out = new_array(shape, t, dev, name);
  rec(out);
  return out;
}

ops::FusedStep fused_step(ops::FusedStep::Kind kind, std::uint8_t op, double scalar = 0, bool scalar_first = false) {
  ops::FusedStep s;
  s.kind = kind;
  s.op = op;
  s.scalar = scalar;
  s.scalar_first = scalar_first;
  return s;
}

NDArray unary_op(ops::UnaryOp op, const NDArray& x) {
  const char* name = to_string(op).data();
  const StatePtr& a = Access::meta(x, name);
  numeric(*a, name);
  if (op != ops::UnaryOp::kNeg && op != ops::UnaryOp::kAbs && op != ops::UnaryOp::kRelu) {
    floating(*a, name);
  }
  StatePtr out = elementwise(
      fused_step(ops::FusedStep::Kind::kUnary, static_cast<std::uint8_t>(op)), {a}, a->shape, a->dtype,
      a->storage->device, name, [&](const StatePtr& o) {
        record(name, {a}, o, [op](const engine::RunContext& ctx, const Inputs& in, const ArrayState& r) {
          ops::unary(ctx, op, view(*in[0]), view(r));
        });
      });
  NDArray r = Access::wrap(std::move(out));
  grad::unary(op, x, r);
  return r;
}

void check_binary(ops::BinaryOp op, const ArrayState& a, const char* name) {
  numeric(a, name);
  if (op == ops::BinaryOp::kPow) floating(a, name);
}

NDArray binary_op(ops::BinaryOp op, const NDArray& x, const NDArray& y) {
  const char* name = to_string(op).data();
  const StatePtr& a = Access::meta(x, name);
  const StatePtr& b = Access::meta(y, name);
  const Device dev = common_device({a.get(), b.get()}, name);
  same_dtype(*a, *b, name);
  check_binary(op, *a, name);
  const bool can_fail = op == ops::BinaryOp::kDiv && !is_floating(a->dtype);
  StatePtr out = elementwise(
      fused_step(ops::FusedStep::Kind::kBinary, static_cast<std::uint8_t>(op)), {a, b},
      ops::broadcast_shapes(a->shape, b->shape, name), a->dtype, dev, name,
      [&](const StatePtr& o) {
        record(name, {a, b}, o, [op](const engine::RunContext& ctx, const Inputs& in, const ArrayState& r) {
          ops::binary(ctx, op, view(*in[0]), view(*in[1]), view(r));
        });
      },
      !can_fail);
  NDArray r = Access::wrap(std::move(out));
  grad::binary(op, x, y, r);
  return r;
}

// The scalar takes the array's dtype: an integer division by a scalar that
// truncates to 0 is refused here, saying so, rather than failing later.
void check_scalar_divisor(ops::BinaryOp op, const ArrayState& a, double s, const char* name) {
  if (op != ops::BinaryOp::kDiv || is_floating(a.dtype)) return;
  if (std::isnan(s) || std::trunc(s) == 0.0) {
    std::ostringstream v;
    v << s;
    throw InvalidArgument(std::string(name) + ": integer division by zero: the scalar " + v.str() +
                          " was converted to " + std::string(to_string(a.dtype)) +
                          " 0 (the scalar takes the array's dtype; use astype for a float division)");
  }
}

NDArray scalar_op(ops::BinaryOp op, const NDArray& x, double s, bool scalar_first) {
  const char* name = to_string(op).data();
  const StatePtr& a = Access::meta(x, name);
  check_binary(op, *a, name);
  if (!scalar_first) check_scalar_divisor(op, *a, s, name);
  // scalar / array divides by the array's elements: an integer zero fails.
  const bool can_fail = op == ops::BinaryOp::kDiv && scalar_first && !is_floating(a->dtype);
  StatePtr out = elementwise(
      fused_step(ops::FusedStep::Kind::kScalar, static_cast<std::uint8_t>(op), s, scalar_first), {a}, a->shape,
      a->dtype, a->storage->device, name,
      [&](const StatePtr& o) {
        record(name, {a}, o,
               [op, s, scalar_first](const engine::RunContext& ctx, const Inputs& in, const ArrayState& r) {
                 ops::binary_scalar(ctx, op, view(*in[0]), s, scalar_first, view(r));
               });
      },
      !can_fail);
  NDArray r = Access::wrap(std::move(out));
  grad::scalar(op, x, s, scalar_first, r);
  return r;
}

NDArray compare_op(ops::CompareOp op, const NDArray& x, const NDArray& y) {
  const char* name = to_string(op).data();
  const StatePtr& a = Access::meta(x, name);
  const StatePtr& b = Access::meta(y, name);
  const Device dev = common_device({a.get(), b.get()}, name);
  same_dtype(*a, *b, name);
  StatePtr out = elementwise(
      fused_step(ops::FusedStep::Kind::kCompare, static_cast<std::uint8_t>(op)), {a, b},
      ops::broadcast_shapes(a->shape, b->shape, name), DType::kBool, dev, name, [&](const StatePtr& o) {
        record(name, {a, b}, o, [op](const engine::RunContext& ctx, const Inputs& in, const ArrayState& r) {
          ops::compare(ctx, op, view(*in[0]), view(*in[1]), view(r));
        });
      });
  return Access::wrap(std::move(out));
}

NDArray compare_scalar_op(ops::CompareOp op, const NDArray& x, double s) {
  const char* name = to_string(op).data();
  const StatePtr& a = Access::meta(x, name);
  StatePtr out = elementwise(
      fused_step(ops::FusedStep::Kind::kCompareScalar, static_cast<std::uint8_t>(op), s), {a}, a->shape,
      DType::kBool, a->storage->device, name, [&](const StatePtr& o) {
        record(name, {a}, o, [op, s](const engine::RunContext& ctx, const Inputs& in, const ArrayState& r) {
          ops::compare_scalar(ctx, op, view(*in[0]), s, view(r));
        });
      });
  return Access::wrap(std::move(out));
}

// In place: a = op(a, b). The result must keep a's shape. A b that views a's
// buffer differently is copied first so the kernel never reads what it wrote.
void inplace_op(ops::BinaryOp op, const StatePtr& a, StatePtr b, const char* name) {
  const Device dev = common_device({a.get(), b.get()}, name);
  (void)dev;
  same_dtype(*a, *b, name);
  check_binary(op, *a, name);
  const Shape s = ops::broadcast_shapes(a->shape, b->shape, name);
  if (s != a->shape) {
    throw InvalidArgument(std::string(name) + ": the result shape " + to_string(s) +
                          " differs from the target's " + to_string(a->shape));
  }
  if (grad::inplace_wanted(*a, {b.get()})) {
    grad::check_rebase(*a, name);
    grad::rebase(Access::wrap(a), binary_op(op, Access::wrap(a), Access::wrap(b)));
    return;
  }
  if (b->storage == a->storage &&
      (b->offset != a->offset || b->strides != a->strides || b->shape != a->shape)) {
    b = Access::state(Access::wrap(b).copy(), name);
  }
  a->storage->version.fetch_add(1, std::memory_order_relaxed);
  record(name, {a, b}, a, [op](const engine::RunContext& ctx, const Inputs& in, const ArrayState& o) {
    ops::binary(ctx, op, view(*in[0]), view(*in[1]), view(o));
  });
}

void inplace_scalar(ops::BinaryOp op, const StatePtr& a, double s, const char* name) {
  check_binary(op, *a, name);
  check_scalar_divisor(op, *a, s, name);
  if (grad::inplace_wanted(*a, {})) {
    grad::check_rebase(*a, name);
    grad::rebase(Access::wrap(a), scalar_op(op, Access::wrap(a), s, false));
    return;
  }
  a->storage->version.fetch_add(1, std::memory_order_relaxed);
  record(name, {a}, a, [op, s](const engine::RunContext& ctx, const Inputs& in, const ArrayState& o) {
    ops::binary_scalar(ctx, op, view(*in[0]), s, false, view(o));
  });
}

NDArray reduce_op(ops::ReduceOp op, const NDArray& x, bool all, int axis, bool keepdims) {
  const char* name = to_string(op).data();
  const StatePtr& a0 = Access::state(x, name);
  if (a0->dtype == DType::kBool && (op == ops::ReduceOp::kSum || op == ops::ReduceOp::kMean)) {
    // As NumPy: the sum of a bool array counts its true elements (int64),
    // the mean is the fraction that is true (float64).
    return reduce_op(op, x.astype(op == ops::ReduceOp::kSum ? DType::kInt64 : DType::kFloat64), all, axis, keepdims);
  }
  numeric(*a0, name);
  const int rank = static_cast<int>(a0->shape.size());
  if (!all) axis = ops::normalize_axis(axis, rank, name);
  std::int64_t len = 1;
  for (int d = 0; d < rank; ++d) len *= (all || d == axis) ? a0->shape[d] : 1;
  if (len == 0 && op != ops::ReduceOp::kSum && op != ops::ReduceOp::kMean) {
    throw InvalidArgument(std::string(name) + ": reduction of an empty " +
                          (all ? std::string("array") : "axis") + " of shape " +
                          to_string(a0->shape) + " has no identity");
  }
  DType t = a0->dtype;
  if (op == ops::ReduceOp::kArgmax) t = DType::kInt64;
  if (op == ops::ReduceOp::kMean && !is_floating(t)) t = DType::kFloat64;
  StatePtr a = dense(a0);
  StatePtr out = new_array(ops::reduced_shape(a->shape, all, axis, keepdims), t,
                           a->storage->device, name);
  record(name, {a}, out, [op, all, axis](const engine::RunContext& ctx, const Inputs& in, const ArrayState& o) {
    ops::reduce(ctx, op, view(*in[0]), all, axis, view(o));
  });
  NDArray r = Access::wrap(std::move(out));
  grad::reduce(op, x, all, axis, keepdims, r);
  return r;
}

}  // namespace

// ---- NDArray members ---------------------------------------------------------

const Shape& NDArray::shape() const { return Access::meta(*this, "shape")->shape; }
DType NDArray::dtype() const { return Access::meta(*this, "dtype")->dtype; }
Device NDArray::device() const { return Access::meta(*this, "device")->storage->device; }
int NDArray::ndim() const { return static_cast<int>(shape().size()); }
std::int64_t NDArray::size() const { return numel(shape()); }
bool NDArray::is_contiguous() const { return contiguous(*Access::meta(*this, "is_contiguous")); }
bool NDArray::shares_storage_with(const NDArray& other) const {
  return Access::meta(*this, "shares_storage_with")->storage ==
         Access::meta(other, "shares_storage_with")->storage;
}
engine::Var NDArray::var() const { return Access::state(*this, "var")->storage->var; }

void NDArray::wait_to_read(std::source_location where) const {
  nd::engine().wait_to_read(Access::state(*this, "wait_to_read")->storage->var,
                            engine::CallSite{engine::BlockingCall::kWaitToRead, where});
}
void NDArray::wait_to_write(std::source_location where) const {
  nd::engine().wait_to_write(Access::state(*this, "wait_to_write")->storage->var,
                             engine::CallSite{engine::BlockingCall::kWaitToWrite, where});
}

HostBuffer NDArray::host_buffer(bool writable, std::source_location where) const {
  const StatePtr& s = Access::state(*this, "host_buffer");
  if (s->storage->device.is_stream_device()) {
    throw InvalidArgument("host_buffer: the array is on " + s->storage->device.str() +
                          ", whose memory the host cannot read; data never moves between devices "
                          "implicitly: export a.copyto(cpu()) instead");
  }
  if (writable) {
    wait_to_write(where);
    s->storage->version.fetch_add(1, std::memory_order_relaxed);
  } else {
    wait_to_read(where);
  }
  HostBuffer b;
  b.data = static_cast<unsigned char*>(s->storage->data) + static_cast<std::size_t>(s->offset) * size_of(s->dtype);
  b.shape = s->shape;
  b.strides = s->strides;
  b.dtype = s->dtype;
  b.keep_alive = s;
  return b;
}

void NDArray::read_into(void* dst, DType expected, std::int64_t expected_size, const char* call,
                        const engine::CallSite& site) const {
  const StatePtr& s = Access::state(*this, call);
  if (expected != s->dtype) {
    throw InvalidArgument(std::string(call) + "<" + std::string(to_string(expected)) + ">: the array is " +
                          std::string(to_string(s->dtype)) + " (use astype)");
  }
  const std::int64_t n = numel(s->shape);
  if (expected_size >= 0 && n != expected_size) {
    throw InvalidArgument(std::string(call) + ": needs an array of exactly one element, got shape " +
                          to_string(s->shape));
  }
  if (s->storage->device.is_stream_device()) {
    // A blocker on a device array: one recorded copy to the host, one wait.
    copyto(cpu()).read_into(dst, expected, expected_size, call, site);
    return;
  }
  nd::engine().wait_to_read(s->storage->var, site);
  ops::TensorView out{dst, s->dtype, s->shape, contiguous_strides(s->shape), 0};
  ops::cpu::copy_cast(view(*s), out);
}

NDArray NDArray::copy() const {
  const StatePtr& a = Access::state(*this, "copy");
  StatePtr out = new_array(a->shape, a->dtype, a->storage->device, "copy");
  record("copy", {a}, out, [](const engine::RunContext& ctx, const Inputs& in, const ArrayState& o) {
    ops::copy_cast(ctx, view(*in[0]), view(o));
  });
  NDArray r = Access::wrap(std::move(out));
  grad::same_values("copy", *this, r);
  return r;
}

NDArray NDArray::astype(DType t) const {
  const StatePtr& a = Access::meta(*this, "astype");
  StatePtr out = elementwise(
      fused_step(ops::FusedStep::Kind::kCast, 0), {a}, a->shape, t, a->storage->device, "astype",
      [&](const StatePtr& o) {
        record("astype", {a}, o, [](const engine::RunContext& ctx, const Inputs& in, const ArrayState& r) {
          ops::copy_cast(ctx, view(*in[0]), view(r));
        });
      });
  NDArray r = Access::wrap(std::move(out));
  grad::same_values("astype", *this, r);
  return r;
}

// Copies between devices, all recorded, none implicit:
//   cpu(i) -> cpu(j): a CPU op;
//   cpu -> sim/gpu: an op on the target's copy-in stream (through pinned
//     staging on a gpu);
//   sim/gpu -> cpu: an op on the source's copy-out stream into staging
//     memory, then a CPU op from staging into the array (the host never
//     waits on the device for it: it is a completion edge);
//   sim(i) -> sim(j), gpu(i) -> gpu(j): a peer copy on the target's copy-in
//     stream, ordered after the source's producer by an event;
//   sim <-> gpu: through the host (two of the above).
namespace {
NDArray copy_to_device(const NDArray& self, Device dev) {
  const StatePtr& a0 = Access::state(self, "copyto");
  check_device(dev, "copyto");
  const Device src = a0->storage->device;
  if (src == dev || (!src.is_stream_device() && !dev.is_stream_device())) {
    StatePtr out = new_array(a0->shape, a0->dtype, dev, "copyto");
    record("copyto", {a0}, out, [](const engine::RunContext& ctx, const Inputs& in, const ArrayState& o) {
      ops::copy_cast(ctx, view(*in[0]), view(o));
    });
    return Access::wrap(std::move(out));
  }
  if (src.is_stream_device() && dev.is_stream_device() && src.kind != dev.kind) {
    return copy_to_device(copy_to_device(self, cpu()), dev);
  }
  const StatePtr a = dense(a0);  // on the source device
  StatePtr out = new_array(a->shape, a->dtype, dev, "copyto");
  const std::size_t bytes = out->storage->bytes;
  const engine::Var reads[] = {a->storage->var};
  const engine::Var writes[] = {out->storage->var};
  engine::Engine& eng = nd::engine();
  if (dev.is_stream_device()) {
    // host -> device, or a peer copy between two devices of one kind
    eng.push(
        [a, out, bytes, src](const engine::RunContext& ctx) {
          void* dst = out->storage->ensure(ctx);
          const auto* from = static_cast<const unsigned char*>(a->storage->data) +
                             static_cast<std::size_t>(a->offset) * size_of(a->dtype);
          if (src.is_stream_device()) {
            ops::copy_peer(ctx, dst, from, src, bytes);
          } else {
            ops::copy_from_host(ctx, dst, from, bytes);
          }
        },
        reads, writes, push_options(dev, "copyto", bytes, engine::StreamKind::kCopyIn));
    return Access::wrap(std::move(out));
  }
  // device -> host, through a staging buffer ordered by a var of its own.
  // The block goes back when the second op has copied it out, or, when that
  // op never runs (the first failed), with the last closure holding it.
  struct Staging {
    engine::StreamDevice* device = nullptr;
    void* data = nullptr;
    void* stream = nullptr;
    std::size_t bytes = 0;
    Staging() = default;
    Staging(const Staging&) = delete;
    Staging& operator=(const Staging&) = delete;
    ~Staging() {
      if (data != nullptr) device->release_host(data, bytes, stream);
    }
  };
  auto staging = std::make_shared<Staging>();
  staging->bytes = bytes;
  const engine::Var stage_var = eng.new_var();
  const engine::Var stage[] = {stage_var};
  try {
    eng.push(
        [a, staging, bytes](const engine::RunContext& ctx) {
          staging->device = ctx.stream_device;
          staging->stream = ctx.stream;
          staging->data = ctx.stream_device->allocate_host(bytes);
          ops::copy_to_staging(ctx, staging->data,
                               static_cast<const unsigned char*>(a->storage->data) +
                                   static_cast<std::size_t>(a->offset) * size_of(a->dtype),
                               bytes);
        },
        reads, stage, push_options(src, "copyto (device to staging)", bytes, engine::StreamKind::kCopyOut));
    eng.push(
        [staging, out, bytes](const engine::RunContext&) {
          if (bytes != 0) std::memcpy(out->storage->data, staging->data, bytes);
          staging->device->release_host(staging->data, bytes, staging->stream);
          staging->data = nullptr;
        },
        stage, writes, push_options(dev, "copyto (staging to host)", bytes));
  } catch (...) {
    eng.delete_var(stage_var);
    throw;
  }
  eng.delete_var(stage_var);
  return Access::wrap(std::move(out));
}
}  // namespace

NDArray NDArray::copyto(Device dev) const {
  NDArray r = copy_to_device(*this, dev);
  grad::same_values("copyto", *this, r);
  return r;
}

NDArray NDArray::as_in_device(Device dev) const {
  const StatePtr& a = Access::state(*this, "as_in_device");
  if (a->storage->device == dev) return *this;
  return copyto(dev);
}

NDArray NDArray::reshape(const Shape& shape) const {
  const StatePtr& a = Access::state(*this, "reshape");
  Shape s = ops::reshape_shape(a->shape, shape);
  StatePtr base = dense(a);
  NDArray r = Access::wrap(make_view(base, s, contiguous_strides(s), base->offset));
  grad::same_values("reshape", *this, r);
  return r;
}

NDArray NDArray::transpose() const {
  const StatePtr& a = Access::state(*this, "transpose");
  if (a->shape.size() != 2) {
    throw InvalidArgument("transpose(): needs a 2-D array, got shape " + to_string(a->shape) +
                          " (pass a permutation for other ranks)");
  }
  return transpose({1, 0});
}

NDArray NDArray::transpose(const std::vector<int>& perm) const {
  const StatePtr& a = Access::state(*this, "transpose");
  ops::check_permutation(perm, static_cast<int>(a->shape.size()));
  Shape s(perm.size());
  Strides st(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i) {
    s[i] = a->shape[perm[i]];
    st[i] = a->strides[perm[i]];
  }
  NDArray r = Access::wrap(make_view(a, std::move(s), std::move(st), a->offset));
  grad::transpose(*this, perm, r);
  return r;
}

NDArray NDArray::slice(int axis, std::int64_t start, std::int64_t stop) const {
  const StatePtr& a = Access::state(*this, "slice");
  axis = ops::normalize_axis(axis, static_cast<int>(a->shape.size()), "slice");
  const std::int64_t dim = a->shape[axis];
  const std::int64_t b = start < 0 ? start + dim : start;
  const std::int64_t e = stop < 0 ? stop + dim : stop;
  if (b < 0 || e > dim || b > e) {
    throw InvalidArgument("slice: [" + std::to_string(start) + ", " + std::to_string(stop) +
                          ") is out of range for axis " + std::to_string(axis) + " of shape " +
                          to_string(a->shape));
  }
  Shape s = a->shape;
  s[axis] = e - b;
  NDArray r = Access::wrap(make_view(a, std::move(s), a->strides, a->offset + b * a->strides[axis]));
  grad::slice(*this, axis, b, r);
  return r;
}

NDArray NDArray::abs() const { return unary_op(ops::UnaryOp::kAbs, *this); }
NDArray NDArray::exp() const { return unary_op(ops::UnaryOp::kExp, *this); }
NDArray NDArray::log() const { return unary_op(ops::UnaryOp::kLog, *this); }
NDArray NDArray::log1p() const { return unary_op(ops::UnaryOp::kLog1p, *this); }
NDArray NDArray::sqrt() const { return unary_op(ops::UnaryOp::kSqrt, *this); }
NDArray NDArray::tanh() const { return unary_op(ops::UnaryOp::kTanh, *this); }
NDArray NDArray::sigmoid() const { return unary_op(ops::UnaryOp::kSigmoid, *this); }
NDArray NDArray::relu() const { return unary_op(ops::UnaryOp::kRelu, *this); }

NDArray NDArray::sum() const { return reduce_op(ops::ReduceOp::kSum, *this, true, 0, false); }
NDArray NDArray::sum(int axis, bool keepdims) const {
  return reduce_op(ops::ReduceOp::kSum, *this, false, axis, keepdims);
}
NDArray NDArray::mean() const { return reduce_op(ops::ReduceOp::kMean, *this, true, 0, false); }
NDArray NDArray::mean(int axis, bool keepdims) const {
  return reduce_op(ops::ReduceOp::kMean, *this, false, axis, keepdims);
}
NDArray NDArray::max() const { return reduce_op(ops::ReduceOp::kMax, *this, true, 0, false); }
NDArray NDArray::max(int axis, bool keepdims) const {
  return reduce_op(ops::ReduceOp::kMax, *this, false, axis, keepdims);
}
NDArray NDArray::min() const { return reduce_op(ops::ReduceOp::kMin, *this, true, 0, false); }
NDArray NDArray::min(int axis, bool keepdims) const {
  return reduce_op(ops::ReduceOp::kMin, *this, false, axis, keepdims);
}
NDArray NDArray::argmax() const { return reduce_op(ops::ReduceOp::kArgmax, *this, true, 0, false); }
NDArray NDArray::argmax(int axis, bool keepdims) const {
  return reduce_op(ops::ReduceOp::kArgmax, *this, false, axis, keepdims);
}

NDArray& NDArray::assign(const NDArray& o) {
  const StatePtr& a = Access::state(*this, "assign");
  StatePtr b = Access::state(o, "assign");
  (void)common_device({a.get(), b.get()}, "assign");
  same_dtype(*a, *b, "assign");
  const Shape s = ops::broadcast_shapes(a->shape, b->shape, "assign");
  if (s != a->shape) {
    throw InvalidArgument("assign: a source of shape " + to_string(b->shape) +
                          " does not broadcast to the target's " + to_string(a->shape));
  }
  const bool with_grad = grad::inplace_wanted(*a, {b.get()});
  if (with_grad) grad::check_rebase(*a, "assign");
  if (b->storage == a->storage) b = Access::state(Access::wrap(b).copy(), "assign");
  a->storage->version.fetch_add(1, std::memory_order_relaxed);
  auto kernel = [](const engine::RunContext& ctx, const Inputs& in, const ArrayState& o2) {
    ops::copy_cast(ctx, view(*in[0]), view(o2));
  };
  if (covers_storage(*a)) {
    // Every byte of the buffer is overwritten: a pure write, which also
    // clears an error an earlier write left on the array.
    record("assign", {b}, a, kernel);
  } else {
    // A read-modify-write of the buffer: the view leaves the rest as it
    // was, including an error an earlier write left there.
    record("assign", {b, a}, a, kernel);
  }
  if (with_grad) grad::assign(*this, o);
  return *this;
}

NDArray& NDArray::operator+=(const NDArray& o) {
  inplace_op(ops::BinaryOp::kAdd, Access::state(*this, "+="), Access::state(o, "+="), "add_");
  return *this;
}
NDArray& NDArray::operator-=(const NDArray& o) {
  inplace_op(ops::BinaryOp::kSub, Access::state(*this, "-="), Access::state(o, "-="), "sub_");
  return *this;
}
NDArray& NDArray::operator*=(const NDArray& o) {
  inplace_op(ops::BinaryOp::kMul, Access::state(*this, "*="), Access::state(o, "*="), "mul_");
  return *this;
}
NDArray& NDArray::operator/=(const NDArray& o) {
  inplace_op(ops::BinaryOp::kDiv, Access::state(*this, "/="), Access::state(o, "/="), "div_");
  return *this;
}
NDArray& NDArray::operator+=(double s) {
  inplace_scalar(ops::BinaryOp::kAdd, Access::state(*this, "+="), s, "add_");
  return *this;
}
NDArray& NDArray::operator-=(double s) {
  inplace_scalar(ops::BinaryOp::kSub, Access::state(*this, "-="), s, "sub_");
  return *this;
}
NDArray& NDArray::operator*=(double s) {
  inplace_scalar(ops::BinaryOp::kMul, Access::state(*this, "*="), s, "mul_");
  return *this;
}
NDArray& NDArray::operator/=(double s) {
  inplace_scalar(ops::BinaryOp::kDiv, Access::state(*this, "/="), s, "div_");
  return *this;
}

// ---- free operators -------------------------------------------------------

NDArray operator+(const NDArray& a, const NDArray& b) { return binary_op(ops::BinaryOp::kAdd, a, b); }
NDArray operator-(const NDArray& a, const NDArray& b) { return binary_op(ops::BinaryOp::kSub, a, b); }
NDArray operator*(const NDArray& a, const NDArray& b) { return binary_op(ops::BinaryOp::kMul, a, b); }
NDArray operator/(const NDArray& a, const NDArray& b) { return binary_op(ops::BinaryOp::kDiv, a, b); }
NDArray operator+(const NDArray& a, double s) { return scalar_op(ops::BinaryOp::kAdd, a, s, false); }
NDArray operator-(const NDArray& a, double s) { return scalar_op(ops::BinaryOp::kSub, a, s, false); }
NDArray operator*(const NDArray& a, double s) { return scalar_op(ops::BinaryOp::kMul, a, s, false); }
NDArray operator/(const NDArray& a, double s) { return scalar_op(ops::BinaryOp::kDiv, a, s, false); }
NDArray operator+(double s, const NDArray& a) { return scalar_op(ops::BinaryOp::kAdd, a, s, true); }
NDArray operator-(double s, const NDArray& a) { return scalar_op(ops::BinaryOp::kSub, a, s, true); }
NDArray operator*(double s, const NDArray& a) { return scalar_op(ops::BinaryOp::kMul, a, s, true); }
NDArray operator/(double s, const NDArray& a) { return scalar_op(ops::BinaryOp::kDiv, a, s, true); }
NDArray operator-(const NDArray& a) { return unary_op(ops::UnaryOp::kNeg, a); }

NDArray operator==(const NDArray& a, const NDArray& b) { return compare_op(ops::CompareOp::kEq, a, b); }
NDArray operator!=(const NDArray& a, const NDArray& b) { return compare_op(ops::CompareOp::kNe, a, b); }
NDArray operator<(const NDArray& a, const NDArray& b) { return compare_op(ops::CompareOp::kLt, a, b); }
NDArray operator<=(const NDArray& a, const NDArray& b) { return compare_op(ops::CompareOp::kLe, a, b); }
NDArray operator>(const NDArray& a, const NDArray& b) { return compare_op(ops::CompareOp::kGt, a, b); }
NDArray operator>=(const NDArray& a, const NDArray& b) { return compare_op(ops::CompareOp::kGe, a, b); }
NDArray operator==(const NDArray& a, double s) { return compare_scalar_op(ops::CompareOp::kEq, a, s); }
NDArray operator!=(const NDArray& a, double s) { return compare_scalar_op(ops::CompareOp::kNe, a, s); }
NDArray operator<(const NDArray& a, double s) { return compare_scalar_op(ops::CompareOp::kLt, a, s); }
NDArray operator<=(const NDArray& a, double s) { return compare_scalar_op(ops::CompareOp::kLe, a, s); }
NDArray operator>(const NDArray& a, double s) { return compare_scalar_op(ops::CompareOp::kGt, a, s); }
NDArray operator>=(const NDArray& a, double s) { return compare_scalar_op(ops::CompareOp::kGe, a, s); }

namespace detail {

NDArray make_array(const void* data, std::size_t count, DType t, const Shape& shape, Device dev) {
  check_shape(shape, "nd::array");
  if (static_cast<std::uint64_t>(numel(shape)) != count) {
    throw InvalidArgument("nd::array: " + std::to_string(count) + " values do not fill shape " +
                          to_string(shape) + " (" + std::to_string(numel(shape)) + " elements)");
  }
  if (dev.is_stream_device()) {
    check_device(dev, "nd::array");
    return make_array(data, count, t, shape, cpu()).copyto(dev);
  }
  StatePtr out = new_array(shape, t, dev, "nd::array");
  // The buffer is new and no op refers to it yet: fill it right here.
  const auto bytes = static_cast<std::size_t>(numel(shape)) * size_of(t);
  if (bytes != 0) std::memcpy(out->storage->data, data, bytes);
  return Access::wrap(std::move(out));
}

namespace {

// A host op's arrays (reads first), checked before anything is recorded:
// one device that runs host code (a CPU, or also sim unless cpu_only),
// contiguous; the writes are refused in the gradient graph and counted in
// their storage's version.
struct HostOp {
  std::vector<StatePtr> arrays;
  std::vector<engine::Var> reads;
  std::vector<engine::Var> writes;
  engine::PushOptions options;
};

HostOp host_op(const std::string& name, const std::vector<NDArray>& reads, const std::vector<NDArray>& writes,
               bool cpu_only) {
  HostOp op;
  for (const auto& a : reads) op.arrays.push_back(Access::state(a, name.c_str()));
  for (const auto& a : writes) op.arrays.push_back(Access::state(a, name.c_str()));
  if (op.arrays.empty()) throw InvalidArgument(name + ": no arrays");
  const Device dev = op.arrays[0]->storage->device;
  if (dev.kind == DeviceKind::kGpu || (cpu_only && dev.is_stream_device())) {
    throw InvalidArgument(name + ": this host op cannot run on " + dev.str());
  }
  for (const auto& a : op.arrays) {
    if (!(a->storage->device == dev)) {
      throw DeviceMismatch(name + ": arrays on " + dev.str() + " and " + a->storage->device.str());
    }
    if (!contiguous(*a)) throw InvalidArgument(name + ": needs contiguous arrays");
  }
  for (std::size_t i = reads.size(); i < op.arrays.size(); ++i) grad::check_inplace(*op.arrays[i], name.c_str());
  for (std::size_t i = 0; i < op.arrays.size(); ++i) {
    Storage& st = *op.arrays[i]->storage;
    (i < reads.size() ? op.reads : op.writes).push_back(st.var);
    if (i >= reads.size()) st.version.fetch_add(1, std::memory_order_relaxed);
  }
  op.options = push_options(dev, "", 0);
  return op;
}

// Inside the op: each array's first element (a stream device's buffer
// allocated now if this is its first write).
std::vector<void*> pointers(const std::vector<StatePtr>& arrays, const engine::RunContext& ctx) {
  std::vector<void*> ptrs;
  ptrs.reserve(arrays.size());
  for (const auto& a : arrays) {
    ptrs.push_back(static_cast<unsigned char*>(a->storage->ensure(ctx)) +
                   static_cast<std::size_t>(a->offset) * size_of(a->dtype));
  }
  return ptrs;
}

}  // namespace

void record_host_async(const std::string& name, const std::vector<NDArray>& reads,
                       const std::vector<NDArray>& writes,
                       std::function<void(const std::vector<void*>&, const engine::RunContext&, engine::Completion&)> start,
                       bool run_on_failed_input) {
  HostOp op = host_op(name, reads, writes, /*cpu_only=*/true);
  op.options.name = name;
  op.options.run_on_failed_input = run_on_failed_input;
  nd::engine().push_async(
      [arrays = std::move(op.arrays), start = std::move(start)](const engine::RunContext& ctx, engine::Completion& done) {
        start(pointers(arrays, ctx), ctx, done);
      },
      op.reads, op.writes, op.options);
}

NDArray strided_view(const NDArray& a, const Shape& shape, const Strides& strides, std::int64_t offset) {
  return Access::wrap(make_view(Access::state(a, "view"), shape, strides, offset));
}

NDArray empty(const Shape& shape, DType t, Device dev, const char* op) {
  return Access::wrap(new_array(shape, t, dev, op));
}

void record_host_kernel(const char* name, const std::vector<NDArray>& reads, const std::vector<NDArray>& writes,
                        std::function<void(const std::vector<void*>&)> kernel) {
  HostOp op = host_op(name, reads, writes, /*cpu_only=*/false);
  op.options.name = name;
  nd::engine().push(
      [arrays = std::move(op.arrays), kernel = std::move(kernel)](const engine::RunContext& ctx) {
        kernel(pointers(arrays, ctx));
      },
      op.reads, op.writes, op.options);
}

}  // namespace detail

namespace nd {

// Called on every op: one guard check, and the engine's reference kept
// here, not a call into the engine library per op. The first call also
// stops OpenBLAS's idle threads.
engine::Engine& engine() {
  static engine::Engine& e = []() -> engine::Engine& {
    ops::cpu::stop_idle_blas_threads();
    return engine::Engine::get();
  }();
  return e;
}
std::int64_t memory_in_use() noexcept { return detail::g_bytes.load(std::memory_order_relaxed); }
std::int64_t device_memory_in_use(Device dev) {
  if (!dev.is_stream_device()) return memory_in_use();
  return static_cast<std::int64_t>(engine().stream_device(dev).bytes_in_use());
}
std::int64_t memory_cached() { return static_cast<std::int64_t>(detail::HostPool::get().cached_bytes()); }
void release_cached_memory() { detail::HostPool::get().trim(); }
void waitall(std::source_location where) {
  detail::fusion::flush_all();
  engine().waitall(engine::CallSite{engine::BlockingCall::kWaitall, where});
}

NDArray full(const Shape& shape, double value, DType t, Device dev) {
  StatePtr out = new_array(shape, t, dev, "full");
  record("full", {}, out, [value](const engine::RunContext& ctx, const Inputs&, const ArrayState& o) {
    ops::fill(ctx, view(o), value);
  });
  return Access::wrap(std::move(out));
}
NDArray zeros(const Shape& shape, DType t, Device dev) { return full(shape, 0.0, t, dev); }
NDArray ones(const Shape& shape, DType t, Device dev) { return full(shape, 1.0, t, dev); }

NDArray arange(double start, double stop, double step, DType t, Device dev) {
  if (step == 0.0 || !(std::isfinite(start) && std::isfinite(stop) && std::isfinite(step))) {
    throw InvalidArgument("arange: step must be non-zero and the bounds finite");
  }
  const double count = std::ceil((stop - start) / step);
  if (!(count <= static_cast<double>(kMaxElements))) {  // also a NaN or infinite count
    std::ostringstream msg;
    msg << "arange: [" << start << ", " << stop << ") by " << step << " has " << count
        << " elements, more than the maximum of " << kMaxElements;
    throw InvalidArgument(msg.str());
  }
  const auto n = static_cast<std::int64_t>(count > 0 ? count : 0);
  StatePtr out = new_array({n}, t, dev, "arange");
  record("arange", {}, out, [start, step](const engine::RunContext& ctx, const Inputs&, const ArrayState& o) {
    ops::arange(ctx, view(o), start, step);
  });
  return Access::wrap(std::move(out));
}

NDArray random_uniform(const Shape& shape, Device dev, std::uint64_t seed, double low, double high,
                       DType t) {
  StatePtr out = new_array(shape, t, dev, "random_uniform");
  record("random_uniform", {}, out, [seed, low, high](const engine::RunContext& ctx, const Inputs&, const ArrayState& o) {
    ops::random_uniform(ctx, view(o), seed, low, high);
  });
  return Access::wrap(std::move(out));
}

NDArray random_normal(const Shape& shape, Device dev, std::uint64_t seed, double mean, double stddev,
                      DType t) {
  StatePtr out = new_array(shape, t, dev, "random_normal");
  record("random_normal", {}, out, [seed, mean, stddev](const engine::RunContext& ctx, const Inputs&, const ArrayState& o) {
    ops::random_normal(ctx, view(o), seed, mean, stddev);
  });
  return Access::wrap(std::move(out));
}

NDArray neg(const NDArray& a) { return unary_op(ops::UnaryOp::kNeg, a); }
NDArray abs(const NDArray& a) { return unary_op(ops::UnaryOp::kAbs, a); }
NDArray exp(const NDArray& a) { return unary_op(ops::UnaryOp::kExp, a); }
NDArray log(const NDArray& a) { return unary_op(ops::UnaryOp::kLog, a); }
NDArray sqrt(const NDArray& a) { return unary_op(ops::UnaryOp::kSqrt, a); }
NDArray tanh(const NDArray& a) { return unary_op(ops::UnaryOp::kTanh, a); }
NDArray sigmoid(const NDArray& a) { return unary_op(ops::UnaryOp::kSigmoid, a); }
NDArray log1p(const NDArray& a) { return unary_op(ops::UnaryOp::kLog1p, a); }
NDArray relu(const NDArray& a) { return unary_op(ops::UnaryOp::kRelu, a); }
NDArray pow(const NDArray& a, const NDArray& b) { return binary_op(ops::BinaryOp::kPow, a, b); }
NDArray pow(const NDArray& a, double e) { return scalar_op(ops::BinaryOp::kPow, a, e, false); }
NDArray maximum(const NDArray& a, const NDArray& b) { return binary_op(ops::BinaryOp::kMax, a, b); }
NDArray minimum(const NDArray& a, const NDArray& b) { return binary_op(ops::BinaryOp::kMin, a, b); }
NDArray maximum(const NDArray& a, double s) { return scalar_op(ops::BinaryOp::kMax, a, s, false); }
NDArray minimum(const NDArray& a, double s) { return scalar_op(ops::BinaryOp::kMin, a, s, false); }
NDArray clip(const NDArray& a, double low, double high) {
  if (!(low <= high)) {
    std::ostringstream msg;
    msg << "clip: low (" << low << ") must not exceed high (" << high << ")";
    throw InvalidArgument(msg.str());
  }
  return minimum(maximum(a, low), high);
}

NDArray broadcast_to(const NDArray& x, const Shape& shape) {
  const StatePtr& a = Access::state(x, "broadcast_to");
  if (ops::broadcast_shapes(a->shape, shape, "broadcast_to") != shape) {
    throw InvalidArgument("broadcast_to: shape " + to_string(a->shape) + " does not broadcast to " +
                          to_string(shape));
  }
  StatePtr out = new_array(shape, a->dtype, a->storage->device, "broadcast_to");
  record("broadcast_to", {a}, out, [](const engine::RunContext& ctx, const Inputs& in, const ArrayState& o) {
    ops::copy_cast(ctx, view(*in[0]), view(o));
  });
  NDArray r = Access::wrap(std::move(out));
  grad::same_values("broadcast_to", x, r);
  return r;
}

NDArray where(const NDArray& cond, const NDArray& x, const NDArray& y) {
  const StatePtr& c = Access::meta(cond, "where");
  const StatePtr& a = Access::meta(x, "where");
  const StatePtr& b = Access::meta(y, "where");
  const Device dev = common_device({c.get(), a.get(), b.get()}, "where");
  if (c->dtype != DType::kBool) {
    throw InvalidArgument("where: the condition must be a bool array, got " +
                          std::string(to_string(c->dtype)));
  }
  same_dtype(*a, *b, "where");
  Shape s = ops::broadcast_shapes(ops::broadcast_shapes(c->shape, a->shape, "where"), b->shape, "where");
  StatePtr out = elementwise(
      fused_step(ops::FusedStep::Kind::kWhere, 0), {c, a, b}, s, a->dtype, dev, "where", [&](const StatePtr& o) {
        record("where", {c, a, b}, o, [](const engine::RunContext& ctx, const Inputs& in, const ArrayState& r) {
          ops::where(ctx, view(*in[0]), view(*in[1]), view(*in[2]), view(r));
        });
      });
  NDArray r = Access::wrap(std::move(out));
  grad::where(cond, x, y, r);
  return r;
}

NDArray matmul(const NDArray& x, const NDArray& y) {
  const StatePtr& a0 = Access::state(x, "matmul");
  const StatePtr& b0 = Access::state(y, "matmul");
  if (a0->shape.size() == 1 || b0->shape.size() == 1) {
    // NumPy's rule through views: [n] -> [1, n] on the left, [n, 1] on the
    // right, the added axis dropped afterwards (all differentiable).
    const bool left = a0->shape.size() == 1;
    const bool right = b0->shape.size() == 1;
    const NDArray a = left ? x.reshape({1, a0->shape[0]}) : x;
    const NDArray b = right ? y.reshape({b0->shape[0], 1}) : y;
    if (!left && a0->shape.size() == 3 && right) {  // batched matrix @ vector
      const NDArray r = matmul(a, nd::broadcast_to(b, {a0->shape[0], b0->shape[0], 1}));
      return r.reshape({a0->shape[0], a0->shape[1]});
    }
    const NDArray r = matmul(a, b);
    Shape s = r.shape();
    if (right) s.pop_back();
    if (left) s.erase(s.end() - (right ? 1 : 2));
    return r.reshape(s);
  }
  const Device dev = common_device({a0.get(), b0.get()}, "matmul");
  same_dtype(*a0, *b0, "matmul");
  floating(*a0, "matmul");
  Shape s = ops::matmul_shape(a0->shape, b0->shape);
  // BLAS reads transposed and sliced operands in place; others are copied.
  auto gemm_ready = [](const StatePtr& v) { return ops::gemm_layout(v->shape, v->strides).usable ? v : dense(v); };
  StatePtr a = gemm_ready(a0);
  StatePtr b = gemm_ready(b0);
  StatePtr out = new_array(s, a->dtype, dev, "matmul");
  ops::prepare_matmul(a->dtype, dev.kind == DeviceKind::kGpu);
  record("matmul", {a, b}, out, [](const engine::RunContext& ctx, const Inputs& in, const ArrayState& o) {
    ops::matmul(ctx, view(*in[0]), view(*in[1]), view(o));
  });
  NDArray r = Access::wrap(std::move(out));
  grad::matmul(x, y, r);
  return r;
}

NDArray dot(const NDArray& a, const NDArray& b) { return matmul(a, b); }

NDArray concat(const std::vector<NDArray>& arrays, int axis) {
  if (arrays.empty()) throw InvalidArgument("concat: no arrays given");
  std::vector<StatePtr> in;
  for (const auto& a : arrays) in.push_back(Access::state(a, "concat"));
  const StatePtr& first = in[0];
  axis = ops::normalize_axis(axis, static_cast<int>(first->shape.size()), "concat");
  Shape s = first->shape;
  s[axis] = 0;
  for (const auto& a : in) {
    if (!(a->storage->device == first->storage->device)) {
      throw DeviceMismatch("concat: operands live on " + first->storage->device.str() + " and " +
                           a->storage->device.str() + "; move one with copyto(device)");
    }
    same_dtype(*first, *a, "concat");
    bool ok = a->shape.size() == first->shape.size();
    for (std::size_t d = 0; ok && d < s.size(); ++d) {
      ok = static_cast<int>(d) == axis || a->shape[d] == first->shape[d];
    }
    if (!ok) {
      throw InvalidArgument("concat: shapes " + to_string(first->shape) + " and " +
                            to_string(a->shape) + " differ outside axis " + std::to_string(axis));
    }
    s[axis] = checked_dim_sum(s[axis], a->shape[axis], "concat");
  }
  StatePtr out = new_array(s, first->dtype, first->storage->device, "concat");
  std::vector<engine::Var> reads;
  for (const auto& a : in) reads.push_back(a->storage->var);
  const engine::Var writes[] = {out->storage->var};
  nd::engine().push(
      [in, out, axis](const engine::RunContext& ctx) {
        out->storage->ensure(ctx);
        std::int64_t at = 0;
        for (const auto& a : in) {
          ops::TensorView dst = view(*out);
          dst.shape[axis] = a->shape[axis];
          dst.offset += at * dst.strides[axis];
          ops::copy_cast(ctx, view(*a), dst);
          at += a->shape[axis];
        }
      },
      reads, writes, push_options(out->storage->device, "concat", out->storage->bytes));
  NDArray r = Access::wrap(std::move(out));
  grad::concat(arrays, axis, r);
  return r;
}

}  // namespace nd
}  // namespace lazydag
