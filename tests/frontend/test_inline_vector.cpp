// lazydag::InlineVector (Shape, Strides) against std::vector: random
// sequences of every mutating call, inline and spilled to the heap,
// including inserts and assigns from the vector's own elements.
#include <doctest/doctest.h>

#include <lazydag/ops/shape.hpp>

#include <numeric>
#include <random>
#include <span>
#include <vector>

using lazydag::InlineVector;

namespace {

using Small = InlineVector<std::int64_t, 4>;

void same(const Small& s, const std::vector<std::int64_t>& v) {
  REQUIRE(s.size() == v.size());
  REQUIRE(s.empty() == v.empty());
  CHECK(std::vector<std::int64_t>(s.begin(), s.end()) == v);
  CHECK(s.to_vector() == v);
  const std::span<const std::int64_t> view = s;  // contiguous: spans take it
  CHECK(view.size() == v.size());
  if (!v.empty()) {
    CHECK(s.front() == v.front());
    CHECK(s.back() == v.back());
    CHECK(std::vector<std::int64_t>(s.rbegin(), s.rend()) == std::vector<std::int64_t>(v.rbegin(), v.rend()));
  }
}

}  // namespace

TEST_CASE("InlineVector does what std::vector does, inline and on the heap") {
  std::mt19937 rng(7);
  auto pick = [&](std::size_t n) { return static_cast<std::size_t>(rng() % n); };
  for (int round = 0; round < 300; ++round) {
    Small s;
    std::vector<std::int64_t> v;
    for (int step = 0; step < 40; ++step) {
      const auto x = static_cast<std::int64_t>(rng() % 100) - 50;
      switch (pick(12)) {
        case 0: s.push_back(x); v.push_back(x); break;
        case 1:
          if (!v.empty()) {
            s.pop_back();
            v.pop_back();
          }
          break;
        case 2: {
          const std::size_t at = pick(v.size() + 1);
          s.insert(s.begin() + at, x);
          v.insert(v.begin() + static_cast<std::ptrdiff_t>(at), x);
          break;
        }
        case 3: {  // a range of its own elements, at any place
          const std::size_t at = pick(v.size() + 1);
          const std::size_t a = pick(v.size() + 1);
          const std::size_t b = a + pick(v.size() - a + 1);
          const std::vector<std::int64_t> copy(v.begin() + static_cast<std::ptrdiff_t>(a),
                                               v.begin() + static_cast<std::ptrdiff_t>(b));
          s.insert(s.begin() + at, s.begin() + a, s.begin() + b);
          v.insert(v.begin() + static_cast<std::ptrdiff_t>(at), copy.begin(), copy.end());
          break;
        }
        case 4:
          if (!v.empty()) {
            const std::size_t a = pick(v.size());
            const std::size_t b = a + pick(v.size() - a + 1);
            s.erase(s.begin() + a, s.begin() + b);
            v.erase(v.begin() + static_cast<std::ptrdiff_t>(a), v.begin() + static_cast<std::ptrdiff_t>(b));
          }
          break;
        case 5: {
          const std::size_t n = pick(12);
          s.resize(n, x);
          v.resize(n, x);
          break;
        }
        case 6: {
          const std::size_t n = pick(12);
          s.assign(n, x);
          v.assign(n, x);
          break;
        }
        case 7:
          if (!v.empty()) {  // its own tail (aliasing)
            const std::size_t a = pick(v.size());
            s.assign(s.begin() + a, s.end());
            v.assign(v.begin() + static_cast<std::ptrdiff_t>(a), v.end());
          }
          break;
        case 8: {  // copies and moves, both directions of inline/heap
          Small copy = s;
          same(copy, v);
          Small moved = std::move(copy);
          same(moved, v);
          CHECK(copy.empty());  // NOLINT(bugprone-use-after-move): moved-from is empty
          s = moved;
          Small other{1, 2, 3, 4, 5, 6};
          other = std::move(moved);
          same(other, v);
          s = std::move(other);
          break;
        }
        case 9:
          if (!v.empty()) {
            const std::size_t at = pick(v.size());
            s[at] = x;
            v[at] = x;
            CHECK(s.at(at) == x);
          }
          break;
        case 10: {
          const std::size_t n = pick(3);
          const std::size_t at = pick(v.size() + 1);
          s.insert(s.begin() + at, n, s.empty() ? x : s.front());  // the value may live in it
          v.insert(v.begin() + static_cast<std::ptrdiff_t>(at), n, v.empty() ? x : v.front());
          break;
        }
        default: {
          const std::vector<std::int64_t> w(pick(10), x);
          s = Small(w);
          v = w;
          break;
        }
      }
      same(s, v);
      Small w(v.begin(), v.end());
      CHECK(w == s);
      CHECK(!(w < s));
    }
  }
}

TEST_CASE("InlineVector: comparisons, erase and erase_if, at out of range") {
  Small a{1, 2, 3};
  Small b{1, 2, 4};
  CHECK(a < b);
  CHECK(a != b);
  CHECK(a == Small(std::vector<std::int64_t>{1, 2, 3}));
  Small c{5, -1, 6, -1, -1, 7, 8, 9};  // spills to the heap
  CHECK(erase(c, -1) == 3);
  CHECK(c == Small{5, 6, 7, 8, 9});
  CHECK(erase_if(c, [](std::int64_t d) { return d % 2 == 0; }) == 2);
  CHECK(c == Small{5, 7, 9});
  CHECK_THROWS_AS((void)c.at(3), std::out_of_range);
  const lazydag::Shape shape{2, 3, 4};
  CHECK(lazydag::numel(shape) == 24);
  CHECK(lazydag::contiguous_strides(shape) == lazydag::Strides{12, 4, 1});
}
