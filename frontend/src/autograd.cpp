// Reverse-mode autograd over recorded ops.
//
// A differentiable op whose input requires grad (grad mode on) gives its
// result an AutogradMeta pointing to a GradNode: the op's name, one edge per
// input (that input's meta, or null when it needs no gradient), the arrays
// the derivative needs (saved detached, with their storage's version) and
// the derivative itself as a function of the output's gradient. Nodes point
// only towards inputs, so the graph is acyclic and lives as long as the
// arrays made by it.
//
// backward() walks the nodes reachable from the array on the host, checks
// every saved array before recording anything, then calls the derivatives
// in reverse record order (a node once every consumer in the walk has
// given it its gradient). The derivatives are ordinary NDArray ops, recorded
// under grad mode off: backward() returns as soon as they are recorded and
// the engine computes the gradients while the caller goes on.
#include <lazydag/autograd.hpp>
#include <lazydag/ndarray.hpp>

#include "autograd_internal.hpp"
#include "object_pool.hpp"
#include "internal.hpp"
#include "storage.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <functional>
#include <mutex>
#include <queue>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace lazydag {

namespace autograd {
namespace {
thread_local bool g_grad_enabled = true;
}  // namespace
bool is_grad_enabled() noexcept { return g_grad_enabled; }
void set_grad_enabled(bool on) noexcept { g_grad_enabled = on; }
}  // namespace autograd

namespace detail {

struct GradNode;

struct AutogradMeta {
  bool requires_grad = true;
  std::shared_ptr<GradNode> grad_fn;  // null: a leaf
  std::mutex lock;                    // a leaf's gradient
  NDArray grad;
  std::function<void()> hook;         // after each accumulation (set_grad_hook)
  // The storage's grad_generation when this record was made: a handle whose
  // storage has been written in place with a gradient since is stale.
  std::uint64_t generation = 0;
};

namespace {

// The arrays a derivative reads, and which inputs want a gradient.
using Derivative = std::function<std::vector<NDArray>(const NDArray& g, const std::vector<NDArray>& saved,
                                                      const std::vector<bool>& needs)>;

struct Edge {
  std::shared_ptr<AutogradMeta> meta;  // null: this input needs no gradient
  Shape shape;
  DType dtype;
  Device device;
  // The input was a view taken before an in-place write (with a gradient)
  // to its storage: its record leads to the values before the write.
  bool stale = false;
};

struct Saved {
  NDArray array;  // detached: no meta, so an output saved by its own node makes no cycle
  std::uint64_t version;
};

}  // namespace

struct GradNode {
  const char* op = "";
  std::uint64_t seq = 0;
  std::vector<Edge> inputs;
  std::vector<Saved> saved;
  Derivative derivative;
  bool released = false;
};

namespace {

std::atomic<std::uint64_t> g_node_seq{0};
// backward() walks and releases nodes that other threads' graphs may share.
std::mutex g_backward;

const ArrayState& st(const NDArray& a) { return *Access::peek(a); }

bool wants_grad(const NDArray& a) noexcept {
  const ArrayState* s = Access::peek(a);
  return s != nullptr && s->autograd && s->autograd->requires_grad;
}

NDArray as_dtype(const NDArray& a, DType t) { return a.dtype() == t ? a : a.astype(t); }

// Sums `g` over the axes broadcasting added (leading, or 1 in `shape`),
// then broadcasts what is left up to `shape`.
NDArray fit(NDArray g, const Shape& shape) {
  if (g.shape() == shape) return g;
  while (static_cast<std::size_t>(g.ndim()) > shape.size()) g = g.sum(0);
  if (static_cast<std::size_t>(g.ndim()) == shape.size()) {
    for (std::size_t d = 0; d < shape.size(); ++d) {
      if (shape[d] == 1 && g.shape()[d] != 1) g = g.sum(static_cast<int>(d), true);
    }
  }
  if (g.shape() == shape) return g;
  if (g.size() == numel(shape) && g.ndim() == static_cast<int>(shape.size())) return g.reshape(shape);
  return nd::broadcast_to(g, shape);
}

// Records the backward node of `out`.
void attach(const char* op, const NDArray& out, std::span<const NDArray* const> inputs,
            std::initializer_list<NDArray> saved, Derivative derivative) {
  auto node = std::make_shared<GradNode>();
  node->op = op;
  node->seq = g_node_seq.fetch_add(1, std::memory_order_relaxed);
  node->inputs.reserve(inputs.size());
  for (const NDArray* x : inputs) {
    const ArrayState& s = st(*x);
    const bool wants = wants_grad(*x);
    node->inputs.push_back(Edge{wants ? s.autograd : nullptr, s.shape, s.dtype, x->device(),
                                wants && s.autograd->generation != grad_generation(s)});
  }
  for (const NDArray& s : saved) node->saved.push_back(Saved{s.detach(), storage_version(st(s))});
  node->derivative = std::move(derivative);
  auto meta = std::make_shared<AutogradMeta>();
  meta->generation = grad_generation(st(out));
  meta->grad_fn = std::move(node);
  st(out).autograd = std::move(meta);
}

void attach(const char* op, const NDArray& out, std::initializer_list<const NDArray*> inputs,
            std::initializer_list<NDArray> saved, Derivative derivative) {
  attach(op, out, std::span<const NDArray* const>(inputs.begin(), inputs.size()), saved, std::move(derivative));
}

NDArray mask(const NDArray& cond, DType t) { return cond.astype(t); }

// Adds `g` to a leaf's gradient. A gradient array that is the leaf's
// alone (`owned`: the backward walk made its buffer and gives it to no one
// else) is kept as it is; any other (the same buffer given to two inputs,
// even as disjoint views, the caller's seed, a saved array) is copied, so no
// two leaves share a gradient buffer and no gradient shares the caller's.
void accumulate(AutogradMeta& leaf, const NDArray& g, bool owned) {
  std::function<void()> hook;
  {
    std::lock_guard lock(leaf.lock);
    if (!leaf.grad.valid()) {
      leaf.grad = owned ? g : g.copy();
    } else {
      leaf.grad = leaf.grad + g;
    }
    hook = leaf.hook;
  }
  if (hook) hook();
}

}  // namespace

namespace grad {

bool wanted(std::initializer_list<const NDArray*> xs) noexcept {
  if (!autograd::is_grad_enabled()) return false;
  for (const NDArray* x : xs) {
    if (wants_grad(*x)) return true;
  }
  return false;
}

void unary(ops::UnaryOp op, const NDArray& x, const NDArray& out) {
  if (!wanted({&x}) || !is_floating(x.dtype())) return;
  const char* name = to_string(op).data();
  using U = ops::UnaryOp;
  switch (op) {
    case U::kNeg:
      attach(name, out, {&x}, {}, [](const NDArray& g, auto&, auto&) { return std::vector<NDArray>{-g}; });
      return;
    case U::kAbs:
      attach(name, out, {&x}, {x}, [](const NDArray& g, const std::vector<NDArray>& s, auto&) {
        const NDArray& a = s[0];
        return std::vector<NDArray>{g * (mask(a > 0.0, a.dtype()) - mask(a < 0.0, a.dtype()))};
      });
      return;
    case U::kExp:
      attach(name, out, {&x}, {out}, [](const NDArray& g, const std::vector<NDArray>& s, auto&) {
        return std::vector<NDArray>{g * s[0]};
      });
      return;
    case U::kLog:
      attach(name, out, {&x}, {x}, [](const NDArray& g, const std::vector<NDArray>& s, auto&) {
        return std::vector<NDArray>{g / s[0]};
      });
      return;
    case U::kLog1p:
      attach(name, out, {&x}, {x}, [](const NDArray& g, const std::vector<NDArray>& s, auto&) {
        return std::vector<NDArray>{g / (s[0] + 1.0)};
      });
      return;
    case U::kSqrt:
      attach(name, out, {&x}, {out}, [](const NDArray& g, const std::vector<NDArray>& s, auto&) {
        return std::vector<NDArray>{(g / s[0]) * 0.5};
      });
      return;
    case U::kTanh:
      attach(name, out, {&x}, {out}, [](const NDArray& g, const std::vector<NDArray>& s, auto&) {
        return std::vector<NDArray>{g * (1.0 - s[0] * s[0])};
      });
      return;
    case U::kSigmoid:
      attach(name, out, {&x}, {out}, [](const NDArray& g, const std::vector<NDArray>& s, auto&) {
        return std::vector<NDArray>{g * s[0] * (1.0 - s[0])};
      });
      return;
    case U::kRelu:
      // The mask from the result: relu(x) > 0 exactly where x > 0 (NaN and
      // zeros of either sign are not), and saving the result rather than x
      // leaves a fused pre-activation unwritten.
      attach(name, out, {&x}, {out}, [](const NDArray& g, const std::vector<NDArray>& s, auto&) {
        return std::vector<NDArray>{g * mask(s[0] > 0.0, s[0].dtype())};
      });
      return;
  }
}

void binary(ops::BinaryOp op, const NDArray& a, const NDArray& b, const NDArray& out) {
  if (!wanted({&a, &b}) || !is_floating(out.dtype())) return;
  const char* name = to_string(op).data();
  using B = ops::BinaryOp;
  using V = std::vector<NDArray>;
  switch (op) {
    case B::kAdd:
      attach(name, out, {&a, &b}, {}, [](const NDArray& g, auto&, auto&) { return V{g, g}; });
      return;
    case B::kSub:
      attach(name, out, {&a, &b}, {}, [](const NDArray& g, auto&, const std::vector<bool>& n) {
        return V{g, n[1] ? -g : NDArray()};
      });
      return;
    case B::kMul:
      attach(name, out, {&a, &b}, {a, b}, [](const NDArray& g, const V& s, const std::vector<bool>& n) {
        return V{n[0] ? g * s[1] : NDArray(), n[1] ? g * s[0] : NDArray()};
      });
      return;
    case B::kDiv:
      attach(name, out, {&a, &b}, {a, b}, [](const NDArray& g, const V& s, const std::vector<bool>& n) {
        return V{n[0] ? g / s[1] : NDArray(), n[1] ? -(g * s[0]) / (s[1] * s[1]) : NDArray()};
      });
      return;
    case B::kPow:
      // d(a^b)/da = b a^(b-1); d(a^b)/db = a^b log a.
      attach(name, out, {&a, &b}, {a, b, out}, [](const NDArray& g, const V& s, const std::vector<bool>& n) {
        return V{n[0] ? g * s[1] * nd::pow(s[0], s[1] - 1.0) : NDArray(),
                 n[1] ? g * s[2] * nd::log(s[0]) : NDArray()};
      });
      return;
    case B::kMax:  // ties: the gradient goes to a
      attach(name, out, {&a, &b}, {a, b}, [](const NDArray& g, const V& s, const std::vector<bool>& n) {
        const DType t = g.dtype();
        return V{n[0] ? g * mask(s[0] >= s[1], t) : NDArray(), n[1] ? g * mask(s[0] < s[1], t) : NDArray()};
      });
      return;
    case B::kMin:  // ties: the gradient goes to a
      attach(name, out, {&a, &b}, {a, b}, [](const NDArray& g, const V& s, const std::vector<bool>& n) {
        const DType t = g.dtype();
        return V{n[0] ? g * mask(s[0] <= s[1], t) : NDArray(), n[1] ? g * mask(s[0] > s[1], t) : NDArray()};
      });
      return;
  }
}

void scalar(ops::BinaryOp op, const NDArray& a, double c, bool scalar_first, const NDArray& out) {
  if (!wanted({&a}) || !is_floating(a.dtype())) return;
  const char* name = to_string(op).data();
  using B = ops::BinaryOp;
  using V = std::vector<NDArray>;
  switch (op) {
    case B::kAdd:
      attach(name, out, {&a}, {}, [](const NDArray& g, auto&, auto&) { return V{g}; });
      return;
    case B::kSub:
      attach(name, out, {&a}, {}, [scalar_first](const NDArray& g, auto&, auto&) {
        return V{scalar_first ? -g : g};
      });
      return;
    case B::kMul:
      attach(name, out, {&a}, {}, [c](const NDArray& g, auto&, auto&) { return V{g * c}; });
      return;
    case B::kDiv:
      if (scalar_first) {  // c / a
        attach(name, out, {&a}, {a}, [c](const NDArray& g, const V& s, auto&) {
          return V{-(g * c) / (s[0] * s[0])};
        });
      } else {
        attach(name, out, {&a}, {}, [c](const NDArray& g, auto&, auto&) { return V{g / c}; });
      }
      return;
    case B::kPow:
      if (scalar_first) {  // c^a: c^a log c
        attach(name, out, {&a}, {out}, [c](const NDArray& g, const V& s, auto&) {
          return V{g * s[0] * std::log(c)};
        });
      } else {  // a^c: c a^(c-1)
        attach(name, out, {&a}, {a}, [c](const NDArray& g, const V& s, auto&) {
          return V{g * nd::pow(s[0], c - 1.0) * c};
        });
      }
      return;
    case B::kMax:  // ties: the gradient goes to the array
      attach(name, out, {&a}, {a}, [c](const NDArray& g, const V& s, auto&) {
        return V{g * mask(s[0] >= c, g.dtype())};
      });
      return;
    case B::kMin:
      attach(name, out, {&a}, {a}, [c](const NDArray& g, const V& s, auto&) {
        return V{g * mask(s[0] <= c, g.dtype())};
      });
      return;
  }
}

void reduce(ops::ReduceOp op, const NDArray& x, bool all, int axis, bool keepdims, const NDArray& out) {
  if (op == ops::ReduceOp::kArgmax || !wanted({&x}) || !is_floating(x.dtype())) return;
  const char* name = to_string(op).data();
  // The output's gradient with the reduced axis kept (length 1), so that it
  // broadcasts against the input.
  Shape kept = x.shape();
  if (all) {
    for (auto& d : kept) d = 1;
  } else {
    kept[axis] = 1;
  }
  auto keep = [kept, keepdims](const NDArray& g) { return keepdims ? g : g.reshape(kept); };
  using V = std::vector<NDArray>;
  switch (op) {
    case ops::ReduceOp::kSum:
      attach(name, out, {&x}, {}, [keep](const NDArray& g, auto&, auto&) { return V{keep(g)}; });
      return;
    case ops::ReduceOp::kMean: {
      const double n = static_cast<double>(x.size()) / static_cast<double>(std::max<std::int64_t>(out.size(), 1));
      attach(name, out, {&x}, {}, [keep, n](const NDArray& g, auto&, auto&) { return V{keep(g) / n}; });
      return;
    }
    case ops::ReduceOp::kMax:
    case ops::ReduceOp::kMin:
      // Ties share the gradient equally.
      attach(name, out, {&x}, {x, out}, [keep, all, axis](const NDArray& g, const V& s, auto&) {
        const NDArray hit = mask(s[0] == keep(s[1]), g.dtype());
        const NDArray count = all ? hit.sum() : hit.sum(axis, true);
        return V{hit * (keep(g) / count)};
      });
      return;
    case ops::ReduceOp::kArgmax:
      return;
  }
}

void same_values(const char* name, const NDArray& x, const NDArray& out) {
  if (!wanted({&x}) || !is_floating(x.dtype()) || !is_floating(out.dtype())) return;
  const DType t = x.dtype();
  const Device dev = x.device();
  const Shape shape = x.shape();
  attach(name, out, {&x}, {}, [t, dev, shape](const NDArray& g, auto&, auto&) {
    NDArray r = as_dtype(g, t).as_in_device(dev);
    // reshape (and a broadcast that only added length-1 axes) keeps the
    // element count: the gradient is reshaped back; a broadcast is summed.
    return std::vector<NDArray>{r.size() == numel(shape) ? r.reshape(shape) : fit(r, shape)};
  });
}

void transpose(const NDArray& x, const std::vector<int>& perm, const NDArray& out) {
  if (!wanted({&x})) return;
  std::vector<int> inverse(perm.size());
  for (std::size_t i = 0; i < perm.size(); ++i) inverse[static_cast<std::size_t>(perm[i])] = static_cast<int>(i);
  attach("transpose", out, {&x}, {}, [inverse](const NDArray& g, auto&, auto&) {
    return std::vector<NDArray>{g.transpose(inverse)};
  });
}

void slice(const NDArray& x, int axis, std::int64_t start, const NDArray& out) {
  if (!wanted({&x})) return;
  const Shape shape = x.shape();
  const std::int64_t stop = start + out.shape()[static_cast<std::size_t>(axis)];
  attach("slice", out, {&x}, {}, [shape, axis, start, stop](const NDArray& g, auto&, auto&) {
    NDArray z = nd::zeros(shape, g.dtype(), g.device());
    z.slice(axis, start, stop).assign(g);
    return std::vector<NDArray>{z};
  });
}

void where(const NDArray& cond, const NDArray& a, const NDArray& b, const NDArray& out) {
  if (!wanted({&a, &b})) return;
  attach("where", out, {&a, &b}, {cond}, [](const NDArray& g, const std::vector<NDArray>& s,
                                             const std::vector<bool>& n) {
    const NDArray z = nd::zeros(g.shape(), g.dtype(), g.device());
    return std::vector<NDArray>{n[0] ? nd::where(s[0], g, z) : NDArray(), n[1] ? nd::where(s[0], z, g) : NDArray()};
  });
}

void matmul(const NDArray& a, const NDArray& b, const NDArray& out) {
  if (!wanted({&a, &b})) return;
  attach("matmul", out, {&a, &b}, {a, b}, [](const NDArray& g, const std::vector<NDArray>& s,
                                             const std::vector<bool>& n) {
    auto t = [](const NDArray& m) { return m.ndim() == 2 ? m.transpose() : m.transpose({0, 2, 1}); };
    return std::vector<NDArray>{n[0] ? nd::matmul(g, t(s[1])) : NDArray(),
                                n[1] ? nd::matmul(t(s[0]), g) : NDArray()};
  });
}

void concat(const std::vector<NDArray>& xs, int axis, const NDArray& out) {
  if (!autograd::is_grad_enabled()) return;
  bool any = false;
  for (const auto& x : xs) any = any || wants_grad(x);
  if (!any) return;
  axis = axis < 0 ? axis + out.ndim() : axis;
  std::vector<const NDArray*> inputs;
  std::vector<std::int64_t> lengths;
  for (const auto& x : xs) {
    inputs.push_back(&x);
    lengths.push_back(x.shape()[static_cast<std::size_t>(axis)]);
  }
  attach("concat", out, inputs, {}, [axis, lengths](const NDArray& g, auto&, const std::vector<bool>& n) {
    std::vector<NDArray> r;
    std::int64_t at = 0;
    for (std::size_t i = 0; i < lengths.size(); ++i) {
      r.push_back(n[i] ? g.slice(axis, at, at + lengths[i]) : NDArray());
      at += lengths[i];
    }
    return r;
  });
}

void cross_entropy(const NDArray& logits, const NDArray& labels, const NDArray& out) {
  if (!wanted({&logits})) return;
  attach("cross_entropy", out, {&logits}, {logits, labels}, [](const NDArray& g, const std::vector<NDArray>& s, auto&) {
    return std::vector<NDArray>{cross_entropy_backward(g, s[0], s[1])};
  });
}

void take_along_last(const NDArray& a, const NDArray& indices, const NDArray& out) {
  if (!wanted({&a}) || !is_floating(a.dtype())) return;
  const Shape shape = a.shape();
  attach("take_along_last", out, {&a}, {indices}, [shape](const NDArray& g, const std::vector<NDArray>& s, auto&) {
    return std::vector<NDArray>{scatter_add_last(g, s[0], shape)};
  });
}

void take(const NDArray& a, const NDArray& indices, const NDArray& out) {
  if (!wanted({&a}) || !is_floating(a.dtype())) return;
  const std::int64_t rows = a.shape()[0];
  attach("take", out, {&a}, {indices}, [rows](const NDArray& g, const std::vector<NDArray>& s, auto&) {
    return std::vector<NDArray>{scatter_add_rows(g, s[0], rows)};
  });
}

void set_grad_hook_impl(const NDArray& leaf, std::function<void()> hook) {
  const ArrayState& s = st(leaf);
  if (!s.autograd || s.autograd->grad_fn) throw InvalidArgument("grad hook: not a leaf that requires grad");
  std::lock_guard lock(s.autograd->lock);
  s.autograd->hook = std::move(hook);
}

namespace {

bool needs(const ArrayState& s) noexcept { return s.autograd && s.autograd->requires_grad; }

// The live array besides `target` that a write through it changes: the base
// `target` views, when that covers the whole buffer. Null when `target`
// covers the buffer itself, or its base is gone (no handle but views can
// read the other elements then, and those are stale after the write).
std::shared_ptr<const ArrayState> written_base(const ArrayState& target) {
  if (covers_storage(target)) return nullptr;
  std::shared_ptr<const ArrayState> root = target.base.lock();
  if (!root || root->storage != target.storage || !covers_storage(*root)) return nullptr;
  return root;
}

// The new history of the values written through `target`: `record` (the
// written values' record, or null for constants) becomes its autograd
// record, and every older handle of its storage stale. A write through a
// view also gives the view's base a new record (PyTorch's CopySlices):
// outside the view the gradient goes to the base's old record, inside it
// to `record`.
void rewrite(const ArrayState& target, std::shared_ptr<AutogradMeta> record) {
  const std::shared_ptr<const ArrayState> root = written_base(target);
  std::shared_ptr<AutogradMeta> root_record;
  if (root && (record || needs(*root))) {
    auto node = std::make_shared<GradNode>();
    node->op = "copy_slices";
    node->seq = g_node_seq.fetch_add(1, std::memory_order_relaxed);
    const bool old = needs(*root);
    const Device dev = root->storage->device;
    node->inputs.push_back(Edge{old ? root->autograd : nullptr, root->shape, root->dtype, dev,
                                old && root->autograd->generation != grad_generation(*root)});
    node->inputs.push_back(Edge{record, target.shape, target.dtype, dev, false});
    // The base is contiguous from offset 0 (it covers the buffer), so the
    // view's geometry applies as it is to a contiguous copy of its gradient.
    node->derivative = [shape = target.shape, strides = target.strides, offset = target.offset](
                           const NDArray& g, auto&, const std::vector<bool>& n) {
      NDArray whole = g.copy();
      NDArray region = strided_view(whole, shape, strides, offset);
      NDArray inside = n[1] ? region.copy() : NDArray();
      if (n[0]) region.assign(nd::zeros(shape, g.dtype(), g.device()));
      return std::vector<NDArray>{n[0] ? whole : NDArray(), inside};
    };
    root_record = std::make_shared<AutogradMeta>();
    root_record->grad_fn = std::move(node);
  }
  const std::uint64_t gen = bump_grad_generation(target);
  if (record) record->generation = gen;
  target.autograd = std::move(record);
  if (root) {
    if (root_record) root_record->generation = gen;
    root->autograd = std::move(root_record);
  }
}

}  // namespace

bool inplace_wanted(const ArrayState& target, std::initializer_list<const ArrayState*> sources) noexcept {
  if (!autograd::is_grad_enabled()) return false;
  if (needs(target)) return true;
  if (std::any_of(sources.begin(), sources.end(), [](const ArrayState* x) { return needs(*x); })) return true;
  // A view of an array in the graph changes that array's values.
  const std::shared_ptr<const ArrayState> root = target.base.lock();
  return root && needs(*root);
}

void check_rebase(const ArrayState& target, const char* op) {
  if (needs(target) && !target.autograd->grad_fn) {
    check_inplace(target, op);  // a leaf that requires grad: refused, saying why
  }
  const std::shared_ptr<const ArrayState> root = target.base.lock();
  if (root && needs(*root) && !root->autograd->grad_fn) {
    throw InvalidArgument(std::string(op) +
                          ": the target is a view of a leaf array that requires grad; it cannot be "
                          "written in place while grad mode is on (write it under "
                          "autograd::NoGradGuard, as an optimizer step does)");
  }
}

void rebase(const NDArray& target, const NDArray& result) {
  const ArrayState& t = st(target);
  const ArrayState& r = st(result);
  {
    autograd::NoGradGuard no_grad;
    if (r.autograd && r.autograd->grad_fn) {
      // What the derivative saved from the target's buffer is about to be
      // overwritten: it keeps a copy, recorded before the write.
      for (Saved& sv : r.autograd->grad_fn->saved) {
        if (st(sv.array).storage == t.storage) {
          sv.array = sv.array.copy();
          sv.version = storage_version(st(sv.array));
        }
      }
    }
    NDArray(target).assign(result);
  }
  rewrite(t, needs(r) ? r.autograd : nullptr);
}

void assign(const NDArray& target, const NDArray& source) {
  const ArrayState& t = st(target);
  if (!wants_grad(source) || !is_floating(source.dtype()) || !is_floating(t.dtype)) {
    rewrite(t, nullptr);  // constant values now
    return;
  }
  const DType type = source.dtype();
  const Device dev = source.device();
  const Shape shape = source.shape();
  // attach() gives the target a new record; the edge to the source is made
  // from the source's current one.
  attach("assign", target, {&source}, {}, [type, dev, shape](const NDArray& g, auto&, auto&) {
    return std::vector<NDArray>{fit(as_dtype(g, type).as_in_device(dev), shape)};
  });
  rewrite(t, t.autograd);
}

void check_inplace(const ArrayState& s, const char* op) {
  if (!autograd::is_grad_enabled()) return;
  if (!s.autograd || !s.autograd->requires_grad) return;
  if (!s.autograd->grad_fn) {
    throw InvalidArgument(std::string(op) +
                          ": a leaf array that requires grad cannot be written in place while grad mode "
                          "is on; write it under autograd::NoGradGuard (as an optimizer step does)");
  }
  throw InvalidArgument(std::string(op) + ": the array was made by '" + s.autograd->grad_fn->op +
                        "' and is part of the gradient graph; in-place writes to it are not "
                        "supported (use the out-of-place form, e.g. a = a + b)");
}

}  // namespace grad

void set_grad_hook(const NDArray& leaf, std::function<void()> hook) { grad::set_grad_hook_impl(leaf, std::move(hook)); }

void replace_grad(const NDArray& leaf, NDArray g) {
  const ArrayState& s = st(leaf);
  if (!s.autograd || s.autograd->grad_fn) throw InvalidArgument("replace_grad: not a leaf that requires grad");
  std::lock_guard lock(s.autograd->lock);
  s.autograd->grad = std::move(g);
}

}  // namespace detail

using detail::Access;
using detail::AutogradMeta;
using detail::GradNode;

NDArray& NDArray::requires_grad(bool on) {
  const auto& s = Access::meta(*this, "requires_grad");
  if (!is_floating(s->dtype)) {
    throw InvalidArgument("requires_grad: only float32 and float64 arrays carry gradients, got " +
                          std::string(to_string(s->dtype)));
  }
  if (on) {
    if (!s->autograd) {
      s->autograd = std::make_shared<AutogradMeta>();
      s->autograd->generation = detail::grad_generation(*s);
    } else {
      s->autograd->requires_grad = true;
    }
  } else if (s->autograd) {
    if (s->autograd->grad_fn) {
      throw InvalidArgument("requires_grad(false): the array was made by '" +
                            std::string(s->autograd->grad_fn->op) +
                            "'; only a leaf can stop requiring grad (use detach())");
    }
    s->autograd->requires_grad = false;
  }
  return *this;
}

bool NDArray::requires_grad() const {
  const auto& s = Access::meta(*this, "requires_grad");
  return s->autograd && s->autograd->requires_grad;
}

bool NDArray::is_leaf() const {
  const auto& s = Access::meta(*this, "is_leaf");
  return !s->autograd || !s->autograd->grad_fn;
}

NDArray NDArray::grad() const {
  const auto& s = Access::state(*this, "grad");
  if (!s->autograd || s->autograd->grad_fn) return NDArray();
  std::lock_guard lock(s->autograd->lock);
  return s->autograd->grad;
}

void NDArray::zero_grad() {
  const auto& s = Access::state(*this, "zero_grad");
  if (!s->autograd || s->autograd->grad_fn) return;
  std::lock_guard lock(s->autograd->lock);
  s->autograd->grad = NDArray();
}

NDArray NDArray::detach() const {
  const auto& s = Access::state(*this, "detach");
  auto d = detail::make_pooled<detail::ArrayState>();
  d->storage = s->storage;
  d->shape = s->shape;
  d->strides = s->strides;
  d->offset = s->offset;
  d->dtype = s->dtype;
  return Access::wrap(std::move(d));
}

void NDArray::backward(const NDArray& gradient, bool retain_graph) const {
  const auto& s = Access::state(*this, "backward");
  const std::shared_ptr<AutogradMeta> root = s->autograd;
  if (!root || !root->requires_grad) {
    throw InvalidArgument(
        "backward: the array does not require grad (no input of the ops that made it had "
        "requires_grad(true), or they were recorded under NoGradGuard)");
  }
  if (!gradient.valid()) {
    if (size() != 1) {
      throw InvalidArgument("backward: an array of shape " + to_string(s->shape) +
                            " needs its gradient passed (it may be omitted only for one element)");
    }
  } else {
    if (gradient.shape() != s->shape || gradient.dtype() != s->dtype) {
      throw InvalidArgument("backward: the gradient (" + std::string(to_string(gradient.dtype())) + " " +
                            to_string(gradient.shape()) + ") must match the array (" +
                            std::string(to_string(s->dtype)) + " " + to_string(s->shape) + ")");
    }
    if (!(gradient.device() == device())) {
      throw DeviceMismatch("backward: the gradient lives on " + gradient.device().str() + " and the array on " +
                           device().str());
    }
  }
  // The seed, recorded only once every check has passed.
  auto seed = [&] {
    autograd::NoGradGuard no_grad;
    return gradient.valid() ? gradient : nd::ones(s->shape, s->dtype, device());
  };
  std::lock_guard lock(detail::g_backward);
  if (!root->grad_fn) {  // a leaf: its gradient is g
    detail::accumulate(*root, seed(), /*owned=*/false);
    return;
  }
  // The walk: every node reachable from the root and how many consumers
  // each has within it. Nothing is recorded until every node passed.
  std::unordered_map<GradNode*, int> consumers;
  std::vector<GradNode*> stack{root->grad_fn.get()};
  consumers[root->grad_fn.get()] = 0;
  while (!stack.empty()) {
    GradNode* n = stack.back();
    stack.pop_back();
    if (n->released) {
      throw InvalidArgument(std::string("backward: a second backward through '") + n->op +
                            "', whose saved arrays the first one released; pass retain_graph=true to "
                            "the first backward to keep them");
    }
    for (std::size_t i = 0; i < n->saved.size(); ++i) {
      const auto now = detail::storage_version(detail::st(n->saved[i].array));
      if (now != n->saved[i].version) {
        throw InvalidArgument(std::string("backward: an array of shape ") +
                              to_string(n->saved[i].array.shape()) + " saved by '" + n->op +
                              "' for its gradient was modified in place after it was saved (version " +
                              std::to_string(n->saved[i].version) + " then, " + std::to_string(now) +
                              " now); use an out-of-place op (a = a + b) or a copy()");
      }
    }
    for (const auto& e : n->inputs) {
      if (e.stale) {
        throw InvalidArgument(std::string("backward: '") + n->op + "' read an array of shape " +
                              to_string(e.shape) +
                              " through a handle made before its buffer was written in place with a "
                              "gradient; its gradient would reach the values before that write (make "
                              "the view again after the write)");
      }
      if (!e.meta || !e.meta->grad_fn) continue;
      GradNode* c = e.meta->grad_fn.get();
      auto [it, fresh] = consumers.try_emplace(c, 0);
      ++it->second;
      if (fresh) stack.push_back(c);
    }
  }
  // Buffers made from here on by this thread are the walk's own.
  const std::uint64_t mark = detail::storage_mark();
  const NDArray g = seed();
  autograd::NoGradGuard no_grad;
  std::vector<const void*> given;  // the buffers leaves received as they are
  auto later = [](const GradNode* a, const GradNode* b) { return a->seq < b->seq; };
  std::priority_queue<GradNode*, std::vector<GradNode*>, decltype(later)> ready(later);
  std::unordered_map<GradNode*, NDArray> pending;
  pending[root->grad_fn.get()] = g;
  ready.push(root->grad_fn.get());
  while (!ready.empty()) {
    GradNode* n = ready.top();
    ready.pop();
    const NDArray gout = std::move(pending[n]);
    pending.erase(n);
    std::vector<NDArray> saved;
    saved.reserve(n->saved.size());
    for (const auto& sv : n->saved) saved.push_back(sv.array);
    std::vector<bool> needs;
    for (const auto& e : n->inputs) needs.push_back(e.meta != nullptr);
    std::vector<NDArray> grads = n->derivative(gout, saved, needs);
    saved.clear();
    for (std::size_t i = 0; i < n->inputs.size(); ++i) {
      const auto& e = n->inputs[i];
      if (!e.meta) continue;
      NDArray gi;
      if (i < grads.size() && grads[i].valid()) gi = detail::fit(std::move(grads[i]), e.shape);
      if (!e.meta->grad_fn) {
        if (gi.valid()) {
          // The leaf's own when the walk made the buffer (not the seed, a
          // saved array or anything a derivative captured), no other leaf
          // got it, and no other gradient of this node still holds it. (A
          // recorded op holding it, as every result's record does until it
          // runs, does not count.)
          const detail::ArrayState& st = *Access::peek(gi);
          const void* id = detail::storage_id(st);
          bool owned = detail::made_since(st, mark) && std::find(given.begin(), given.end(), id) == given.end();
          for (std::size_t j = i + 1; owned && j < grads.size(); ++j) {
            owned = !(grads[j].valid() && detail::storage_id(*Access::peek(grads[j])) == id);
          }
          if (owned) given.push_back(id);
          detail::accumulate(*e.meta, gi, owned);
        }
        continue;
      }
      GradNode* c = e.meta->grad_fn.get();
      if (gi.valid()) {
        auto it = pending.find(c);
        if (it == pending.end()) {
          pending.emplace(c, std::move(gi));
        } else {
          it->second = it->second + gi;
        }
      }
      // Every consumer counts, one that gave no gradient too; a node that
      // received none has nothing to pass on.
      if (--consumers[c] == 0 && pending.count(c) != 0) ready.push(c);
    }
    if (!retain_graph) {
      n->derivative = nullptr;
      n->saved.clear();
      n->released = true;
    }
  }
}

}  // namespace lazydag
