// Data for training: NumPy .npy files, row gathers, permutations and a
// minibatch iterator whose batches are recorded gathers on the device.
#pragma once

#include <lazydag/ndarray.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lazydag::nd {

/// Blocks (reads the values). Writes `a` in NumPy's .npy format (version
/// 1.0, little-endian, C order): np.load reads it. Error if the file cannot
/// be written.
void save_npy(const std::string& path, const NDArray& a,
              std::source_location where = std::source_location::current());
/// Reads an .npy file written by NumPy or save_npy: float32, float64,
/// int32, int64 or bool, little-endian, C or Fortran order, versions 1 to
/// 3. InvalidArgument naming what is unsupported or malformed.
[[nodiscard]] NDArray load_npy(const std::string& path, Device dev = default_device());

/// Rows of `a` (axis 0) picked by `indices` (int32 or int64, any shape):
/// the result has shape indices.shape + a.shape[1:]. An index outside
/// [0, rows) fails the op (OpError at the next wait), naming it.
/// Differentiable in `a` (the gradient adds each row's share back: an
/// embedding lookup's scatter-add). A copy on CPU and sim devices; on a GPU
/// through the host.
[[nodiscard]] NDArray take(const NDArray& a, const NDArray& indices);
/// For each row of the last axis, the indices (int64) that sort it; stable
/// (ties keep their order). NaNs sort last ascending, first descending.
[[nodiscard]] NDArray argsort(const NDArray& a, bool descending = false);
/// `a`'s last axis picked by `indices` (int64, same leading shape, any last
/// length): out[..., j] = a[..., indices[..., j]]. Differentiable in `a`.
[[nodiscard]] NDArray take_along_last(const NDArray& a, const NDArray& indices);
/// The last axis sorted; differentiable (the gradient goes back to each
/// value's position).
[[nodiscard]] NDArray sort(const NDArray& a, bool descending = false);
/// The k largest (or smallest) of the last axis, in order, and their
/// indices (int64).
struct TopK {
  NDArray values;
  NDArray indices;
};
[[nodiscard]] TopK topk(const NDArray& a, std::int64_t k, bool largest = true);

// Along any axis (negative counts from the end), as NumPy's axis= forms.
// Composed from the forms above through transposed views, so they are
// differentiable the same way; the results may be non-contiguous views.

/// np.take(a, indices, axis): shape a.shape[:axis] + indices.shape +
/// a.shape[axis+1:].
[[nodiscard]] NDArray take(const NDArray& a, const NDArray& indices, int axis);
/// np.argsort(a, axis, kind="stable").
[[nodiscard]] NDArray argsort(const NDArray& a, int axis, bool descending);
/// np.take_along_axis: `indices` has a's shape except along `axis`.
[[nodiscard]] NDArray take_along_axis(const NDArray& a, const NDArray& indices, int axis);
/// `axis` sorted (stable).
[[nodiscard]] NDArray sort(const NDArray& a, int axis, bool descending);
/// The k largest (or smallest) along `axis`, in order, and their indices.
[[nodiscard]] TopK topk(const NDArray& a, std::int64_t k, int axis, bool largest);

/// A random permutation of 0..n-1 (int64), a function of (n, seed) only.
[[nodiscard]] NDArray permutation(std::int64_t n, std::uint64_t seed, Device dev = default_device());
/// Integers uniform in [low, high) (int64), a function of (shape, seed) only.
[[nodiscard]] NDArray randint(std::int64_t low, std::int64_t high, const Shape& shape, std::uint64_t seed,
                              Device dev = default_device());

}  // namespace lazydag::nd

namespace lazydag::data {

/// A numeric CSV file (comma-separated, no header; a first line that is
/// not numeric is skipped as a header) as a [rows, columns] array.
/// InvalidArgument naming the line for a ragged row or a field that is not
/// a number.
[[nodiscard]] NDArray read_csv(const std::string& path, DType t = DType::kFloat32, Device dev = default_device());

/// Minibatches over arrays that share their first dimension (features,
/// labels, ...), all on one device. Each batch is a recorded gather of
/// rows (nd::take): nothing is copied on the host per batch, and the batch
/// after the one returned is recorded before next() returns, so it is
/// gathered while the caller's step runs.
class MiniBatches {
 public:
  /// shuffle: each epoch visits the rows in the order nd::permutation(rows,
  /// seed + epoch) gives; otherwise in order. drop_last: a last batch
  /// smaller than batch_size is skipped.
  MiniBatches(std::vector<NDArray> arrays, std::int64_t batch_size, bool shuffle = true,
              std::uint64_t seed = 0, bool drop_last = false);
  /// Starts epoch `epoch` (from 0) at its first batch.
  void start_epoch(std::int64_t epoch);
  /// The next batch of the current epoch (one array per input array), or
  /// nothing at the epoch's end.
  [[nodiscard]] std::optional<std::vector<NDArray>> next();
  [[nodiscard]] std::int64_t rows() const noexcept { return rows_; }
  [[nodiscard]] std::int64_t batches_per_epoch() const noexcept;

 private:
  std::vector<NDArray> prepare(std::int64_t batch);
  std::vector<NDArray> arrays_;
  std::int64_t batch_size_;
  bool shuffle_;
  std::uint64_t seed_;
  bool drop_last_;
  std::int64_t rows_;
  NDArray order_;  // this epoch's row order (int64, on the arrays' device)
  std::int64_t next_batch_ = 0;
  std::optional<std::vector<NDArray>> ahead_;
};

}  // namespace lazydag::data
