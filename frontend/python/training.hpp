// The training layer of the Python module: lazydag.nn (modules, with
// Python subclasses), lazydag.optim, lazydag.MetricLog and
// lazydag.dist.DataParallel; and what both files of the module share.
#pragma once

#include <lazydag/lazydag.hpp>

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

// Shapes and strides (lazydag::InlineVector) convert as std::vector does:
// from any sequence of ints, to a list. Every file of the module includes
// this header, so the conversion is the same everywhere.
namespace pybind11::detail {
template <class T, std::size_t N>
struct type_caster<lazydag::InlineVector<T, N>> : list_caster<lazydag::InlineVector<T, N>, T> {};
}  // namespace pybind11::detail

namespace lazydag_py {

lazydag::DType to_dtype(const pybind11::object& o);
lazydag::DType dtype_or(const pybind11::object& o, lazydag::DType fallback);
lazydag::Device device_or(const pybind11::object& o);

/// Adds the submodules nn and optim and the class MetricLog to `m`, and
/// DataParallel to `dist`.
void bind_training(pybind11::module_& m, pybind11::module_& dist);

}  // namespace lazydag_py
