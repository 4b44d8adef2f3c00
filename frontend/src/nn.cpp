// Activations and losses as compositions of differentiable ops: backward()
// reaches through them with no derivative of their own. The stable forms
// subtract the maximum along the axis, detached (it cancels in the result,
// so it needs no gradient).
#include <lazydag/autograd.hpp>
#include <lazydag/nn.hpp>

#include "autograd_internal.hpp"
#include "internal.hpp"

#include <cmath>

#include <algorithm>
#include <string>

namespace lazydag::nd {

namespace {

int normalized(int axis, int rank, const char* op) {
  if (rank == 0 || axis < -rank || axis >= rank) {
    throw InvalidArgument(std::string(op) + ": axis " + std::to_string(axis) + " is out of range for " +
                          std::to_string(rank) + " dimensions");
  }
  return axis < 0 ? axis + rank : axis;
}

void floating_only(const NDArray& x, const char* op) {
  if (!is_floating(x.dtype())) {
    throw InvalidArgument(std::string(op) + ": needs a float32 or float64 array, got " +
                          std::string(to_string(x.dtype())));
  }
}

void labels_only(const NDArray& labels, const char* op) {
  if (labels.dtype() != DType::kInt64 && labels.dtype() != DType::kInt32) {
    throw InvalidArgument(std::string(op) + ": labels must be int32 or int64, got " +
                          std::string(to_string(labels.dtype())));
  }
}

// Row i of [n, c] logits: its log-sum-exp, stable.
template <class T>
double row_lse(const T* x, std::int64_t c) {
  double m = x[0];
  for (std::int64_t j = 1; j < c; ++j) m = std::max(m, static_cast<double>(x[j]));
  double s = 0;
  for (std::int64_t j = 0; j < c; ++j) s += std::exp(static_cast<double>(x[j]) - m);
  return m + std::log(s);
}

std::int64_t label_at(const void* labels, bool i64, std::int64_t i, std::int64_t c) {
  const std::int64_t l = i64 ? static_cast<const std::int64_t*>(labels)[i] : static_cast<const std::int32_t*>(labels)[i];
  if (l < 0 || l >= c) {
    throw InvalidArgument("cross_entropy: label " + std::to_string(l) + " of row " + std::to_string(i) +
                          " is out of range [0, " + std::to_string(c) + ")");
  }
  return l;
}

// Forward: mean over rows of lse - x[label], accumulated in double.
template <class T>
void ce_forward(const std::vector<void*>& p, std::int64_t n, std::int64_t c, bool i64) {
  const T* x = static_cast<const T*>(p[0]);
  double total = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const T* row = x + i * c;
    total += row_lse(row, c) - static_cast<double>(row[label_at(p[1], i64, i, c)]);
  }
  *static_cast<T*>(p[2]) = static_cast<T>(n == 0 ? 0.0 : total / static_cast<double>(n));
}

// Backward: (softmax - one_hot) * g / n.
template <class T>
void ce_backward(const std::vector<void*>& p, std::int64_t n, std::int64_t c, bool i64) {
  const double g = static_cast<double>(*static_cast<const T*>(p[0])) / static_cast<double>(std::max<std::int64_t>(n, 1));
  const T* x = static_cast<const T*>(p[1]);
  T* d = static_cast<T*>(p[3]);
  for (std::int64_t i = 0; i < n; ++i) {
    const T* row = x + i * c;
    const double lse = row_lse(row, c);
    for (std::int64_t j = 0; j < c; ++j) d[i * c + j] = static_cast<T>(std::exp(static_cast<double>(row[j]) - lse) * g);
    d[i * c + label_at(p[2], i64, i, c)] -= static_cast<T>(g);
  }
}

}  // namespace

NDArray logsumexp(const NDArray& x, int axis, bool keepdims) {
  floating_only(x, "logsumexp");
  axis = normalized(axis, x.ndim(), "logsumexp");
  const NDArray m = x.max(axis, true).detach();
  NDArray r = log(exp(x - m).sum(axis, true)) + m;
  if (keepdims) return r;
  Shape s = x.shape();
  s.erase(s.begin() + axis);
  return r.reshape(s);
}

NDArray log_softmax(const NDArray& x, int axis) {
  floating_only(x, "log_softmax");
  axis = normalized(axis, x.ndim(), "log_softmax");
  return x - logsumexp(x, axis, true);
}

NDArray softmax(const NDArray& x, int axis) {
  floating_only(x, "softmax");
  axis = normalized(axis, x.ndim(), "softmax");
  const NDArray e = exp(x - x.max(axis, true).detach());
  return e / e.sum(axis, true);
}

NDArray unsqueeze(const NDArray& a, int axis) {
  const int rank = a.ndim() + 1;
  if (axis < -rank || axis >= rank) {
    throw InvalidArgument("unsqueeze: axis " + std::to_string(axis) + " is out of range for " +
                          std::to_string(rank) + " dimensions");
  }
  if (axis < 0) axis += rank;
  Shape s = a.shape();
  s.insert(s.begin() + axis, 1);
  return a.reshape(s);
}

NDArray squeeze(const NDArray& a, int axis) {
  axis = normalized(axis, a.ndim(), "squeeze");
  if (a.shape()[static_cast<std::size_t>(axis)] != 1) {
    throw InvalidArgument("squeeze: axis " + std::to_string(axis) + " of shape " + to_string(a.shape()) +
                          " has length " + std::to_string(a.shape()[static_cast<std::size_t>(axis)]) + ", not 1");
  }
  Shape s = a.shape();
  s.erase(s.begin() + axis);
  return a.reshape(s);
}

NDArray stack(const std::vector<NDArray>& arrays, int axis) {
  if (arrays.empty()) throw InvalidArgument("stack: no arrays given");
  std::vector<NDArray> parts;
  for (const auto& a : arrays) {
    if (a.shape() != arrays[0].shape()) {
      throw InvalidArgument("stack: shapes " + to_string(arrays[0].shape()) + " and " + to_string(a.shape()) +
                            " differ");
    }
    parts.push_back(unsqueeze(a, axis));
  }
  return concat(parts, axis < 0 ? axis + arrays[0].ndim() + 1 : axis);
}

namespace {
// The axes normalised, checked distinct, in decreasing order (so reducing
// one does not renumber the others).
std::vector<int> axes_down(const NDArray& a, const std::vector<int>& axes, const char* op) {
  std::vector<int> v;
  for (int ax : axes) {
    const int n = normalized(ax, a.ndim(), op);
    if (std::find(v.begin(), v.end(), n) != v.end()) {
      throw InvalidArgument(std::string(op) + ": axis " + std::to_string(ax) + " given twice");
    }
    v.push_back(n);
  }
  std::sort(v.rbegin(), v.rend());
  return v;
}
}  // namespace

NDArray sum(const NDArray& a0, const std::vector<int>& axes, bool keepdims) {
  NDArray a = a0.dtype() == DType::kBool ? a0.astype(DType::kInt64) : a0;
  for (int ax : axes_down(a, axes, "sum")) a = a.sum(ax, keepdims);
  return a;
}

NDArray mean(const NDArray& a, const std::vector<int>& axes, bool keepdims) {
  const auto down = axes_down(a, axes, "mean");
  double count = 1;
  for (int ax : down) count *= static_cast<double>(a.shape()[static_cast<std::size_t>(ax)]);
  NDArray s = sum(is_floating(a.dtype()) ? a : a.astype(DType::kFloat64), axes, keepdims);
  return s / count;
}

NDArray var(const NDArray& a, int axis, int ddof, bool keepdims) {
  floating_only(a, "var");
  axis = normalized(axis, a.ndim(), "var");
  const double n = static_cast<double>(a.shape()[static_cast<std::size_t>(axis)]);
  if (ddof < 0 || n - ddof <= 0) {
    throw InvalidArgument("var: ddof " + std::to_string(ddof) + " leaves no degrees of freedom for " +
                          std::to_string(static_cast<std::int64_t>(n)) + " elements");
  }
  const NDArray d = a - a.mean(axis, true);
  return (d * d).sum(axis, keepdims) / (n - ddof);
}

NDArray std(const NDArray& a, int axis, int ddof, bool keepdims) { return sqrt(var(a, axis, ddof, keepdims)); }

NDArray one_hot(const NDArray& labels, std::int64_t classes, DType t) {
  labels_only(labels, "one_hot");
  if (classes <= 0) throw InvalidArgument("one_hot: classes must be positive, got " + std::to_string(classes));
  Shape s = labels.shape();
  s.push_back(1);
  const NDArray ids = arange(0.0, static_cast<double>(classes), 1.0, labels.dtype(), labels.device());
  return (labels.reshape(s) == ids).astype(t);
}

NDArray cross_entropy(const NDArray& logits, const NDArray& labels) {
  floating_only(logits, "cross_entropy");
  labels_only(labels, "cross_entropy");
  if (logits.ndim() != 2 || labels.ndim() != 1 || labels.shape()[0] != logits.shape()[0]) {
    throw InvalidArgument("cross_entropy: needs logits [N, C] and labels [N], got " +
                          to_string(logits.shape()) + " and " + to_string(labels.shape()));
  }
  if (!(labels.device() == logits.device())) {
    throw DeviceMismatch("cross_entropy: logits on " + logits.device().str() + ", labels on " +
                         labels.device().str());
  }
  if (!detail::runs_host_kernels(logits.device())) {  // a GPU: a composition of elementwise ops
    const NDArray target = one_hot(labels, logits.shape()[1], logits.dtype());
    const double n = static_cast<double>(std::max<std::int64_t>(logits.shape()[0], 1));
    return -(log_softmax(logits, 1) * target).sum() / n;
  }
  // One pass over the logits forward and one backward (a fused kernel each).
  const NDArray x = logits.is_contiguous() ? logits.detach() : logits.detach().copy();
  const NDArray l = labels.is_contiguous() ? labels : labels.copy();
  NDArray out = detail::empty({}, logits.dtype(), logits.device(), "cross_entropy");
  const std::int64_t n = logits.shape()[0], c = logits.shape()[1];
  const bool f64 = logits.dtype() == DType::kFloat64, i64 = labels.dtype() == DType::kInt64;
  detail::record_host_kernel("cross_entropy", {x, l}, {out}, [=](const std::vector<void*>& p) {
    f64 ? ce_forward<double>(p, n, c, i64) : ce_forward<float>(p, n, c, i64);
  });
  detail::grad::cross_entropy(logits, l, out);
  return out;
}

NDArray cross_entropy(const NDArray& logits, const NDArray& labels, double label_smoothing) {
  if (!(label_smoothing >= 0.0 && label_smoothing <= 1.0)) {
    throw InvalidArgument("cross_entropy: label_smoothing must be in [0, 1], got " + std::to_string(label_smoothing));
  }
  NDArray hard = cross_entropy(logits, labels);  // checks the shapes, dtypes and devices
  if (label_smoothing == 0.0) return hard;
  return hard * (1.0 - label_smoothing) - log_softmax(logits, 1).mean() * label_smoothing;
}

}  // namespace lazydag::nd

namespace lazydag::detail {

NDArray cross_entropy_backward(const NDArray& g, const NDArray& logits, const NDArray& labels) {
  NDArray d = empty(logits.shape(), logits.dtype(), logits.device(), "cross_entropy (backward)");
  const std::int64_t n = logits.shape()[0], c = logits.shape()[1];
  const bool f64 = logits.dtype() == DType::kFloat64, i64 = labels.dtype() == DType::kInt64;
  record_host_kernel("cross_entropy (backward)", {g, logits, labels}, {d}, [=](const std::vector<void*>& p) {
    f64 ? nd::ce_backward<double>(p, n, c, i64) : nd::ce_backward<float>(p, n, c, i64);
  });
  return d;
}

}  // namespace lazydag::detail

namespace lazydag::nd {

NDArray mse_loss(const NDArray& prediction, const NDArray& target) {
  floating_only(prediction, "mse_loss");
  if (prediction.shape() != target.shape()) {
    throw InvalidArgument("mse_loss: shapes differ: " + to_string(prediction.shape()) + " and " +
                          to_string(target.shape()));
  }
  const NDArray d = prediction - target;
  return (d * d).mean();
}

}  // namespace lazydag::nd
