// Element types of arrays, their sizes and names, and dispatch from a
// runtime DType to a C++ type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>
#include <type_traits>

#include <lazydag/engine/error.hpp>

namespace lazydag {

/// Element type of an array. No implicit promotion: astype converts.
enum class DType : std::uint8_t { kFloat32, kFloat64, kInt32, kInt64, kBool };

/// "float32", "float64", "int32", "int64", "bool".
[[nodiscard]] std::string_view to_string(DType t) noexcept;
[[nodiscard]] std::size_t size_of(DType t) noexcept;
[[nodiscard]] inline bool is_floating(DType t) noexcept {
  return t == DType::kFloat32 || t == DType::kFloat64;
}
[[nodiscard]] inline bool is_integral(DType t) noexcept {
  return t == DType::kInt32 || t == DType::kInt64;
}

/// The DType of a C++ element type (float, double, int32_t, int64_t, bool).
template <class T>
constexpr DType dtype_of() {
  if constexpr (std::is_same_v<T, float>) return DType::kFloat32;
  else if constexpr (std::is_same_v<T, double>) return DType::kFloat64;
  else if constexpr (std::is_same_v<T, std::int32_t>) return DType::kInt32;
  else if constexpr (std::is_same_v<T, std::int64_t>) return DType::kInt64;
  else if constexpr (std::is_same_v<T, bool>) return DType::kBool;
  else static_assert(!sizeof(T), "lazydag arrays hold float, double, int32_t, int64_t or bool");
}

/// Calls f.template operator()<T>() with the C++ type of t.
template <class F>
decltype(auto) dispatch(DType t, F&& f) {
  switch (t) {
    case DType::kFloat32: return f.template operator()<float>();
    case DType::kFloat64: return f.template operator()<double>();
    case DType::kInt32: return f.template operator()<std::int32_t>();
    case DType::kInt64: return f.template operator()<std::int64_t>();
    case DType::kBool: return f.template operator()<bool>();
  }
  throw InvalidArgument("unknown dtype");
}

}  // namespace lazydag
