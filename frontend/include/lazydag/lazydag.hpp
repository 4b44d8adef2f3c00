// The one header a user needs: the engine, NDArray and the Benchmark timer.
#pragma once

#include <lazydag/benchmark.hpp>
#include <lazydag/engine/engine.hpp>
#include <lazydag/engine/error.hpp>
#include <lazydag/engine/sync_debug.hpp>
#include <lazydag/metric_log.hpp>
#include <lazydag/ndarray.hpp>
