// The training layer of the Python module: lazydag.nn (modules, with
// Python subclasses), lazydag.optim, lazydag.MetricLog and
// lazydag.dist.DataParallel.
#pragma once

#include <lazydag/lazydag.hpp>

#include <pybind11/pybind11.h>

namespace lazydag_py {

lazydag::DType to_dtype(const pybind11::object& o);
lazydag::DType dtype_or(const pybind11::object& o, lazydag::DType fallback);
lazydag::Device device_or(const pybind11::object& o);

/// Adds the submodules nn and optim and the class MetricLog to `m`, and
/// DataParallel to `dist`.
void bind_training(pybind11::module_& m, pybind11::module_& dist);

}  // namespace lazydag_py
