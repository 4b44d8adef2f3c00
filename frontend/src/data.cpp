// .npy files, row gathers, counter-based permutations and the minibatch
// iterator.
#include <lazydag/data.hpp>

#include "autograd_internal.hpp"
#include "internal.hpp"

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace lazydag {

namespace {

// splitmix64 of (seed, counter): the values depend on nothing else.
std::uint64_t mix(std::uint64_t seed, std::uint64_t i) {
  std::uint64_t z = seed * 0x9E3779B97F4A7C15ULL + i + 0x632BE59BD9B4E019ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Uniform in [0, range) (Lemire's multiply-high; the bias is below 2^-32
// for the ranges used here).
__extension__ using U128 = unsigned __int128;
std::uint64_t below(std::uint64_t r, std::uint64_t range) {
  return static_cast<std::uint64_t>((static_cast<U128>(r) * range) >> 64);
}

const char* npy_descr(DType t) {
  switch (t) {
    case DType::kFloat32: return "<f4";
    case DType::kFloat64: return "<f8";
    case DType::kInt32: return "<i4";
    case DType::kInt64: return "<i8";
    case DType::kBool: return "|b1";
  }
  return "";
}

std::vector<unsigned char> host_bytes(const NDArray& a) {
  std::vector<unsigned char> out(static_cast<std::size_t>(a.size()) * size_of(a.dtype()));
  dispatch(a.dtype(), [&]<class T>() {
    if constexpr (std::is_same_v<T, bool>) {
      const auto v = a.to_vector<bool>();
      for (std::size_t i = 0; i < v.size(); ++i) out[i] = v[i] ? 1 : 0;
    } else {
      const auto v = a.to_vector<T>();
      if (!v.empty()) std::memcpy(out.data(), v.data(), out.size());
    }
  });
  return out;
}

template <class T>
void scatter_add(const std::vector<void*>& p, std::int64_t n, std::int64_t row, std::int64_t rows, bool i64) {
  const T* g = static_cast<const T*>(p[0]);
  T* z = static_cast<T*>(p[2]);
  for (std::int64_t k = 0; k < n; ++k) {
    const std::int64_t i = i64 ? static_cast<const std::int64_t*>(p[1])[k] : static_cast<const std::int32_t*>(p[1])[k];
    if (i < 0 || i >= rows) continue;  // the forward take failed on it already
    for (std::int64_t j = 0; j < row; ++j) z[i * row + j] += g[k * row + j];
  }
}

}  // namespace

namespace detail {

NDArray scatter_add_rows(const NDArray& g0, const NDArray& indices, std::int64_t rows) {
  Shape s{rows};
  const Shape& gs = g0.shape();
  s.insert(s.end(), gs.begin() + indices.ndim(), gs.end());
  NDArray z = nd::zeros(s, g0.dtype(), g0.device());
  if (!detail::runs_host_kernels(g0.device())) {
    return scatter_add_rows(g0.copyto(cpu()), indices.copyto(cpu()), rows).copyto(g0.device());
  }
  const NDArray g = g0.is_contiguous() ? g0 : g0.copy();
  const NDArray idx = indices.is_contiguous() ? indices : indices.copy();
  const std::int64_t n = idx.size();
  const std::int64_t row = rows == 0 ? 0 : z.size() / rows;
  const bool f64 = g.dtype() == DType::kFloat64;
  const bool i64 = idx.dtype() == DType::kInt64;
  record_host_kernel("take (backward)", {g, idx}, {z}, [=](const std::vector<void*>& p) {
    f64 ? scatter_add<double>(p, n, row, rows, i64) : scatter_add<float>(p, n, row, rows, i64);
  });
  return z;
}

}  // namespace detail

namespace nd {

void save_npy(const std::string& path, const NDArray& a, std::source_location where) {
  (void)where;
  const auto bytes = host_bytes(a);  // blocks
  std::string shape = "(";
  for (std::size_t i = 0; i < a.shape().size(); ++i) {
    shape += std::to_string(a.shape()[i]) + (a.shape().size() == 1 ? "," : (i + 1 < a.shape().size() ? ", " : ""));
  }
  shape += ")";
  std::string header = std::string("{'descr': '") + npy_descr(a.dtype()) +
                       "', 'fortran_order': False, 'shape': " + shape + ", }";
  const std::size_t unpadded = 10 + header.size() + 1;  // magic, version, length, header, '\n'
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  if (!f) throw Error("save_npy: cannot open '" + path + "' for writing");
  const unsigned char magic[] = {0x93, 'N', 'U', 'M', 'P', 'Y', 1, 0};
  f.write(reinterpret_cast<const char*>(magic), sizeof magic);
  const auto len = static_cast<std::uint16_t>(header.size());
  const unsigned char le[] = {static_cast<unsigned char>(len & 0xff), static_cast<unsigned char>(len >> 8)};
  f.write(reinterpret_cast<const char*>(le), 2);
  f.write(header.data(), static_cast<std::streamsize>(header.size()));
  f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (!f) throw Error("save_npy: writing '" + path + "' failed");
}

NDArray load_npy(const std::string& path, Device dev) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw InvalidArgument("load_npy: cannot open '" + path + "'");
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  auto bad = [&](const std::string& why) { return InvalidArgument("load_npy: '" + path + "': " + why); };
  if (all.size() < 10 || all.compare(0, 6, "\x93NUMPY") != 0) throw bad("not an .npy file (no magic string)");
  const auto major = static_cast<unsigned char>(all[6]);
  std::size_t hlen = 0;
  std::size_t at = 0;
  if (major == 1) {
    hlen = static_cast<unsigned char>(all[8]) | (static_cast<std::size_t>(static_cast<unsigned char>(all[9])) << 8);
    at = 10;
  } else if (major == 2 || major == 3) {
    if (all.size() < 12) throw bad("truncated header");
    for (int i = 0; i < 4; ++i) hlen |= static_cast<std::size_t>(static_cast<unsigned char>(all[8 + i])) << (8 * i);
    at = 12;
  } else {
    throw bad("unsupported format version " + std::to_string(major));
  }
  if (all.size() < at + hlen) throw bad("truncated header");
  const std::string h = all.substr(at, hlen);
  auto value_of = [&](const std::string& key) {
    const auto k = h.find("'" + key + "'");
    if (k == std::string::npos) throw bad("the header has no '" + key + "'");
    auto v = h.find(':', k);
    if (v == std::string::npos) throw bad("malformed header");
    ++v;
    while (v < h.size() && h[v] == ' ') ++v;
    return v;
  };
  std::size_t d = value_of("descr");
  const char quote = h[d];
  const auto d_end = h.find(quote, d + 1);
  if (d_end == std::string::npos) throw bad("malformed descr");
  const std::string descr = h.substr(d + 1, d_end - d - 1);
  DType t;
  if (descr == "<f4") t = DType::kFloat32;
  else if (descr == "<f8") t = DType::kFloat64;
  else if (descr == "<i4") t = DType::kInt32;
  else if (descr == "<i8") t = DType::kInt64;
  else if (descr == "|b1") t = DType::kBool;
  else throw bad("dtype '" + descr + "' is not supported (float32, float64, int32, int64, bool; little-endian)");
  const bool fortran = h.compare(value_of("fortran_order"), 4, "True") == 0;
  std::size_t sh = value_of("shape");
  if (h[sh] != '(') throw bad("malformed shape");
  const auto sh_end = h.find(')', sh);
  if (sh_end == std::string::npos) throw bad("malformed shape");
  Shape shape;
  std::stringstream dims(h.substr(sh + 1, sh_end - sh - 1));
  std::string item;
  while (std::getline(dims, item, ',')) {
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (item.empty()) continue;
    try {
      std::size_t used = 0;
      shape.push_back(std::stoll(item, &used));
      if (used != item.size() || shape.back() < 0) throw std::invalid_argument(item);
    } catch (const std::exception&) {
      throw bad("malformed dimension '" + item + "'");
    }
  }
  check_shape(shape, "load_npy");
  const std::size_t count = static_cast<std::size_t>(numel(shape));
  const std::size_t want = count * size_of(t);
  if (all.size() - at - hlen < want) {
    throw bad("holds " + std::to_string(all.size() - at - hlen) + " data bytes, shape " + to_string(shape) +
              " needs " + std::to_string(want));
  }
  const char* data = all.data() + at + hlen;
  if (!fortran) return detail::make_array(data, count, t, shape, dev);
  Shape reversed(shape.rbegin(), shape.rend());
  std::vector<int> perm(shape.size());
  for (std::size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int>(perm.size() - 1 - i);
  return detail::make_array(data, count, t, reversed, dev).transpose(perm).copy();
}

NDArray take(const NDArray& a0, const NDArray& indices) {
  if (!a0.valid() || !indices.valid()) throw InvalidArgument("take: use of an empty NDArray");
  if (indices.dtype() != DType::kInt64 && indices.dtype() != DType::kInt32) {
    throw InvalidArgument("take: indices must be int32 or int64, got " + std::string(to_string(indices.dtype())));
  }
  if (a0.ndim() < 1) throw InvalidArgument("take: needs an array of at least one dimension");
  if (!(a0.device() == indices.device())) {
    throw DeviceMismatch("take: the array lives on " + a0.device().str() + ", the indices on " +
                         indices.device().str() + "; move one with copyto(device)");
  }
  if (!detail::runs_host_kernels(a0.device())) {
    return take(a0.copyto(cpu()), indices.copyto(cpu())).copyto(a0.device());
  }
  const NDArray a = a0.is_contiguous() ? a0 : a0.copy();
  const NDArray idx = indices.is_contiguous() ? indices : indices.copy();
  Shape s = idx.shape();
  s.insert(s.end(), a.shape().begin() + 1, a.shape().end());
  NDArray out = detail::empty(s, a.dtype(), a.device(), "take");
  const std::int64_t rows = a.shape()[0];
  const std::size_t row_bytes = rows == 0 ? 0 : static_cast<std::size_t>(a.size() / rows) * size_of(a.dtype());
  const std::int64_t n = idx.size();
  const bool i64 = idx.dtype() == DType::kInt64;
  detail::record_host_kernel("take", {a, idx}, {out}, [=](const std::vector<void*>& p) {
    const auto* src = static_cast<const unsigned char*>(p[0]);
    auto* dst = static_cast<unsigned char*>(p[2]);
    for (std::int64_t k = 0; k < n; ++k) {
      const std::int64_t i = i64 ? static_cast<const std::int64_t*>(p[1])[k] : static_cast<const std::int32_t*>(p[1])[k];
      if (i < 0 || i >= rows) {
        throw InvalidArgument("take: index " + std::to_string(i) + " is out of range [0, " + std::to_string(rows) + ")");
      }
      if (row_bytes != 0) std::memcpy(dst + k * row_bytes, src + static_cast<std::size_t>(i) * row_bytes, row_bytes);
    }
  });
  detail::grad::take(a, idx, out);
  return out;
}

NDArray permutation(std::int64_t n, std::uint64_t seed, Device dev) {
  if (n < 0) throw InvalidArgument("permutation: n must be >= 0, got " + std::to_string(n));
  check_shape(Shape{n}, "permutation");
  std::vector<std::int64_t> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i) v[static_cast<std::size_t>(i)] = i;
  for (std::int64_t i = n - 1; i > 0; --i) {  // Fisher-Yates
    const auto j = below(mix(seed, static_cast<std::uint64_t>(i)), static_cast<std::uint64_t>(i) + 1);
    std::swap(v[static_cast<std::size_t>(i)], v[j]);
  }
  return nd::array(v, {n}, dev);
}

NDArray randint(std::int64_t low, std::int64_t high, const Shape& shape, std::uint64_t seed, Device dev) {
  if (low >= high) {
    throw InvalidArgument("randint: low (" + std::to_string(low) + ") must be below high (" + std::to_string(high) + ")");
  }
  check_shape(shape, "randint");
  const auto range = static_cast<std::uint64_t>(high) - static_cast<std::uint64_t>(low);
  std::vector<std::int64_t> v(static_cast<std::size_t>(numel(shape)));
  for (std::size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<std::int64_t>(static_cast<std::uint64_t>(low) + below(mix(seed, i), range));
  }
  return nd::array(v, shape, dev);
}

}  // namespace nd

namespace data {

NDArray read_csv(const std::string& path, DType t, Device dev) {
  std::ifstream f(path);
  if (!f) throw InvalidArgument("read_csv: cannot open '" + path + "'");
  std::vector<double> values;
  std::int64_t cols = -1;
  std::int64_t rows = 0;
  std::string line;
  std::vector<double> row;
  for (std::int64_t number = 1; std::getline(f, line); ++number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    row.clear();
    bool numeric = true;
    std::size_t at = 0;
    while (at <= line.size()) {
      const std::size_t end = std::min(line.find(',', at), line.size());
      const std::string field = line.substr(at, end - at);
      char* stop = nullptr;
      const double v = std::strtod(field.c_str(), &stop);
      if (field.empty() || stop == field.c_str() || (*stop != '\0' && *stop != ' ')) {
        numeric = false;
        if (rows > 0 || number > 1) {
          throw InvalidArgument("read_csv: '" + path + "' line " + std::to_string(number) + ": '" + field +
                                "' is not a number");
        }
        break;
      }
      row.push_back(v);
      at = end + 1;
    }
    if (!numeric) continue;  // a header line
    if (cols < 0) cols = static_cast<std::int64_t>(row.size());
    if (static_cast<std::int64_t>(row.size()) != cols) {
      throw InvalidArgument("read_csv: '" + path + "' line " + std::to_string(number) + " has " +
                            std::to_string(row.size()) + " fields, the first row " + std::to_string(cols));
    }
    values.insert(values.end(), row.begin(), row.end());
    ++rows;
  }
  if (rows == 0) throw InvalidArgument("read_csv: '" + path + "' holds no rows");
  return nd::array(values, {rows, cols}, dev).astype(t);
}

MiniBatches::MiniBatches(std::vector<NDArray> arrays, std::int64_t batch_size, bool shuffle, std::uint64_t seed,
                         bool drop_last)
    : arrays_(std::move(arrays)), batch_size_(batch_size), shuffle_(shuffle), seed_(seed), drop_last_(drop_last) {
  if (arrays_.empty()) throw InvalidArgument("MiniBatches: no arrays");
  if (batch_size <= 0) throw InvalidArgument("MiniBatches: batch_size must be positive, got " + std::to_string(batch_size));
  for (const auto& a : arrays_) {
    if (!a.valid() || a.ndim() < 1) throw InvalidArgument("MiniBatches: every array needs a first dimension");
    if (a.shape()[0] != arrays_[0].shape()[0]) {
      throw InvalidArgument("MiniBatches: first dimensions differ: " + to_string(arrays_[0].shape()) + " and " +
                            to_string(a.shape()));
    }
    if (!(a.device() == arrays_[0].device())) {
      throw DeviceMismatch("MiniBatches: arrays on " + arrays_[0].device().str() + " and " + a.device().str());
    }
  }
  rows_ = arrays_[0].shape()[0];
  start_epoch(0);
}

std::int64_t MiniBatches::batches_per_epoch() const noexcept {
  return drop_last_ ? rows_ / batch_size_ : (rows_ + batch_size_ - 1) / batch_size_;
}

void MiniBatches::start_epoch(std::int64_t epoch) {
  const Device dev = arrays_[0].device();
  order_ = shuffle_ ? nd::permutation(rows_, seed_ + static_cast<std::uint64_t>(epoch), dev)
                    : nd::arange(0.0, static_cast<double>(rows_), 1.0, DType::kInt64, dev);
  next_batch_ = 0;
  ahead_.reset();
  if (batches_per_epoch() > 0) ahead_ = prepare(0);
}

std::vector<NDArray> MiniBatches::prepare(std::int64_t b) {
  const NDArray idx = order_.slice(0, b * batch_size_, std::min(rows_, (b + 1) * batch_size_));
  std::vector<NDArray> out;
  out.reserve(arrays_.size());
  for (const auto& a : arrays_) out.push_back(nd::take(a, idx));
  return out;
}

std::optional<std::vector<NDArray>> MiniBatches::next() {
  if (!ahead_) return std::nullopt;
  std::optional<std::vector<NDArray>> current = std::move(ahead_);
  ahead_.reset();
  ++next_batch_;
  if (next_batch_ < batches_per_epoch()) ahead_ = prepare(next_batch_);
  return current;
}

}  // namespace data
}  // namespace lazydag

namespace lazydag {

namespace {

template <class T>
void gather_last(const std::vector<void*>& p, std::int64_t rows, std::int64_t n, std::int64_t k) {
  const T* a = static_cast<const T*>(p[0]);
  const auto* idx = static_cast<const std::int64_t*>(p[1]);
  T* out = static_cast<T*>(p[2]);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int64_t i = idx[r * k + j];
      if (i < 0 || i >= n) {
        throw InvalidArgument("take_along_last: index " + std::to_string(i) + " is out of range [0, " +
                              std::to_string(n) + ")");
      }
      out[r * k + j] = a[r * n + i];
    }
  }
}

template <class T>
void scatter_last(const std::vector<void*>& p, std::int64_t rows, std::int64_t n, std::int64_t k) {
  const T* g = static_cast<const T*>(p[0]);
  const auto* idx = static_cast<const std::int64_t*>(p[1]);
  T* z = static_cast<T*>(p[2]);
  for (std::int64_t r = 0; r < rows; ++r) {
    for (std::int64_t j = 0; j < k; ++j) {
      const std::int64_t i = idx[r * k + j];
      if (i >= 0 && i < n) z[r * n + i] += g[r * k + j];
    }
  }
}

NDArray contiguous(const NDArray& a) { return a.is_contiguous() ? a : a.copy(); }

std::int64_t last(const Shape& s) { return s.empty() ? 1 : s.back(); }

void check_leading(const NDArray& a, const NDArray& idx, const char* op) {
  if (idx.dtype() != DType::kInt64) {
    throw InvalidArgument(std::string(op) + ": indices must be int64, got " + std::string(to_string(idx.dtype())));
  }
  if (a.ndim() < 1 || idx.ndim() != a.ndim() ||
      !std::equal(a.shape().begin(), a.shape().end() - 1, idx.shape().begin())) {
    throw InvalidArgument(std::string(op) + ": indices of shape " + to_string(idx.shape()) +
                          " do not match the leading shape of " + to_string(a.shape()));
  }
  if (!(a.device() == idx.device())) {
    throw DeviceMismatch(std::string(op) + ": the array lives on " + a.device().str() + ", the indices on " +
                         idx.device().str());
  }
}

}  // namespace

namespace detail {
NDArray scatter_add_last(const NDArray& g0, const NDArray& indices, const Shape& shape) {
  NDArray z = nd::zeros(shape, g0.dtype(), g0.device());
  if (!detail::runs_host_kernels(g0.device())) {
    return scatter_add_last(g0.copyto(cpu()), indices.copyto(cpu()), shape).copyto(g0.device());
  }
  const NDArray g = contiguous(g0);
  const NDArray idx = contiguous(indices);
  const std::int64_t n = last(shape), k = last(g.shape());
  const std::int64_t rows = k == 0 ? 0 : g.size() / k;
  const bool f64 = g.dtype() == DType::kFloat64;
  record_host_kernel("take_along_last (backward)", {g, idx}, {z}, [=](const std::vector<void*>& p) {
    f64 ? scatter_last<double>(p, rows, n, k) : scatter_last<float>(p, rows, n, k);
  });
  return z;
}
}  // namespace detail

namespace nd {

NDArray argsort(const NDArray& a0, bool descending) {
  if (!a0.valid()) throw InvalidArgument("argsort: use of an empty NDArray");
  if (a0.ndim() < 1) throw InvalidArgument("argsort: needs an array of at least one dimension");
  if (a0.dtype() == DType::kBool) throw InvalidArgument("argsort: not defined for bool arrays (use astype)");
  if (!detail::runs_host_kernels(a0.device())) return argsort(a0.copyto(cpu()), descending).copyto(a0.device());
  const NDArray a = contiguous(a0.detach());
  NDArray out = detail::empty(a.shape(), DType::kInt64, a.device(), "argsort");
  const std::int64_t n = last(a.shape());
  const std::int64_t rows = n == 0 ? 0 : a.size() / n;
  const DType t = a.dtype();
  detail::record_host_kernel("argsort", {a}, {out}, [=](const std::vector<void*>& p) {
    dispatch(t, [&]<class T>() {
      if constexpr (!std::is_same_v<T, bool>) {
        const T* x = static_cast<const T*>(p[0]);
        auto* idx = static_cast<std::int64_t*>(p[1]);
        for (std::int64_t r = 0; r < rows; ++r) {
          std::int64_t* row = idx + r * n;
          const T* v = x + r * n;
          for (std::int64_t i = 0; i < n; ++i) row[i] = i;
          auto before = [&](std::int64_t i, std::int64_t j) {
            if constexpr (std::is_floating_point_v<T>) {
              if (std::isnan(v[i]) || std::isnan(v[j])) return descending ? std::isnan(v[i]) && !std::isnan(v[j])
                                                                           : !std::isnan(v[i]) && std::isnan(v[j]);
            }
            return descending ? v[i] > v[j] : v[i] < v[j];
          };
          std::stable_sort(row, row + n, before);
        }
      }
    });
  });
  return out;
}

NDArray take_along_last(const NDArray& a0, const NDArray& indices) {
  if (!a0.valid() || !indices.valid()) throw InvalidArgument("take_along_last: use of an empty NDArray");
  check_leading(a0, indices, "take_along_last");
  if (a0.dtype() == DType::kBool) throw InvalidArgument("take_along_last: not defined for bool arrays (use astype)");
  if (!detail::runs_host_kernels(a0.device())) {
    return take_along_last(a0.copyto(cpu()), indices.copyto(cpu())).copyto(a0.device());
  }
  const NDArray a = contiguous(a0);
  const NDArray idx = contiguous(indices);
  NDArray out = detail::empty(idx.shape(), a.dtype(), a.device(), "take_along_last");
  const std::int64_t n = last(a.shape()), k = last(idx.shape());
  const std::int64_t rows = k == 0 ? 0 : idx.size() / k;
  const DType t = a.dtype();
  detail::record_host_kernel("take_along_last", {a, idx}, {out}, [=](const std::vector<void*>& p) {
    dispatch(t, [&]<class T>() {
      if constexpr (!std::is_same_v<T, bool>) gather_last<T>(p, rows, n, k);
    });
  });
  detail::grad::take_along_last(a, idx, out);
  return out;
}

NDArray sort(const NDArray& a, bool descending) { return take_along_last(a, argsort(a, descending)); }

namespace {
// `axis` of an array of rank `rank`, checked; and the permutation that moves
// it last (the other axes keep their order) with its inverse.
int checked_axis(const NDArray& a, int axis, const char* op) {
  if (!a.valid()) throw InvalidArgument(std::string(op) + ": use of an empty NDArray");
  return ops::normalize_axis(axis, a.ndim(), op);
}
std::vector<int> axis_to_last(int rank, int axis) {
  std::vector<int> p;
  for (int d = 0; d < rank; ++d) {
    if (d != axis) p.push_back(d);
  }
  p.push_back(axis);
  return p;
}
std::vector<int> inverse(const std::vector<int>& p) {
  std::vector<int> q(p.size());
  for (std::size_t i = 0; i < p.size(); ++i) q[static_cast<std::size_t>(p[i])] = static_cast<int>(i);
  return q;
}
}  // namespace

NDArray take(const NDArray& a, const NDArray& indices, int axis) {
  axis = checked_axis(a, axis, "take");
  if (!indices.valid()) throw InvalidArgument("take: use of an empty NDArray");
  if (axis == 0) return take(a, indices);
  // The axis first, rows taken, then the index dims moved to where it was.
  std::vector<int> front{axis};
  for (int d = 0; d < a.ndim(); ++d) {
    if (d != axis) front.push_back(d);
  }
  const NDArray r = take(a.transpose(front), indices);
  const int ni = indices.ndim();
  std::vector<int> back;
  for (int d = 0; d < axis; ++d) back.push_back(ni + d);
  for (int d = 0; d < ni; ++d) back.push_back(d);
  for (int d = ni + axis; d < r.ndim(); ++d) back.push_back(d);
  return r.transpose(back);
}

NDArray argsort(const NDArray& a, int axis, bool descending) {
  axis = checked_axis(a, axis, "argsort");
  if (axis == a.ndim() - 1) return argsort(a, descending);
  const std::vector<int> p = axis_to_last(a.ndim(), axis);
  return argsort(a.transpose(p), descending).transpose(inverse(p));
}

NDArray take_along_axis(const NDArray& a, const NDArray& indices, int axis) {
  axis = checked_axis(a, axis, "take_along_axis");
  if (!indices.valid()) throw InvalidArgument("take_along_axis: use of an empty NDArray");
  if (indices.ndim() != a.ndim()) {
    throw InvalidArgument("take_along_axis: indices of shape " + to_string(indices.shape()) +
                          " for an array of shape " + to_string(a.shape()) + " (ranks differ)");
  }
  if (axis == a.ndim() - 1) return take_along_last(a, indices);
  const std::vector<int> p = axis_to_last(a.ndim(), axis);
  return take_along_last(a.transpose(p), indices.transpose(p)).transpose(inverse(p));
}

NDArray sort(const NDArray& a, int axis, bool descending) {
  return take_along_axis(a, argsort(a, axis, descending), axis);
}

TopK topk(const NDArray& a, std::int64_t k, int axis, bool largest) {
  axis = checked_axis(a, axis, "topk");
  if (axis == a.ndim() - 1) return topk(a, k, largest);
  const std::vector<int> p = axis_to_last(a.ndim(), axis);
  TopK t = topk(a.transpose(p), k, largest);
  const std::vector<int> q = inverse(p);
  return TopK{t.values.transpose(q), t.indices.transpose(q)};
}

TopK topk(const NDArray& a, std::int64_t k, bool largest) {
  if (!a.valid() || a.ndim() < 1) throw InvalidArgument("topk: needs an array of at least one dimension");
  if (k < 0 || k > last(a.shape())) {
    throw InvalidArgument("topk: k = " + std::to_string(k) + " is outside 0.." + std::to_string(last(a.shape())));
  }
  const NDArray idx = argsort(a, largest).slice(-1, 0, k);
  return TopK{take_along_last(a, idx), idx.copy()};
}

}  // namespace nd
}  // namespace lazydag
