// operator<< for NDArray: NumPy-like text, with the middle of each long axis
// elided when the array has more than 1000 elements. It blocks (it reads).
#include <lazydag/ndarray.hpp>

#include <cstdio>
#include <memory>
#include <ostream>
#include <string>

namespace lazydag {

namespace {

constexpr std::int64_t kThreshold = 1000;
constexpr std::int64_t kEdgeItems = 3;

template <class T>
std::string format(T v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_floating_point_v<T>) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.6g", static_cast<double>(v));
    std::string s(buf);
    if (s.find_first_of(".eEn") == std::string::npos) s += ".";  // 1 -> "1." like NumPy
    return s;
  } else {
    return std::to_string(v);
  }
}

template <class T>
void print_axis(std::ostream& os, const std::vector<T>& v, const Shape& shape,
                const Strides& strides, int dim, std::int64_t base, bool elide, int indent) {
  if (shape.empty()) {
    os << format(v[0]);
    return;
  }
  os << '[';
  const std::int64_t n = shape[dim];
  const bool last = dim + 1 == static_cast<int>(shape.size());
  for (std::int64_t i = 0; i < n; ++i) {
    if (elide && n > 2 * kEdgeItems && i == kEdgeItems) {
      os << (last ? "..., " : "...,\n" + std::string(indent + 1, ' '));
      i = n - kEdgeItems;
    }
    const std::int64_t at = base + i * strides[dim];
    if (last) {
      os << format(v[static_cast<std::size_t>(at)]);
    } else {
      print_axis(os, v, shape, strides, dim + 1, at, elide, indent + 1);
    }
    if (i + 1 < n) os << (last ? ", " : ",\n" + std::string(indent + 1, ' '));
  }
  os << ']';
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const NDArray& a) {
  dispatch(a.dtype(), [&]<class T>() {
    // blocks; counted as a print (its call site is this function)
    const std::vector<T> v = a.template read_all<T>(
        "operator<<", {engine::BlockingCall::kPrint, std::source_location::current()});
    const Shape& s = a.shape();
    os << "array(";
    print_axis(os, v, s, contiguous_strides(s), 0, 0, a.size() > kThreshold, 6);
    os << ", dtype=" << to_string(a.dtype()) << ")";
  });
  return os;
}

}  // namespace lazydag
