// The one header a user needs: the engine, NDArray with autograd, losses and
// the Benchmark timer.
#pragma once

#include <lazydag/autograd.hpp>
#include <lazydag/benchmark.hpp>
#include <lazydag/data.hpp>
#include <lazydag/engine/engine.hpp>
#include <lazydag/engine/error.hpp>
#include <lazydag/engine/sync_debug.hpp>
#include <lazydag/metric_log.hpp>
#include <lazydag/module.hpp>
#include <lazydag/ndarray.hpp>
#include <lazydag/nn.hpp>
#include <lazydag/optim.hpp>
