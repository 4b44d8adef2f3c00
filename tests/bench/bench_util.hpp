// Shared by the benchmark programs: repeats, medians and wall-clock time.
// Every figure is the median of LAZYDAG_BENCH_REPEATS runs (default per
// program) after one warm-up run.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <utility>
#include <vector>

namespace lazydag::bench {

using Clock = std::chrono::steady_clock;

inline int repeats(int fallback) {
  const char* s = std::getenv("LAZYDAG_BENCH_REPEATS");
  return s != nullptr ? std::max(1, std::atoi(s)) : fallback;
}

inline double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

/// Median over the repeats of fn(), which times itself and returns seconds
/// (so setup inside fn stays out of the figure).
inline double median_of(const std::function<double()>& fn, int fallback_repeats = 7) {
  fn();  // warm-up: pools, handles, page faults, module load
  std::vector<double> t;
  for (int i = 0; i < repeats(fallback_repeats); ++i) t.push_back(fn());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

/// Median wall time of fn() over the repeats.
inline double median_seconds(const std::function<void()>& fn, int fallback_repeats = 7) {
  return median_of(
      [&] {
        const auto t0 = Clock::now();
        fn();
        return since(t0);
      },
      fallback_repeats);
}

/// Medians of what a() and b() return (each times itself, in seconds), run
/// alternately after one warm-up of each (see below).
inline std::pair<double, double> interleaved_median_of(const std::function<double()>& a,
                                                       const std::function<double()>& b,
                                                       int fallback_repeats = 7) {
  a();
  b();
  std::vector<double> ta;
  std::vector<double> tb;
  for (int i = 0; i < repeats(fallback_repeats); ++i) {
    ta.push_back(a());
    tb.push_back(b());
  }
  std::sort(ta.begin(), ta.end());
  std::sort(tb.begin(), tb.end());
  return {ta[ta.size() / 2], tb[tb.size() / 2]};
}

/// Medians of the wall times of a() and b(), run alternately (a, b, a, b,
/// ...) after one warm-up of each: a drift of the machine's speed during
/// the runs moves both figures alike, so their ratio holds.
inline std::pair<double, double> interleaved_median_seconds(const std::function<void()>& a,
                                                            const std::function<void()>& b,
                                                            int fallback_repeats = 7) {
  auto timed = [](const std::function<void()>& fn) {
    return [f = &fn] {
      const auto t0 = Clock::now();
      (*f)();
      return since(t0);
    };
  };
  return interleaved_median_of(timed(a), timed(b), fallback_repeats);
}

}  // namespace lazydag::bench
