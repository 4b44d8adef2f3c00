// Independent references for the NDArray tests: random inputs from <random>,
// broadcasting by explicit index arithmetic, and comparisons in double.
#pragma once

#include <doctest/doctest.h>

#include <lazydag/lazydag.hpp>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

namespace lazydag::test {

/// n values uniform in [lo, hi) (integers for integral T), never all zero.
template <class T>
std::vector<T> random_values(std::int64_t n, std::uint32_t seed, double lo = -3.0, double hi = 3.0) {
  std::mt19937 rng(seed);
  std::vector<T> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) {
    if constexpr (std::is_same_v<T, bool>) {
      v[i] = rng() % 2 == 0;
    } else if constexpr (std::is_integral_v<T>) {
      v[i] = static_cast<T>(
          std::uniform_int_distribution<long>(static_cast<long>(lo), static_cast<long>(hi))(rng));
    } else {
      v[i] = static_cast<T>(std::uniform_real_distribution<double>(lo, hi)(rng));
    }
  }
  return v;
}

/// Row-major flat index into `in_shape` of the element that broadcasts to
/// output flat index `o` of `out_shape`.
inline std::int64_t broadcast_index(const Shape& out_shape, const Shape& in_shape, std::int64_t o) {
  std::int64_t idx = 0;
  std::int64_t stride = 1;
  const std::size_t r = in_shape.size();
  const std::size_t R = out_shape.size();
  for (std::size_t k = 0; k < R; ++k) {
    const std::size_t d = R - 1 - k;
    const std::int64_t coord = o % out_shape[d];
    o /= out_shape[d];
    if (k < r) {
      const std::int64_t dim = in_shape[r - 1 - k];
      idx += (dim == 1 ? 0 : coord) * stride;
      stride *= dim;
    }
  }
  return idx;
}

/// Values of an array as doubles (blocks).
inline std::vector<double> values(const NDArray& a) {
  std::vector<double> out;
  dispatch(a.dtype(), [&]<class T>() {
    for (auto v : a.to_vector<T>()) out.push_back(static_cast<double>(v));
  });
  return out;
}

/// Tolerance for results computed in `t`.
inline double tolerance(DType t) {
  return t == DType::kFloat32 ? 2e-5 : t == DType::kFloat64 ? 1e-12 : 0.0;
}

inline void check_close(const std::vector<double>& got, const std::vector<double>& want, double tol) {
  REQUIRE(got.size() == want.size());
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - want[i]);
    const bool both_nan = std::isnan(got[i]) && std::isnan(want[i]);
    if (!both_nan && err > tol * std::max(1.0, std::abs(want[i]))) {
      if (++bad <= 5) {
        CAPTURE(i);
        CHECK(got[i] == doctest::Approx(want[i]));
      }
    }
  }
  CHECK(bad == 0);
}

inline const std::vector<DType>& numeric_dtypes() {
  static const std::vector<DType> v = {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64};
  return v;
}

/// An array of dtype t with random values (from doubles, converted exactly).
inline NDArray random_array(const Shape& shape, DType t, std::uint32_t seed, double lo = -3.0,
                            double hi = 3.0) {
  return dispatch(t, [&]<class T>() {
    return nd::array<T>(random_values<T>(numel(shape), seed, lo, hi), shape);
  });
}

}  // namespace lazydag::test
