// Numerically stable activations and losses for model code, built from
// differentiable NDArray ops (so backward() reaches through them).
#pragma once

#include <lazydag/ndarray.hpp>

namespace lazydag::nd {

/// log(sum(exp(x), axis)), stable: the maximum is subtracted first.
[[nodiscard]] NDArray logsumexp(const NDArray& x, int axis = -1, bool keepdims = false);
/// exp(x) / sum(exp(x), axis), stable.
[[nodiscard]] NDArray softmax(const NDArray& x, int axis = -1);
/// x - logsumexp(x, axis), stable.
[[nodiscard]] NDArray log_softmax(const NDArray& x, int axis = -1);
/// A float array of shape labels.shape + [classes]: 1 where the last index
/// equals the label. `labels` is an int32 or int64 array; a label outside
/// [0, classes) gives an all-zero row.
[[nodiscard]] NDArray one_hot(const NDArray& labels, std::int64_t classes,
                              DType t = DType::kFloat32);
/// Mean over the batch of -log_softmax(logits)[i, labels[i]]: logits of
/// shape [N, C] (float), labels of shape [N] (int32 or int64).
[[nodiscard]] NDArray cross_entropy(const NDArray& logits, const NDArray& labels);
/// The same against smoothed targets (PyTorch's label_smoothing): 1 - e on
/// the label plus e / C on every class, i.e. (1 - e) cross_entropy + e times
/// the mean over rows and classes of -log_softmax. `e` in [0, 1].
[[nodiscard]] NDArray cross_entropy(const NDArray& logits, const NDArray& labels, double label_smoothing);
/// `a` with a length-1 axis inserted at `axis` (-1: last); a view.
[[nodiscard]] NDArray unsqueeze(const NDArray& a, int axis);
/// `a` without its length-1 axis `axis`; a view. InvalidArgument when that
/// axis is not of length 1.
[[nodiscard]] NDArray squeeze(const NDArray& a, int axis);
/// Equally shaped arrays joined along a new axis.
[[nodiscard]] NDArray stack(const std::vector<NDArray>& arrays, int axis = 0);
/// Sum / mean over several axes (each once, any order). A bool array's sum
/// counts its true elements (int64).
[[nodiscard]] NDArray sum(const NDArray& a, const std::vector<int>& axes, bool keepdims = false);
[[nodiscard]] NDArray mean(const NDArray& a, const std::vector<int>& axes, bool keepdims = false);
/// Variance and standard deviation along `axis` with `ddof` delta degrees
/// of freedom (NumPy's), float arrays.
[[nodiscard]] NDArray var(const NDArray& a, int axis, int ddof = 0, bool keepdims = false);
[[nodiscard]] NDArray std(const NDArray& a, int axis, int ddof = 0, bool keepdims = false);

/// Mean of (prediction - target)^2 over every element.
[[nodiscard]] NDArray mse_loss(const NDArray& prediction, const NDArray& target);

}  // namespace lazydag::nd
