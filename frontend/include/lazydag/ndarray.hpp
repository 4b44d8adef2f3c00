// NDArray: an n-dimensional array whose every operation is recorded into the
// engine and returns at once. Only the blockers (wait_to_read, item,
// to_vector, printing, nd::waitall) wait for the values.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <source_location>
#include <span>
#include <type_traits>
#include <string>
#include <string_view>
#include <vector>

#include <lazydag/engine/engine.hpp>
#include <lazydag/ops/dtype.hpp>
#include <lazydag/ops/shape.hpp>

namespace lazydag {

using engine::Device;
using engine::DeviceKind;

/// The CPU device `id`. Distinct ids are distinct devices: data does not
/// move between them implicitly, although they share the host's memory.
[[nodiscard]] Device cpu(int id = 0);
/// The emulated stream device `id` (0..7): runs the CPU kernels in stream
/// order on executors of its own, with memory of its own; what a GPU does,
/// on any machine (see docs/devices.md).
[[nodiscard]] Device sim(int id = 0);
/// The CUDA device `id`. Creating the handle never fails; the first op
/// recorded on it throws BackendUnavailable (saying why) when this build or
/// machine cannot run it.
[[nodiscard]] Device gpu(int id = 0);
/// Parses "cpu(0)", "sim(1)", "gpu(0)" (or "cpu", "sim", "gpu" for id 0);
/// throws InvalidArgument otherwise.
[[nodiscard]] Device parse_device(std::string_view text);
/// Where creation functions put arrays when no device is given: cpu(0),
/// or LAZYDAG_DEFAULT_DEVICE, or what set_default_device() set. Thread-safe.
[[nodiscard]] Device default_device();
/// Sets default_device() for the whole process. Thread-safe.
void set_default_device(Device dev);

namespace detail {
struct Storage;
struct AutogradMeta;
/// What an NDArray handle points to: a strided view of a storage buffer.
/// Immutable once made, except for its autograd record; handles share it.
struct ArrayState {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Strides strides;  // in elements
  std::int64_t offset = 0;
  DType dtype = DType::kFloat32;
  /// Set by requires_grad(true) (a leaf) or by a differentiable op whose
  /// input requires grad (its backward node); null otherwise.
  mutable std::shared_ptr<AutogradMeta> autograd;
  /// A view's base: the array it was made from (through other views: the
  /// first, which is no view), while that is alive. A differentiable write
  /// through the view rewrites the base's autograd record.
  std::weak_ptr<const ArrayState> base;
};
struct Access;
}  // namespace detail

/// A CPU array's memory, exported without a copy (NDArray::host_buffer).
struct HostBuffer {
  void* data = nullptr;  ///< the first element
  Shape shape;
  Strides strides;       ///< in elements
  DType dtype = DType::kFloat32;
  /// Keeps the memory alive (the array's storage) for as long as it is held.
  std::shared_ptr<const void> keep_alive;
};

/// A handle to an array. Copying a handle is cheap and shares the storage;
/// `copy()` is a recorded deep copy. Every member function is non-blocking
/// unless its brief says otherwise, and throws at the call site (recording
/// nothing) on bad input: InvalidArgument for shapes, dtypes, axes and empty
/// handles, DeviceMismatch for operands on different devices. A handle may
/// be used from several threads; the arrays are not locked against writes
/// recorded concurrently by different threads (their order is record order).
class NDArray {
 public:
  /// An empty handle: every use throws InvalidArgument.
  NDArray() noexcept = default;

  [[nodiscard]] const Shape& shape() const;
  [[nodiscard]] DType dtype() const;
  [[nodiscard]] Device device() const;
  [[nodiscard]] int ndim() const;
  [[nodiscard]] std::int64_t size() const;
  /// Row-major contiguous (views from transpose or slice may not be).
  [[nodiscard]] bool is_contiguous() const;
  /// True when both handles view the same storage buffer.
  [[nodiscard]] bool shares_storage_with(const NDArray& other) const;
  /// False for a default-constructed or moved-from handle.
  [[nodiscard]] bool valid() const noexcept { return state_ != nullptr; }
  /// The engine var that orders accesses to this array's storage. Taking
  /// it records the fused ops gathered on the array so far; call
  /// nd::flush_fused() before pushing on it after later elementwise ops.
  [[nodiscard]] engine::Var var() const;

  // ---- blockers ----
  // Each is counted by the engine (EngineStats::blocking_calls) and, in
  // sync-debug mode, reported with its call site or refused.

  /// Blocks until every recorded write of this array is done; throws OpError
  /// if one failed.
  void wait_to_read(std::source_location where = std::source_location::current()) const;
  /// Blocks until every recorded read and write of this array is done.
  void wait_to_write(std::source_location where = std::source_location::current()) const;
  /// Blocks; this CPU array's memory without a copy, for exporting it
  /// (Python's buffer protocol, DLPack): waits to read (`writable`: to
  /// write, and counts as an in-place write for autograd). The memory stays
  /// valid while the result's keep_alive is held; writes recorded later
  /// change it when they run. InvalidArgument for an array on a stream
  /// device: data never moves implicitly (export copyto(cpu()) instead).
  [[nodiscard]] HostBuffer host_buffer(bool writable = false,
                                       std::source_location where = std::source_location::current()) const;
  /// Blocks; the single element of a size-1 array. T must match dtype().
  template <class T>
  [[nodiscard]] T item(std::source_location where = std::source_location::current()) const {
    T v{};
    read_into(&v, dtype_of<T>(), 1, "item", {engine::BlockingCall::kItem, where});
    return v;
  }
  /// Blocks; the elements in row-major order. T must match dtype().
  template <class T>
  [[nodiscard]] std::vector<T> to_vector(
      std::source_location where = std::source_location::current()) const {
    return read_all<T>("to_vector", {engine::BlockingCall::kToVector, where});
  }

  // ---- copies and devices ----
  /// A recorded deep copy (new contiguous storage).
  [[nodiscard]] NDArray copy() const;
  /// A recorded conversion into new storage of dtype t.
  [[nodiscard]] NDArray astype(DType t) const;
  /// Always a recorded copy into new storage on `dev` (even the same device).
  [[nodiscard]] NDArray copyto(Device dev) const;
  /// This very array when it already lives on `dev` (nothing recorded),
  /// otherwise copyto(dev).
  [[nodiscard]] NDArray as_in_device(Device dev) const;

  // ---- shape ops ----
  /// A view when contiguous, otherwise a recorded copy. One dim may be -1.
  [[nodiscard]] NDArray reshape(const Shape& shape) const;
  /// 2-D transpose; a view.
  [[nodiscard]] NDArray transpose() const;
  /// Axes permuted; a view.
  [[nodiscard]] NDArray transpose(const std::vector<int>& perm) const;
  /// Elements [start, stop) along `axis` (negative indices count from the
  /// end); a view: writes through it are writes of this array.
  [[nodiscard]] NDArray slice(int axis, std::int64_t start, std::int64_t stop) const;

  // ---- elementwise math as methods (the same as nd::abs(x), ...) ----
  [[nodiscard]] NDArray abs() const;
  [[nodiscard]] NDArray exp() const;
  [[nodiscard]] NDArray log() const;
  [[nodiscard]] NDArray log1p() const;
  [[nodiscard]] NDArray sqrt() const;
  [[nodiscard]] NDArray tanh() const;
  [[nodiscard]] NDArray sigmoid() const;
  [[nodiscard]] NDArray relu() const;

  // ---- reductions (new arrays) ----
  /// A bool array's sum counts its true elements (int64), as NumPy's.
  [[nodiscard]] NDArray sum() const;
  [[nodiscard]] NDArray sum(int axis, bool keepdims = false) const;
  /// float arrays keep their dtype; integer and bool arrays give float64
  /// (a bool array's mean is the fraction that is true).
  [[nodiscard]] NDArray mean() const;
  [[nodiscard]] NDArray mean(int axis, bool keepdims = false) const;
  [[nodiscard]] NDArray max() const;
  [[nodiscard]] NDArray max(int axis, bool keepdims = false) const;
  [[nodiscard]] NDArray min() const;
  [[nodiscard]] NDArray min(int axis, bool keepdims = false) const;
  /// int64 indices (row-major flat index without an axis).
  [[nodiscard]] NDArray argmax() const;
  [[nodiscard]] NDArray argmax(int axis, bool keepdims = false) const;

  // ---- in place (recorded writes of this array) ----
  /// Copies `src` (broadcast to this shape, same dtype and device) into
  /// this array or view.
  NDArray& assign(const NDArray& src);
  NDArray& operator+=(const NDArray& o);
  NDArray& operator-=(const NDArray& o);
  NDArray& operator*=(const NDArray& o);
  NDArray& operator/=(const NDArray& o);
  NDArray& operator+=(double s);
  NDArray& operator-=(double s);
  NDArray& operator*=(double s);
  NDArray& operator/=(double s);

  // ---- autograd (docs/guide.md, "Training") ----
  // Not synchronised: set requires_grad before other threads use the handle.

  /// Makes this float array a leaf whose gradient backward() accumulates
  /// (true), or stops that (false; refused on a non-leaf: use detach()).
  /// InvalidArgument for integer and bool arrays.
  NDArray& requires_grad(bool on);
  /// requires_grad(true), MXNet's spelling.
  NDArray& attach_grad() { return requires_grad(true); }
  /// True for a leaf that requires grad and for the result of a
  /// differentiable op recorded (grad mode on) with such an input.
  [[nodiscard]] bool requires_grad() const;
  /// False only for arrays made by a recorded differentiable op.
  [[nodiscard]] bool is_leaf() const;
  /// The gradient accumulated by backward() (a leaf that requires grad), or
  /// an empty handle before the first backward() and after zero_grad().
  /// Each backward() that reaches the leaf replaces it by a new array
  /// holding the sum (recorded; nothing waits).
  [[nodiscard]] NDArray grad() const;
  /// Forgets the accumulated gradient: the next backward() starts from zero.
  void zero_grad();
  /// The same storage, cut from the gradient graph (a view, no grad).
  [[nodiscard]] NDArray detach() const;
  /// Records the gradients of this array with respect to every leaf that
  /// requires grad and returns at once; reading a gradient waits for it.
  /// `gradient` (same shape, dtype and device) is d(out)/d(this); it may be
  /// omitted for a one-element array (then 1). The arrays ops saved for
  /// backward are released afterwards unless retain_graph is true; a second
  /// backward() through them is then refused. Refused, recording nothing,
  /// when an array saved for backward was modified in place since.
  void backward(const NDArray& gradient = NDArray(), bool retain_graph = false) const;

 private:
  friend struct detail::Access;
  friend std::ostream& operator<<(std::ostream& os, const NDArray& a);
  void read_into(void* dst, DType expected, std::int64_t expected_size, const char* call,
                 const engine::CallSite& site) const;
  // Blocks; every element (std::vector<bool> has no data(): read via a buffer).
  template <class T>
  std::vector<T> read_all(const char* call, const engine::CallSite& site) const {
    std::vector<T> v(static_cast<std::size_t>(size()));
    if constexpr (std::is_same_v<T, bool>) {
      auto tmp = std::make_unique<bool[]>(v.size());
      read_into(tmp.get(), dtype_of<T>(), -1, call, site);
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = tmp[i];
    } else {
      read_into(v.data(), dtype_of<T>(), -1, call, site);
    }
    return v;
  }
  std::shared_ptr<const detail::ArrayState> state_;
};

// Elementwise arithmetic with NumPy broadcasting; both operands of one dtype
// (a double scalar takes the array's dtype).
NDArray operator+(const NDArray& a, const NDArray& b);
NDArray operator-(const NDArray& a, const NDArray& b);
NDArray operator*(const NDArray& a, const NDArray& b);
NDArray operator/(const NDArray& a, const NDArray& b);
NDArray operator+(const NDArray& a, double s);
NDArray operator-(const NDArray& a, double s);
NDArray operator*(const NDArray& a, double s);
NDArray operator/(const NDArray& a, double s);
NDArray operator+(double s, const NDArray& a);
NDArray operator-(double s, const NDArray& a);
NDArray operator*(double s, const NDArray& a);
NDArray operator/(double s, const NDArray& a);
NDArray operator-(const NDArray& a);

// Comparisons give bool arrays.
NDArray operator==(const NDArray& a, const NDArray& b);
NDArray operator!=(const NDArray& a, const NDArray& b);
NDArray operator<(const NDArray& a, const NDArray& b);
NDArray operator<=(const NDArray& a, const NDArray& b);
NDArray operator>(const NDArray& a, const NDArray& b);
NDArray operator>=(const NDArray& a, const NDArray& b);
NDArray operator==(const NDArray& a, double s);
NDArray operator!=(const NDArray& a, double s);
NDArray operator<(const NDArray& a, double s);
NDArray operator<=(const NDArray& a, double s);
NDArray operator>(const NDArray& a, double s);
NDArray operator>=(const NDArray& a, double s);

/// Blocks (it reads the values); NumPy-like text, elided beyond 1000 elements.
std::ostream& operator<<(std::ostream& os, const NDArray& a);

namespace detail {
/// A host copy of `count` values of dtype `t` as an array of `shape` on
/// `dev`; InvalidArgument unless count is the shape's element count.
NDArray make_array(const void* data, std::size_t count, DType t, const Shape& shape, Device dev);
}  // namespace detail

namespace nd {

[[nodiscard]] NDArray zeros(const Shape& shape, DType t = DType::kFloat32, Device dev = default_device());
[[nodiscard]] NDArray ones(const Shape& shape, DType t = DType::kFloat32, Device dev = default_device());
[[nodiscard]] NDArray full(const Shape& shape, double value, DType t = DType::kFloat32,
                           Device dev = default_device());
/// [start, stop) by step, as a 1-D array.
[[nodiscard]] NDArray arange(double start, double stop, double step = 1.0,
                             DType t = DType::kFloat32, Device dev = default_device());
/// An array holding a copy of `data` (row-major) with `shape`.
template <class T>
[[nodiscard]] NDArray array(const std::vector<T>& data, const Shape& shape, Device dev = default_device()) {
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<unsigned char> bytes(data.begin(), data.end());
    return detail::make_array(bytes.data(), bytes.size(), DType::kBool, shape, dev);
  } else {
    return detail::make_array(data.data(), data.size(), dtype_of<T>(), shape, dev);
  }
}
/// Counter-based random numbers: the values depend only on (seed, shape),
/// never on thread count or policy.
[[nodiscard]] NDArray random_uniform(const Shape& shape, Device dev, std::uint64_t seed,
                                     double low = 0.0, double high = 1.0,
                                     DType t = DType::kFloat32);
[[nodiscard]] NDArray random_normal(const Shape& shape, Device dev, std::uint64_t seed,
                                    double mean = 0.0, double stddev = 1.0,
                                    DType t = DType::kFloat32);

[[nodiscard]] NDArray neg(const NDArray& a);
[[nodiscard]] NDArray abs(const NDArray& a);
[[nodiscard]] NDArray exp(const NDArray& a);
[[nodiscard]] NDArray log(const NDArray& a);
[[nodiscard]] NDArray sqrt(const NDArray& a);
[[nodiscard]] NDArray tanh(const NDArray& a);
[[nodiscard]] NDArray sigmoid(const NDArray& a);
/// log(1 + x), accurate for small x (std::log1p); float dtypes.
[[nodiscard]] NDArray log1p(const NDArray& a);
[[nodiscard]] NDArray relu(const NDArray& a);
[[nodiscard]] NDArray pow(const NDArray& a, const NDArray& b);
[[nodiscard]] NDArray pow(const NDArray& a, double exponent);
[[nodiscard]] NDArray maximum(const NDArray& a, const NDArray& b);
[[nodiscard]] NDArray minimum(const NDArray& a, const NDArray& b);
/// The scalar takes the array's dtype.
[[nodiscard]] NDArray maximum(const NDArray& a, double s);
[[nodiscard]] NDArray minimum(const NDArray& a, double s);
/// minimum(maximum(a, low), high).
[[nodiscard]] NDArray clip(const NDArray& a, double low, double high);
/// A new array of `shape` holding `a` broadcast NumPy-style (a copy).
[[nodiscard]] NDArray broadcast_to(const NDArray& a, const Shape& shape);
/// cond (bool) ? a : b, broadcast.
[[nodiscard]] NDArray where(const NDArray& cond, const NDArray& a, const NDArray& b);
/// Matrix product (2-D, or batched 3-D) of float32 or float64 arrays, via BLAS.
/// As NumPy, a 1-D operand is a row (left) or column (right) vector whose
/// axis is dropped from the result: vector @ vector is a scalar.
[[nodiscard]] NDArray dot(const NDArray& a, const NDArray& b);
[[nodiscard]] NDArray matmul(const NDArray& a, const NDArray& b);
/// Joins arrays along an existing axis; a copy.
[[nodiscard]] NDArray concat(const std::vector<NDArray>& arrays, int axis = 0);

/// Blocks until everything recorded is done (Engine::get().waitall()),
/// fused elementwise ops still being gathered included.
void waitall(std::source_location where = std::source_location::current());
/// Lazy fusion of elementwise ops (docs/architecture.md, "Fusion"):
/// consecutive elementwise ops on a CPU or sim device over one shape are recorded
/// as one node that makes one pass over memory, and results no handle
/// holds are never stored. The results are bit for bit those of the
/// separate ops. On by default; LAZYDAG_FUSION=0 turns it off for the
/// process, set_fusion at run time (ops being gathered are recorded first).
/// The naive policy never fuses.
void set_fusion(bool on);
[[nodiscard]] bool fusion_enabled();
/// Records now the elementwise ops every thread is still gathering into a
/// fused node. Needed only before pushing into the engine directly with an
/// array's var(): every NDArray call that touches an array does it for
/// the arrays it touches.
void flush_fused();
/// The engine NDArrays record into: the process-wide Engine::get().
[[nodiscard]] engine::Engine& engine();
/// Bytes of host array storage held by live arrays (or by ops not yet run).
[[nodiscard]] std::int64_t memory_in_use() noexcept;
/// Bytes allocated on `dev` and not yet freed (freeing is recorded, so this
/// drops once the frees have run). The host figure for a CPU device.
[[nodiscard]] std::int64_t device_memory_in_use(Device dev);
/// Bytes of freed storage kept by the host pool for reuse (at most 1 GiB;
/// besides, each thread keeps up to 64 KiB of buffers of 4 KiB or less).
[[nodiscard]] std::int64_t memory_cached();
/// Returns the pool's cached buffers, and the calling thread's, to the
/// system. Thread-safe.
void release_cached_memory();

}  // namespace nd
}  // namespace lazydag
