// Shape rules shared by the operators, and the names of dtypes and ops.
#include <lazydag/ops/dtype.hpp>
#include <lazydag/ops/kernels.hpp>
#include <lazydag/ops/shape.hpp>

#include <algorithm>
#include <limits>

namespace lazydag {

std::string_view to_string(DType t) noexcept {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kInt32: return "int32";
    case DType::kInt64: return "int64";
    case DType::kBool: return "bool";
  }
  return "unknown";
}

std::size_t size_of(DType t) noexcept {
  switch (t) {
    case DType::kFloat32: return 4;
    case DType::kFloat64: return 8;
    case DType::kInt32: return 4;
    case DType::kInt64: return 8;
    case DType::kBool: return 1;
  }
  return 0;
}

std::string to_string(std::span<const std::int64_t> shape) {
  std::string s = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    if (i != 0) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

std::int64_t numel(std::span<const std::int64_t> shape) noexcept {
  std::int64_t n = 1;
  for (auto d : shape) n *= d;
  return n;
}

Strides contiguous_strides(std::span<const std::int64_t> shape) {
  Strides s(shape.size());
  std::int64_t acc = 1;
  for (std::size_t i = shape.size(); i-- > 0;) {
    s[i] = acc;
    acc *= std::max<std::int64_t>(shape[i], 1);
  }
  return s;
}

void check_shape(std::span<const std::int64_t> shape, std::string_view op) {
  if (shape.size() > static_cast<std::size_t>(kMaxRank)) {
    throw InvalidArgument(std::string(op) + ": rank " + std::to_string(shape.size()) +
                          " exceeds the maximum of " + std::to_string(kMaxRank));
  }
  std::int64_t extent = 1;  // zero dims as one: the strides are products of the others
  bool too_large = false;
  for (auto d : shape) {
    if (d < 0) {
      throw InvalidArgument(std::string(op) + ": negative dimension in shape " +
                            to_string(shape));
    }
    if (too_large) continue;
    std::int64_t next = 0;
    too_large = __builtin_mul_overflow(extent, std::max<std::int64_t>(d, 1), &next) ||
                next > kMaxElements;
    extent = next;
  }
  if (too_large) {
    throw InvalidArgument(std::string(op) + ": shape " + to_string(shape) +
                          " has too many elements (the product of its dimensions exceeds " +
                          std::to_string(kMaxElements) + ")");
  }
}

std::int64_t checked_dim_sum(std::int64_t a, std::int64_t b, std::string_view op) {
  std::int64_t s = 0;
  if (__builtin_add_overflow(a, b, &s) || s > kMaxElements) {
    throw InvalidArgument(std::string(op) + ": a dimension of " + std::to_string(a) + " + " +
                          std::to_string(b) + " exceeds the maximum of " +
                          std::to_string(kMaxElements) + " elements");
  }
  return s;
}

}  // namespace lazydag

namespace lazydag::ops {

std::string_view to_string(UnaryOp op) noexcept {
  constexpr std::string_view names[] = {"neg", "abs", "exp", "log", "sqrt", "tanh", "sigmoid", "relu", "log1p"};
  return names[static_cast<int>(op)];
}
std::string_view to_string(BinaryOp op) noexcept {
  constexpr std::string_view names[] = {"add", "sub", "mul", "div", "pow", "maximum", "minimum"};
  return names[static_cast<int>(op)];
}
std::string_view to_string(CompareOp op) noexcept {
  constexpr std::string_view names[] = {"equal", "not_equal", "less", "less_equal", "greater",
                                        "greater_equal"};
  return names[static_cast<int>(op)];
}
std::string_view to_string(ReduceOp op) noexcept {
  constexpr std::string_view names[] = {"sum", "mean", "max", "min", "argmax"};
  return names[static_cast<int>(op)];
}

Shape broadcast_shapes(std::span<const std::int64_t> a, std::span<const std::int64_t> b,
                       std::string_view op) {
  const std::size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (std::size_t i = 0; i < rank; ++i) {
    std::int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    std::int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1) {
      throw InvalidArgument(std::string(op) + ": shapes " + lazydag::to_string(a) + " and " +
                            lazydag::to_string(b) + " cannot be broadcast together");
    }
    out[i] = da == 1 ? db : da;
  }
  check_shape(out, op);  // (2^40, 1) and (1, 2^40) each fit; their broadcast does not
  return out;
}

int normalize_axis(int axis, int rank, std::string_view op) {
  if (axis < -rank || axis >= rank) {
    throw InvalidArgument(std::string(op) + ": axis " + std::to_string(axis) +
                          " is out of range for an array of rank " + std::to_string(rank));
  }
  return axis < 0 ? axis + rank : axis;
}

Shape reduced_shape(std::span<const std::int64_t> shape, bool all, int axis, bool keepdims) {
  Shape out;
  for (int d = 0; d < static_cast<int>(shape.size()); ++d) {
    if (all || d == axis) {
      if (keepdims) out.push_back(1);
    } else {
      out.push_back(shape[d]);
    }
  }
  return out;
}

Shape matmul_shape(std::span<const std::int64_t> a, std::span<const std::int64_t> b) {
  auto fail = [&](const std::string& why) {
    return InvalidArgument("matmul: " + why + " (shapes " + lazydag::to_string(a) + " and " +
                           lazydag::to_string(b) + ")");
  };
  if (a.size() != b.size() || (a.size() != 2 && a.size() != 3)) {
    throw fail("operands must both be 2-D or both be 3-D (batched)");
  }
  const std::size_t r = a.size();
  if (a[r - 1] != b[r - 2]) throw fail("inner dimensions differ");
  if (r == 3 && a[0] != b[0]) throw fail("batch dimensions differ");
  // BLAS (OpenBLAS's and cuBLAS's 32-bit interfaces) takes int dimensions.
  for (std::int64_t d : {a[0], a[r - 1], b[r - 1], r == 3 ? a[1] : 0}) {
    if (d > std::numeric_limits<std::int32_t>::max()) {
      throw fail("a dimension of " + std::to_string(d) + " exceeds the BLAS limit of 2147483647");
    }
  }
  Shape out(a.begin(), a.end());
  out[r - 1] = b[r - 1];
  return out;
}

GemmLayout gemm_layout(std::span<const std::int64_t> shape, std::span<const std::int64_t> strides) {
  GemmLayout g;
  const std::size_t r = shape.size();
  if (r < 2 || strides.size() != r) return g;
  const std::int64_t rows = shape[r - 2];
  const std::int64_t cols = shape[r - 1];
  const std::int64_t sr = strides[r - 2];
  const std::int64_t sc = strides[r - 1];
  constexpr std::int64_t kIntMax = std::numeric_limits<std::int32_t>::max();
  g.batch_stride = r == 3 ? strides[0] : 0;
  if (g.batch_stride < 0) return g;
  // A dim of extent 1 has no stride to respect: its step is free.
  if ((cols == 1 || sc == 1) && (rows == 1 || sr >= std::max<std::int64_t>(cols, 1))) {
    g.trans = false;
    g.ld = rows == 1 ? std::max<std::int64_t>(cols, 1) : sr;
  } else if ((rows == 1 || sr == 1) && (cols == 1 || sc >= std::max<std::int64_t>(rows, 1))) {
    g.trans = true;
    g.ld = cols == 1 ? std::max<std::int64_t>(rows, 1) : sc;
  } else {
    return g;
  }
  g.usable = g.ld <= kIntMax;
  return g;
}

Shape reshape_shape(std::span<const std::int64_t> from, std::span<const std::int64_t> wanted) {
  Shape out(wanted.begin(), wanted.end());
  int infer = -1;
  std::int64_t known = 1;
  for (int i = 0; i < static_cast<int>(out.size()); ++i) {
    if (out[i] == -1) {
      if (infer >= 0) throw InvalidArgument("reshape: more than one -1 in " + lazydag::to_string(wanted));
      infer = i;
    } else if (out[i] < 0) {
      throw InvalidArgument("reshape: negative dimension in " + lazydag::to_string(wanted));
    }
  }
  // The known dims alone must make a valid shape (a -1 stands for one
  // element here): their product is then computed without overflow.
  Shape probe = out;
  if (infer >= 0) probe[infer] = 1;
  check_shape(probe, "reshape");
  known = numel(probe);
  const std::int64_t total = numel(from);
  if (infer >= 0) {
    if (known == 0 || total % known != 0) {
      throw InvalidArgument("reshape: cannot reshape " + lazydag::to_string(from) + " (" +
                            std::to_string(total) + " elements) into " + lazydag::to_string(wanted));
    }
    out[infer] = total / known;
  }
  check_shape(out, "reshape");
  if (numel(out) != total) {
    throw InvalidArgument("reshape: cannot reshape " + lazydag::to_string(from) + " (" +
                          std::to_string(total) + " elements) into " + lazydag::to_string(wanted));
  }
  return out;
}

void check_permutation(std::span<const int> perm, int rank) {
  std::vector<bool> seen(static_cast<std::size_t>(rank), false);
  bool ok = static_cast<int>(perm.size()) == rank;
  for (int p : perm) {
    if (!ok || p < 0 || p >= rank || seen[p]) {
      ok = false;
      break;
    }
    seen[p] = true;
  }
  if (!ok) {
    std::string s = "(";
    for (std::size_t i = 0; i < perm.size(); ++i) s += (i ? ", " : "") + std::to_string(perm[i]);
    throw InvalidArgument("transpose: " + s + ") is not a permutation of the " +
                          std::to_string(rank) + " axes");
  }
}

}  // namespace lazydag::ops
