// Fuzz target for the NDArray frontend: the input bytes decode into a
// sequence of calls (random shapes, dtypes, devices, ops, waits, drops),
// valid and invalid alike. Every call must either succeed or throw one of
// the documented error types; results must have the shapes and dtypes the
// rules give; no crash, leak, hang or sanitizer report. At the end the
// values of the live arrays are hashed into a digest, which must not depend
// on the engine's policy (replay_compare.sh checks it across policies).
//
// Beyond ordinary programs it reaches the edges: shapes whose counts
// overflow (creation, reshape with -1, broadcast, concat sums, arange),
// handles of another engine, deletes through the engine API, engines made
// from random option structs whose nodes record more nodes while the
// engine is destroyed, and waits after a watchdog timeout. An independent
// rule (128-bit products against the documented kMaxElements) says which
// calls must be refused; every refusal must record nothing.
//
// Built two ways: with clang's libFuzzer (./dev fuzz), and with a small
// main that replays a corpus (the meson test, so CI runs the seed corpus).
#include <lazydag/lazydag.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <limits>
#include <optional>
#include <thread>
#include <vector>

using namespace lazydag;

namespace {

class Bytes {
 public:
  Bytes(const std::uint8_t* d, std::size_t n) : d_(d), n_(n) {}
  bool empty() const { return i_ >= n_; }
  std::uint8_t next() { return i_ < n_ ? d_[i_++] : 0; }
  int pick(int n) { return n <= 0 ? 0 : next() % n; }

 private:
  const std::uint8_t* d_;
  std::size_t n_;
  std::size_t i_ = 0;
};

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_frontend: invariant broken: %s\n", what);
  std::abort();
}

// Independent broadcasting rule, to check the library's result shapes.
std::optional<Shape> broadcast(const Shape& a, const Shape& b) {
  const std::size_t r = std::max(a.size(), b.size());
  Shape out(r);
  for (std::size_t i = 0; i < r; ++i) {
    const std::int64_t da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    const std::int64_t db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    if (da != db && da != 1 && db != 1) return std::nullopt;
    out[i] = da == 1 ? db : da;
  }
  return out;
}

// ---- the edges -------------------------------------------------------------

__extension__ typedef __int128 Wide;  // products of two int64 dims never overflow it
constexpr Wide kLimit = kMaxElements;

// Dims that make products overflow, next to ordinary ones.
constexpr std::int64_t kEdgeDims[] = {0,
                                      1,
                                      2,
                                      3,
                                      std::int64_t{1} << 31,
                                      std::int64_t{1} << 32,
                                      3037000500,
                                      std::int64_t{1} << 40,
                                      (std::int64_t{1} << 59) + 1,
                                      (std::int64_t{1} << 62) + 1,
                                      std::numeric_limits<std::int64_t>::max(),
                                      -1};

// The product of the dims with zeros counted as one, saturated above kLimit.
Wide extent(const Shape& s) {
  Wide e = 1;
  for (auto d : s) {
    e *= std::max<std::int64_t>(d, 1);
    if (e > kLimit) return kLimit + 1;
  }
  return e;
}
bool has_negative(const Shape& s) {
  return std::any_of(s.begin(), s.end(), [](std::int64_t d) { return d < 0; });
}
bool has_zero(const Shape& s) {
  return std::any_of(s.begin(), s.end(), [](std::int64_t d) { return d == 0; });
}
// A shape the fuzzer may allocate: empty, or at most 64 Ki elements.
bool affordable(const Shape& s) { return has_zero(s) || extent(s) <= (1 << 16); }

std::uint64_t recorded() { return nd::engine().stats().nodes_recorded; }

// `call` must throw InvalidArgument and record nothing.
template <class Call>
void must_refuse(Call call, const char* what) {
  nd::flush_fused();  // ops gathered for fusion earlier are not this call's
  const std::uint64_t before = recorded();
  try {
    call();
  } catch (const InvalidArgument&) {
    if (recorded() != before) fail("a refused call recorded a node");
    return;
  }
  std::fprintf(stderr, "fuzz_frontend: accepted: %s\n", what);
  fail("a call the rules refuse was accepted");
}

// An independent check of EngineOptions: which structs the engine accepts.
bool options_valid(const engine::EngineOptions& o) {
  const auto p = static_cast<int>(o.policy);
  return p >= 0 && p <= 2 && o.num_threads >= 0 && o.num_threads <= 1024 &&
         o.max_pending <= 0xFFFFFFFFULL && o.max_in_flight >= 1 && o.max_in_flight <= 0xFFFFFFFFULL &&
         o.watchdog_seconds >= 0;
}

// An engine from random options: refused exactly when the rule says so;
// otherwise nodes that each record another on a var of their own, the
// first var deleted while its node is pending, then the engine destroyed:
// every recorded node runs.
void engine_from_options(Bytes& in) {
  engine::EngineOptions o;
  constexpr int kThreads[] = {-1, 0, 1, 2, 3, 1025, 100000};
  constexpr std::size_t kCounts[] = {0, 1, 2, 16, 16384, std::size_t{1} << 33};
  constexpr double kSeconds[] = {0, -1, 1e10, HUGE_VAL, 5, NAN};
  o.policy = static_cast<engine::Policy>(in.pick(4));
  o.num_threads = kThreads[in.pick(7)];
  o.max_pending = kCounts[in.pick(6)];
  o.max_in_flight = kCounts[in.pick(6)];
  o.watchdog_seconds = kSeconds[in.pick(6)];
  const int nodes = 1 + in.pick(20);
  std::atomic<int> ran{0};
  try {
    engine::Engine eng(o);
    if (!options_valid(o)) fail("invalid engine options accepted");
    for (int i = 0; i < nodes; ++i) {
      const engine::Var v = eng.new_var();
      eng.push(
          [&eng, &ran](const engine::RunContext&) {
            ++ran;
            const engine::Var w = eng.new_var();
            eng.push([&ran](const engine::RunContext&) { ++ran; }, {}, {w});
            eng.delete_var(w);
          },
          {}, {v});
      eng.delete_var(v);
    }
  } catch (const InvalidArgument&) {
    if (options_valid(o)) fail("valid engine options refused");
    return;
  }
  if (ran.load() != 2 * nodes) fail("an engine was destroyed with recorded work not run");
}

// A wait that times out on a stuck op, then more work: every later wait returns.
void wait_after_watchdog(Bytes& in) {
  engine::EngineOptions o;
  o.policy = engine::Policy::kEager;
  o.num_threads = 1 + in.pick(2);
  o.watchdog_seconds = 0.01;
  engine::Engine eng(o);
  std::atomic<bool> release{false};
  std::atomic<int> ran{0};
  const engine::Var a = eng.new_var();
  const engine::Var b = eng.new_var();
  eng.push(
      [&](const engine::RunContext&) {
        // Bounded: should this very thread run it, the wait simply takes longer.
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(100);
        while (!release.load() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
        ++ran;
      },
      {}, {a});
  eng.push([&](const engine::RunContext&) { ++ran; }, {a}, {b});
  std::streambuf* old = std::cerr.rdbuf(nullptr);  // the watchdog's report
  try {
    if (in.pick(2) == 0) {
      eng.wait_to_read(b);
    } else {
      eng.waitall();
    }
  } catch (const WatchdogTimeout&) {
  }
  release = true;
  const int more = 1 + in.pick(30);
  for (int i = 0; i < more; ++i) {
    eng.push([&](const engine::RunContext&) { ++ran; }, {b}, {a});
    eng.push([&](const engine::RunContext&) { ++ran; }, {a}, {b});
  }
  bool done = false;
  for (int attempt = 0; attempt < 1000 && !done; ++attempt) {
    try {
      eng.waitall();
      done = true;
    } catch (const WatchdogTimeout&) {
    }
  }
  std::cerr.rdbuf(old);
  if (!done || ran.load() != 2 + 2 * more) fail("a wait after a watchdog timeout did not complete");
}

constexpr int kSlots = 6;
const DType kTypes[] = {DType::kFloat32, DType::kFloat64, DType::kInt32, DType::kInt64, DType::kBool};

struct Digest {
  std::uint64_t h = 1469598103934665603ULL;
  void add(std::uint64_t x) {
    h ^= x;
    h *= 1099511628211ULL;
  }
};

std::uint64_t value_bits(double v) {
  if (std::isnan(v)) return 0x7ff8000000000001ULL;
  std::uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// Runs one decoded program; returns its digest.
std::uint64_t run(const std::uint8_t* data, std::size_t size) {
  Bytes in(data, size);
  std::vector<NDArray> slot(kSlots);
  Digest digest;
  auto any = [&] { return slot[static_cast<std::size_t>(in.pick(kSlots))]; };
  auto put = [&](NDArray a) { slot[static_cast<std::size_t>(in.pick(kSlots))] = std::move(a); };
  int steps = 0;
  while (!in.empty() && ++steps < 64) {
    const int op = in.pick(14);
    try {
      switch (op) {
        case 0: {  // create
          Shape s(static_cast<std::size_t>(in.pick(4)));
          for (auto& d : s) d = in.pick(5);
          const DType t = kTypes[in.pick(5)];
          const Device dev = cpu(in.pick(2));
          switch (in.pick(3)) {
            case 0: put(nd::random_uniform(s, dev, in.next(), -4, 4, t)); break;
            case 1: put(nd::full(s, in.pick(7) - 3, t, dev)); break;
            default: put(nd::arange(0, static_cast<double>(numel(s)), 1, t, dev).reshape(s)); break;
          }
          break;
        }
        case 1: {  // binary
          NDArray a = any();
          NDArray b = any();
          const int k = in.pick(6);
          NDArray c = k == 0 ? a + b : k == 1 ? a - b : k == 2 ? a * b : k == 3 ? a / b
                    : k == 4 ? nd::maximum(a, b) : nd::minimum(a, b);
          const auto want = broadcast(a.shape(), b.shape());
          if (!want || c.shape() != *want || c.dtype() != a.dtype()) fail("binary result shape/dtype");
          put(c);
          break;
        }
        case 2: {  // unary and scalar
          NDArray a = any();
          const int k = in.pick(6);
          NDArray c = k == 0 ? nd::exp(a) : k == 1 ? nd::relu(a) : k == 2 ? -a : k == 3 ? nd::sqrt(a)
                    : k == 4 ? a * 2.5 : 1.0 - a;
          if (c.shape() != a.shape()) fail("unary result shape");
          put(c);
          break;
        }
        case 3: {  // comparison and where
          NDArray a = any();
          NDArray b = any();
          NDArray m = a < b;
          if (m.dtype() != DType::kBool) fail("comparison dtype");
          put(nd::where(m, a, b));
          break;
        }
        case 4: {  // reductions
          NDArray a = any();
          const int axis = in.pick(5) - 2;
          const bool keep = in.pick(2) == 1;
          const int k = in.pick(5);
          NDArray r = in.pick(2) == 0 ? (k == 0 ? a.sum() : k == 1 ? a.mean() : k == 2 ? a.max()
                                        : k == 3 ? a.min() : a.argmax())
                                      : (k == 0 ? a.sum(axis, keep) : k == 1 ? a.mean(axis, keep)
                                        : k == 2 ? a.max(axis, keep) : k == 3 ? a.min(axis, keep)
                                                 : a.argmax(axis, keep));
          put(r);
          break;
        }
        case 5: {  // shape ops
          NDArray a = any();
          const int k = in.pick(4);
          if (k == 0) {
            Shape s(static_cast<std::size_t>(in.pick(3) + 1));
            for (auto& d : s) d = in.pick(6) - 1;
            NDArray r = a.reshape(s);
            if (r.size() != a.size()) fail("reshape size");
            put(r);
          } else if (k == 1) {
            std::vector<int> perm(static_cast<std::size_t>(a.ndim()));
            for (int i = 0; i < a.ndim(); ++i) perm[static_cast<std::size_t>(i)] = i;
            std::rotate(perm.begin(), perm.begin() + (perm.empty() ? 0 : in.pick(a.ndim())), perm.end());
            put(a.transpose(perm));
          } else if (k == 2) {
            put(a.slice(in.pick(4) - 1, in.pick(4) - 1, in.pick(5)));
          } else {
            put(nd::concat({a, any()}, in.pick(3)));
          }
          break;
        }
        case 6: put(nd::matmul(any(), any())); break;
        case 7: {  // in place, also through views
          NDArray a = any();
          NDArray b = any();
          if (in.pick(2) == 0) {
            a += b;
          } else {
            a.slice(0, 0, 1) *= 3.0;
          }
          break;
        }
        case 8: {  // conversions and devices
          NDArray a = any();
          const int k = in.pick(3);
          if (k == 0) put(a.astype(kTypes[in.pick(5)]));
          if (k == 1) put(a.copyto(cpu(in.pick(2))));
          if (k == 2) {
            NDArray same = a.as_in_device(a.device());
            if (!same.shares_storage_with(a)) fail("as_in_device copied");
          }
          break;
        }
        case 9: {  // blockers
          NDArray a = any();
          const int k = in.pick(3);
          if (k == 0) a.wait_to_read();
          if (k == 1) (void)a.item<float>();
          if (k == 2) a.wait_to_write();
          break;
        }
        case 10: slot[static_cast<std::size_t>(in.pick(kSlots))] = NDArray(); break;
        case 12: {  // shapes at the edge of what counts can hold
          auto edge_shape = [&] {
            Shape s(static_cast<std::size_t>(in.pick(4)));
            for (auto& d : s) d = kEdgeDims[in.pick(12)];
            return s;
          };
          const int k = in.pick(5);
          if (k == 0) {  // creation
            const Shape s = edge_shape();
            if (has_negative(s) || extent(s) > kLimit) {
              must_refuse([&] { (void)nd::zeros(s, DType::kFloat32); }, "zeros of an overflowing shape");
            } else if (affordable(s)) {
              NDArray z = nd::zeros(s, kTypes[in.pick(5)]);
              Wide n = 1;
              for (auto d : s) n *= d;
              if (z.size() != n || z.shape() != s) fail("created shape");
              put(z);
            }
          } else if (k == 1) {  // reshape, one dim possibly inferred
            NDArray a = any();
            Shape s = edge_shape();
            if (!s.empty() && in.pick(2) == 0) s[static_cast<std::size_t>(in.pick(static_cast<int>(s.size())))] = -1;
            Shape known = s;
            known.erase(std::remove(known.begin(), known.end(), -1), known.end());
            if (a.valid() && (extent(known) > kLimit ||
                              std::any_of(s.begin(), s.end(), [](std::int64_t d) { return d < -1; }))) {
              must_refuse([&] { (void)a.reshape(s); }, "reshape to an overflowing shape");
            } else if (a.valid()) {
              NDArray r = a.reshape(s);  // may refuse: sizes differ
              Wide n = 1;
              for (auto d : r.shape()) n *= d;
              if (n != a.size()) fail("reshape changed the element count");
              put(r);
            }
          } else if (k == 2) {  // broadcast of two empty arrays
            const std::int64_t d1 = kEdgeDims[in.pick(11)];
            const std::int64_t d2 = kEdgeDims[in.pick(11)];
            NDArray x = nd::zeros({0, d1, 1});
            NDArray y = nd::zeros({0, 1, d2});
            if (extent({d1, d2}) > kLimit) {
              must_refuse([&] { (void)(x + y); }, "a broadcast whose product overflows");
            } else {
              NDArray z = x * y;
              if (z.shape() != Shape{0, d1, d2}) fail("broadcast shape");
            }
          } else if (k == 3) {  // concat of empty arrays: the sum along the axis
            std::vector<NDArray> parts;
            Wide sum = 0;
            for (int i = 0, n = 1 + in.pick(3); i < n; ++i) {
              const std::int64_t d = kEdgeDims[in.pick(11)];
              parts.push_back(nd::zeros({0, d}));
              sum += d;
            }
            if (sum > kLimit) {
              must_refuse([&] { (void)nd::concat(parts, 1); }, "a concat whose sum overflows");
            } else if (nd::concat(parts, 1).shape() != Shape{0, static_cast<std::int64_t>(sum)}) {
              fail("concat shape");
            }
          } else {  // arange counts
            constexpr double kStops[] = {10, 1e6, 1e18, 1e30, 1.7e308};
            const double stop = kStops[in.pick(5)];
            const double step = in.pick(2) == 0 ? 1.0 : 1e-300;
            const double count = std::ceil(stop / step);
            if (!(count <= static_cast<double>(kLimit))) {
              must_refuse([&] { (void)nd::arange(0, stop, step); }, "arange with too many elements");
            } else if (count <= (1 << 16)) {
              put(nd::arange(0, stop, step));
            }
          }
          break;
        }
        case 13: {  // handles and engines
          const int k = in.pick(8);
          if (k == 0 || k == 1) {  // a var of another engine
            static engine::Engine other(engine::EngineOptions{});
            const engine::Var v = other.new_var();
            NDArray a = any();
            if (a.valid()) {
              const engine::Var mine = a.var();
              must_refuse([&] { nd::engine().push([](const engine::RunContext&) {}, {v}, {mine}); },
                          "a var of another engine");
            }
            must_refuse([&] { nd::engine().wait_to_read(v); }, "waiting on a var of another engine");
            other.delete_var(v);
          } else if (k == 2 || k == 3) {  // deleting an array's var behind its back
            NDArray a = any();
            if (a.valid()) {
              must_refuse([&] { nd::engine().delete_var(a.var()); }, "deleting an array's var");
            }
          } else if (k < 7) {
            engine_from_options(in);
          } else {
            wait_after_watchdog(in);
          }
          break;
        }
        default: nd::waitall(); break;
      }
      digest.add(static_cast<std::uint64_t>(op) * 2 + 1);
    } catch (const InvalidArgument&) {
      digest.add(1000 + static_cast<std::uint64_t>(op));
    } catch (const DeviceMismatch&) {
      digest.add(2000 + static_cast<std::uint64_t>(op));
    } catch (const OpError&) {
      digest.add(3000 + static_cast<std::uint64_t>(op));
    }
  }
  try {
    nd::waitall();
  } catch (const OpError&) {
    digest.add(4000);
  }
  // The values of what is left: a policy-independent digest.
  for (const NDArray& a : slot) {
    if (!a.valid()) {
      digest.add(5);
      continue;
    }
    for (auto d : a.shape()) digest.add(static_cast<std::uint64_t>(d));
    try {
      const NDArray f = a.astype(DType::kFloat64);
      for (double v : f.to_vector<double>()) digest.add(value_bits(v));
    } catch (const OpError&) {
      digest.add(6);  // poisoned (an integer division by zero upstream)
    }
  }
  return digest.h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  (void)run(data, size);
  return 0;
}

#ifdef LAZYDAG_FUZZ_REPLAY
// Replays files given on the command line and prints "<digest> <file>".
#include <fstream>
#include <iterator>

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::ifstream f(argv[i], std::ios::binary);
    std::vector<std::uint8_t> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    std::printf("%016llx %s\n", static_cast<unsigned long long>(run(bytes.data(), bytes.size())), argv[i]);
  }
  return 0;
}
#endif
