// The CUDA kernels' element indexing (ops/src/indexer.hpp), compiled for
// the host: the same arithmetic the GPU runs, checked here without one.
// IntDivider against `/` on edge and random divisors and dividends; the
// Indexer's operand offsets against a plain unravel of the linear index on
// random shapes with dense, broadcast, transposed and sliced operands, on
// both its 32-bit and 64-bit paths.
#include <doctest/doctest.h>

#include "../../ops/src/indexer.hpp"

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

using lazydag::Shape;
using lazydag::Strides;
using lazydag::ops::TensorView;
using lazydag::ops::detail::IntDivider;
using lazydag::ops::detail::Indexer;
using lazydag::ops::detail::make_indexer;

namespace {

constexpr std::uint32_t kLimit = IntDivider::kLimit;

void check_divisor(std::uint32_t d, std::mt19937_64& rng) {
  const IntDivider div(d);
  REQUIRE(div.divisor() == d);
  std::vector<std::uint32_t> ns = {0, 1, 2, d - 1, d, d + 1, 2 * d - 1, 2 * d, kLimit - 1, kLimit - 2, kLimit - d};
  for (std::uint32_t m : {3U, 1000U, 65536U, 1U << 20}) {
    if (static_cast<std::uint64_t>(d) * m + 1 < kLimit) {
      ns.push_back(d * m - 1);
      ns.push_back(d * m);
      ns.push_back(d * m + 1);
    }
  }
  std::uniform_int_distribution<std::uint32_t> any(0, kLimit - 1);
  for (int k = 0; k < 200; ++k) ns.push_back(any(rng));
  for (std::uint32_t n : ns) {
    if (n >= kLimit) continue;
    const std::uint32_t q = div.div(n);
    if (q != n / d) {
      FAIL_CHECK("IntDivider(" << d << ").div(" << n << ") = " << q << ", expected " << n / d);
      return;
    }
  }
}

// The offset of `v`'s element for out's row-major index i, the slow way:
// unravel i over out_shape, then broadcast v's dims from the right.
std::int64_t naive_offset(const TensorView& v, const Shape& out_shape, std::int64_t i) {
  const std::size_t rank = out_shape.size();
  const std::size_t r = v.shape.size();
  std::int64_t o = v.offset;
  for (std::size_t d = rank; d-- > 0;) {
    const std::int64_t idx = i % out_shape[d];
    i /= out_shape[d];
    if (d + r >= rank) {
      const std::size_t vd = d + r - rank;
      if (v.shape[vd] != 1) o += idx * v.strides[vd];
    }
  }
  return o;
}

Strides row_major(const Shape& s) {
  Strides st(s.size(), 1);
  for (std::size_t d = s.size(); d-- > 1;) st[d - 1] = st[d] * s[d];
  return st;
}

// A random operand broadcast to `out`: dense, with some dims 1 (or fewer
// dims), transposed (its strides permuted) or sliced (every other element
// of a larger array, at an offset).
TensorView random_operand(const Shape& out, std::mt19937_64& rng) {
  TensorView v;
  const std::size_t drop = std::uniform_int_distribution<std::size_t>(0, out.size())(rng) % 2 == 0
                               ? 0
                               : std::uniform_int_distribution<std::size_t>(0, out.size())(rng);
  for (std::size_t d = drop; d < out.size(); ++d) {
    v.shape.push_back(std::uniform_int_distribution<int>(0, 3)(rng) == 0 ? 1 : out[d]);
  }
  if (v.shape.empty()) v.shape.push_back(1);
  v.strides = row_major(v.shape);
  switch (std::uniform_int_distribution<int>(0, 3)(rng)) {
    case 0: break;  // dense
    case 1: {       // transposed: strides of a permuted array
      std::vector<std::size_t> perm(v.shape.size());
      std::iota(perm.begin(), perm.end(), 0);
      std::shuffle(perm.begin(), perm.end(), rng);
      Shape ps;
      for (std::size_t p : perm) ps.push_back(v.shape[p]);
      const Strides pst = row_major(ps);
      for (std::size_t k = 0; k < perm.size(); ++k) v.strides[perm[k]] = pst[k];
      break;
    }
    case 2:  // sliced: every other element of each dim, from an offset
      for (std::size_t d = 0; d < v.shape.size(); ++d) v.strides[d] *= 2 << v.shape.size();
      v.offset = std::uniform_int_distribution<std::int64_t>(0, 100)(rng);
      break;
    default:  // a column or a scalar-like view: dims of 1 with odd strides
      for (std::size_t d = 0; d < v.shape.size(); ++d) {
        if (v.shape[d] == 1) v.strides[d] = 12345;
      }
      break;
  }
  return v;
}

template <int N>
void check_offsets(const Indexer<N>& ix, const TensorView* const (&views)[N], const Shape& out,
                   std::int64_t i) {
  std::int64_t o[N];
  ix.offsets(i, o);
  for (int k = 0; k < N; ++k) {
    const std::int64_t want = naive_offset(*views[k], out, i);
    if (o[k] != want) {
      FAIL_CHECK("operand " << k << " at index " << i << " (rank " << ix.rank << ", narrow " << ix.narrow
                            << "): offset " << o[k] << ", expected " << want);
      return;
    }
  }
  // The first `count` operands only: the rest untouched.
  std::int64_t part[N];
  std::fill(part, part + N, -7);
  ix.offsets(i, part, 1);
  CHECK(part[0] == o[0]);
  for (int k = 1; k < N; ++k) CHECK(part[k] == -7);
}

}  // namespace

TEST_CASE("Indexer.IntDividerMatchesDivision") {
  std::mt19937_64 rng(20261206);
  for (std::uint32_t d = 1; d <= 4096; ++d) check_divisor(d, rng);
  for (int s = 12; s < 31; ++s) {
    const std::uint32_t p = 1U << s;
    for (std::uint32_t d : {p - 1, p, p + 1}) {
      if (d < kLimit) check_divisor(d, rng);
    }
  }
  check_divisor(kLimit - 1, rng);
  std::uniform_int_distribution<std::uint32_t> any(1, kLimit - 1);
  for (int k = 0; k < 2000; ++k) check_divisor(any(rng), rng);
}

TEST_CASE("Indexer.OffsetsMatchUnravelOnRandomViews") {
  std::mt19937_64 rng(7);
  for (int trial = 0; trial < 400; ++trial) {
    Shape out;
    const int rank = std::uniform_int_distribution<int>(1, 6)(rng);
    for (int d = 0; d < rank; ++d) out.push_back(std::uniform_int_distribution<int>(1, 6)(rng));
    const TensorView a = random_operand(out, rng);
    const TensorView b = random_operand(out, rng);
    TensorView y;
    y.shape = out;
    y.strides = row_major(out);
    const TensorView* const views[3] = {&a, &b, &y};
    Indexer<3> ix = make_indexer<3>(views, out);
    const std::int64_t n = lazydag::numel(out);
    REQUIRE(ix.narrow);
    for (std::int64_t i = 0; i < n; ++i) check_offsets(ix, views, out, i);
    // The 64-bit path of the same nest.
    ix.narrow = false;
    for (std::int64_t i = 0; i < n; ++i) check_offsets(ix, views, out, i);
  }
}

TEST_CASE("Indexer.DenseMergesToOneDimAndLargeDomainsUse64Bits") {
  // Dense operands and one broadcast element: one dim, no division.
  const Shape out{4, 5, 6};
  TensorView a;
  a.shape = out;
  a.strides = row_major(out);
  TensorView s;
  s.shape = Shape{1};
  s.strides = Strides{0};
  const TensorView* const dense[2] = {&a, &s};
  CHECK(make_indexer<2>(dense, out).rank == 1);

  // A row broadcast over 2^31 + 3 * 2^20 elements (nothing is allocated: the
  // indexer only computes offsets): past the 32-bit path's range.
  const Shape big{2048 + 3, std::int64_t{1} << 20};
  TensorView row;
  row.shape = Shape{std::int64_t{1} << 20};
  row.strides = Strides{1};
  TensorView col;
  col.shape = Shape{big[0], 1};
  col.strides = Strides{1, 1};
  TensorView y;
  y.shape = big;
  y.strides = row_major(big);
  const TensorView* const views[3] = {&row, &col, &y};
  const Indexer<3> ix = make_indexer<3>(views, big);
  CHECK_FALSE(ix.narrow);
  CHECK(ix.rank == 2);
  std::mt19937_64 rng(11);
  const std::int64_t n = lazydag::numel(big);
  std::uniform_int_distribution<std::int64_t> any(0, n - 1);
  for (std::int64_t i : {std::int64_t{0}, n - 1, (std::int64_t{1} << 31) - 1, std::int64_t{1} << 31}) {
    check_offsets(ix, views, big, i);
  }
  for (int k = 0; k < 10000; ++k) check_offsets(ix, views, big, any(rng));
}
