// Activations and losses as compositions of differentiable ops: backward()
// reaches through them with no derivative of their own. The stable forms
// subtract the maximum along the axis, detached (it cancels in the result,
// so it needs no gradient).
#include <lazydag/autograd.hpp>
#include <lazydag/nn.hpp>

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
  const NDArray target = one_hot(labels, logits.shape()[1], logits.dtype());
  const double n = static_cast<double>(std::max<std::int64_t>(logits.shape()[0], 1));
  return -(log_softmax(logits, 1) * target).sum() / n;
}

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
