// The hooks through which ndarray.cpp records backward nodes: each is
// called with an op's inputs and its result, after the forward op was
// recorded, and does nothing unless grad mode is on and an input requires
// grad (one thread-local load and a pointer test per input).
#pragma once

#include <lazydag/autograd.hpp>
#include <lazydag/ndarray.hpp>
#include <lazydag/ops/kernels.hpp>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <vector>

namespace lazydag::detail::grad {

/// Grad mode is on and one of `xs` requires grad.
[[nodiscard]] bool wanted(std::initializer_list<const NDArray*> xs) noexcept;

void unary(ops::UnaryOp op, const NDArray& x, const NDArray& out);
void binary(ops::BinaryOp op, const NDArray& a, const NDArray& b, const NDArray& out);
void scalar(ops::BinaryOp op, const NDArray& a, double s, bool scalar_first, const NDArray& out);
void reduce(ops::ReduceOp op, const NDArray& x, bool all, int axis, bool keepdims, const NDArray& out);
/// reshape, copy, copyto, broadcast_to and astype between float dtypes:
/// the gradient is the output's, brought back to the input's shape,
/// dtype and device.
void same_values(const char* name, const NDArray& x, const NDArray& out);
void transpose(const NDArray& x, const std::vector<int>& perm, const NDArray& out);
void slice(const NDArray& x, int axis, std::int64_t start, const NDArray& out);
void where(const NDArray& cond, const NDArray& a, const NDArray& b, const NDArray& out);
void matmul(const NDArray& a, const NDArray& b, const NDArray& out);
void concat(const std::vector<NDArray>& xs, int axis, const NDArray& out);
/// nd::cross_entropy's fused kernel; the derivative is one fused kernel too.
void cross_entropy(const NDArray& logits, const NDArray& labels, const NDArray& out);
/// nd::take_along_last; its derivative scatter-adds along the last axis.
void take_along_last(const NDArray& a, const NDArray& indices, const NDArray& out);
/// nd::take of rows of `a` (contiguous); its derivative scatter-adds.
void take(const NDArray& a, const NDArray& indices, const NDArray& out);

/// Refuses (InvalidArgument naming `op`) an in-place write of an array in
/// the gradient graph while grad mode is on (host ops).
void check_inplace(const ArrayState& target, const char* op);

/// In place with a gradient: grad mode is on and the target, a source, or
/// the base the target views requires grad.
[[nodiscard]] bool inplace_wanted(const ArrayState& target, std::initializer_list<const ArrayState*> sources) noexcept;
/// Refuses (InvalidArgument naming `op`) a target that is a leaf requiring
/// grad or a view of one.
void check_rebase(const ArrayState& target, const char* op);
/// `result`, computed out of place (with its backward node), is written
/// into `target`, which takes its autograd record: the in-place op's
/// gradient is the out-of-place op's. Arrays the derivative saved from the
/// target's buffer are copied first; handles made before from the same
/// buffer become stale (backward refuses them). Through a view, the view's
/// base takes a record that routes the gradient inside the view to
/// `result` and outside it to the base's old record.
void rebase(const NDArray& target, const NDArray& result);
/// After target.assign(source) was recorded: the target's record becomes
/// the source's values (a gradient summed back to the source's shape).
void assign(const NDArray& target, const NDArray& source);

}  // namespace lazydag::detail::grad

namespace lazydag::detail {
/// Called after each backward() adds to the leaf's gradient (on the thread
/// in backward(), grad mode off); an empty function removes it.
void set_grad_hook(const NDArray& leaf, std::function<void()> hook);
/// Replaces a leaf's gradient (what a gradient all-reduce produced).
void replace_grad(const NDArray& leaf, NDArray g);
/// A zero array of `rows` rows plus g's trailing shape, with g's rows added
/// at `indices` (the derivative of take; data.cpp).
[[nodiscard]] NDArray scatter_add_rows(const NDArray& g, const NDArray& indices, std::int64_t rows);
/// zeros of `shape` with g[..., j] added at [..., indices[..., j]] (data.cpp).
[[nodiscard]] NDArray scatter_add_last(const NDArray& g, const NDArray& indices, const Shape& shape);
/// (softmax(logits) - one_hot(labels)) * g / N, one recorded kernel (nn.cpp).
[[nodiscard]] NDArray cross_entropy_backward(const NDArray& g, const NDArray& logits, const NDArray& labels);
}  // namespace lazydag::detail
