// A cheap clock for timing blocking calls: the time-stamp counter where the
// CPU says it runs at a constant rate (x86-64, CPUID 0x80000007 EDX bit 8,
// "invariant TSC"), else steady_clock's nanoseconds. Every wait is timed
// twice (blocked time, sync debug); through the virtual machine's
// kvm-clock, steady_clock::now() took 30 ns here against 12 ns for the
// counter. Ticks convert to nanoseconds at the rate measured between the
// first reading and the conversion (the first conversion at least 100 ms in
// fixes it).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
#endif

namespace lazydag::engine::detail {

class TickClock {
 public:
  static std::uint64_t now() noexcept {
#if defined(__x86_64__)
    if (invariant_tsc()) return __rdtsc();
#endif
    return steady_ns();
  }

  /// Ticks elapsed from `t0` to now; 0 if the reading went back (a thread
  /// moved between cores whose counters differ slightly).
  static std::uint64_t since(std::uint64_t t0) noexcept {
    const std::uint64_t t = now();
    return t > t0 ? t - t0 : 0;
  }

  /// Nanoseconds in `ticks`.
  static std::uint64_t to_ns(std::uint64_t ticks) noexcept {
    if (!invariant_tsc()) return ticks;
    return static_cast<std::uint64_t>(static_cast<double>(ticks) * ns_per_tick());
  }

  /// steady_clock's reading in nanoseconds (also the profiler's clock).
  static std::uint64_t steady_ns() noexcept {
    return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                          std::chrono::steady_clock::now().time_since_epoch())
                                          .count());
  }

 private:
#if defined(__x86_64__)
  static bool invariant_tsc() noexcept {
    static const bool yes = [] {
      unsigned a = 0, b = 0, c = 0, d = 0;
      if (__get_cpuid_max(0x80000000U, nullptr) < 0x80000007U) return false;
      __cpuid(0x80000007U, a, b, c, d);
      if ((d & (1U << 8)) == 0) return false;
      (void)start();
      return true;
    }();
    return yes;
  }

  struct Start {
    std::uint64_t tsc;
    std::uint64_t ns;
  };
  static const Start& start() noexcept {
    static const Start s{__rdtsc(), steady_ns()};
    return s;
  }

  static double ns_per_tick() noexcept {
    static std::atomic<double> fixed{0.0};
    if (const double r = fixed.load(std::memory_order_relaxed); r != 0.0) return r;
    const Start& s = start();
    std::uint64_t t = 0;
    std::uint64_t n = 0;
    do {  // at least 10 us between the readings, for a usable rate
      t = __rdtsc();
      n = steady_ns();
    } while (n < s.ns + 10'000 || t <= s.tsc);
    const double r = static_cast<double>(n - s.ns) / static_cast<double>(t - s.tsc);
    if (n - s.ns >= 100'000'000) fixed.store(r, std::memory_order_relaxed);
    return r;
  }
#else
  static constexpr bool invariant_tsc() noexcept { return false; }
  static double ns_per_tick() noexcept { return 1.0; }
#endif
};

}  // namespace lazydag::engine::detail
