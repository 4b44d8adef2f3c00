// Fuzz target for the NDArray frontend: the input bytes decode into a
// sequence of calls (random shapes, dtypes, devices, ops, waits, drops),
// valid and invalid alike. Every call must either succeed or throw one of
// the documented error types; results must have the shapes and dtypes the
// rules give; no crash, leak, hang or sanitizer report. At the end the
// values of the live arrays are hashed into a digest, which must not depend
// on the engine's policy (replay_compare.sh checks it across policies).
//
// Built two ways: with clang's libFuzzer (./dev fuzz), and with a small
// main that replays a corpus (the meson test, so CI runs the seed corpus).
#include <lazydag/lazydag.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <optional>
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
    const int op = in.pick(12);
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
