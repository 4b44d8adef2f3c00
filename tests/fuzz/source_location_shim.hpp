// For the clang-14 fuzz build only (forced in with -include): clang 14
// lacks __builtin_source_location, so libstdc++ 12's <source_location> is
// empty under it. This supplies an equivalent built on __builtin_FILE /
// __builtin_LINE / __builtin_FUNCTION, which clang and gcc both evaluate at
// the call site. Never used by the normal (gcc) build.
#pragma once

#include <version>

#if !defined(__cpp_lib_source_location)
namespace std {
struct source_location {
  static constexpr source_location current(const char* file = __builtin_FILE(),
                                           const char* function = __builtin_FUNCTION(),
                                           unsigned line = __builtin_LINE()) noexcept {
    source_location s;
    s.file_ = file;
    s.function_ = function;
    s.line_ = line;
    return s;
  }
  constexpr const char* file_name() const noexcept { return file_; }
  constexpr const char* function_name() const noexcept { return function_; }
  constexpr unsigned line() const noexcept { return line_; }
  constexpr unsigned column() const noexcept { return 0; }

 private:
  const char* file_ = "";
  const char* function_ = "";
  unsigned line_ = 0;
};
}  // namespace std
#endif
