// lazydag.nn, lazydag.optim, lazydag.MetricLog, lazydag.dist.DataParallel.
//
// Modules are held by std::shared_ptr. A Python subclass of nn.Module
// overrides forward() through a trampoline; its Python object must outlive
// the C++ references to it, so every place that keeps a module (a
// Sequential, a registered child, DataParallel) keeps the Python object
// alive too (keep_alive, or the parent's __dict__). Assigning a module or a
// trainable leaf array to an attribute of a Python module registers it, as
// in PyTorch.
#include "training.hpp"

#include <lazydag/dist.hpp>
#include <lazydag/metric_log.hpp>
#include <lazydag/module.hpp>
#include <lazydag/optim.hpp>

#include <pybind11/functional.h>
#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace py = pybind11;
using namespace lazydag;

namespace lazydag_py {
namespace {

class PyModule : public nn::Module {
 public:
  NDArray forward(const NDArray& x) override { PYBIND11_OVERRIDE_PURE(NDArray, nn::Module, forward, x); }
  NDArray add_parameter(std::string name, NDArray p) { return register_parameter(std::move(name), std::move(p)); }
  void add_module(std::string name, std::shared_ptr<nn::Module> m) { register_module(std::move(name), std::move(m)); }
};

PyModule& python_module(nn::Module& m, const char* what) {
  auto* p = dynamic_cast<PyModule*>(&m);
  if (p == nullptr) {
    throw InvalidArgument(std::string(what) + ": only a Python subclass of nn.Module registers its own parts");
  }
  return *p;
}

}  // namespace

void bind_training(py::module_& m, py::module_& dm) {
  py::module_ nnm = m.def_submodule("nn", "modules, parameters and initialisers");
  nnm.def("manual_seed", &nn::manual_seed, py::arg("seed"),
          "seeds the parameter initialisers (a counter-based stream: runs repeat exactly)");
  nnm.def("Parameter", [](const NDArray& a) {
    NDArray p = a.detach();
    p.requires_grad(true);
    return p;
  }, py::arg("data"), "a trainable leaf with data's values (storage shared)");

  py::module_ init = nnm.def_submodule("init", "parameter initialisers");
  init.def("uniform_fan_in", [](const Shape& shape, std::int64_t fan_in, const py::object& d, const py::object& t) {
    return nn::init::uniform_fan_in(shape, fan_in, device_or(d), dtype_or(t, DType::kFloat32));
  }, py::arg("shape"), py::arg("fan_in"), py::arg("device") = py::none(), py::arg("dtype") = py::none());
  init.def("kaiming_normal", [](const Shape& shape, std::int64_t fan_in, const py::object& d, const py::object& t) {
    return nn::init::kaiming_normal(shape, fan_in, device_or(d), dtype_or(t, DType::kFloat32));
  }, py::arg("shape"), py::arg("fan_in"), py::arg("device") = py::none(), py::arg("dtype") = py::none());
  init.def("xavier_uniform", [](const Shape& shape, std::int64_t fan_in, std::int64_t fan_out, const py::object& d,
                                const py::object& t) {
    return nn::init::xavier_uniform(shape, fan_in, fan_out, device_or(d), dtype_or(t, DType::kFloat32));
  }, py::arg("shape"), py::arg("fan_in"), py::arg("fan_out"), py::arg("device") = py::none(),
     py::arg("dtype") = py::none());

  py::class_<nn::Module, PyModule, std::shared_ptr<nn::Module>>(nnm, "Module", py::dynamic_attr())
      .def(py::init<>())
      .def("forward", &nn::Module::forward, py::arg("x"))
      .def("__call__", &nn::Module::forward, py::arg("x"))
      .def("parameters", &nn::Module::parameters)
      .def("named_parameters", &nn::Module::named_parameters)
      .def("zero_grad", &nn::Module::zero_grad)
      .def("register_parameter", [](nn::Module& self, std::string name, const NDArray& p) {
        return python_module(self, "register_parameter").add_parameter(std::move(name), p);
      }, py::arg("name"), py::arg("parameter"))
      .def("register_module", [](py::object self, std::string name, py::object child) {
        python_module(self.cast<nn::Module&>(), "register_module")
            .add_module(name, child.cast<std::shared_ptr<nn::Module>>());
        // The child's Python object lives as long as the parent's.
        py::module_::import("builtins").attr("object").attr("__setattr__")(self, py::str(name), child);
      }, py::arg("name"), py::arg("module"))
      .def("__setattr__", [](py::object self, const std::string& name, py::object value) {
        auto* pm = dynamic_cast<PyModule*>(&self.cast<nn::Module&>());
        const bool fresh = !py::hasattr(self, name.c_str());
        if (pm != nullptr && fresh) {
          if (py::isinstance<nn::Module>(value)) {
            pm->add_module(name, value.cast<std::shared_ptr<nn::Module>>());
          } else if (py::isinstance<NDArray>(value)) {
            const auto& a = value.cast<const NDArray&>();
            if (a.requires_grad() && a.is_leaf()) value = py::cast(pm->add_parameter(name, a));
          }
        }
        py::module_::import("builtins").attr("object").attr("__setattr__")(self, py::str(name), value);
      });

  py::class_<nn::Linear, nn::Module, std::shared_ptr<nn::Linear>>(nnm, "Linear")
      .def(py::init([](std::int64_t in, std::int64_t out, bool bias, const py::object& d, const py::object& t) {
             return std::make_shared<nn::Linear>(in, out, bias, device_or(d), dtype_or(t, DType::kFloat32));
           }),
           py::arg("in_features"), py::arg("out_features"), py::arg("bias") = true, py::arg("device") = py::none(),
           py::arg("dtype") = py::none())
      .def_readonly("weight", &nn::Linear::weight, "(in_features, out_features): y = x @ weight + bias")
      .def_property_readonly("bias", [](const nn::Linear& l) -> py::object {
        return l.bias.valid() ? py::cast(l.bias) : py::none();
      });
  py::class_<nn::ReLU, nn::Module, std::shared_ptr<nn::ReLU>>(nnm, "ReLU").def(py::init<>());
  py::class_<nn::Tanh, nn::Module, std::shared_ptr<nn::Tanh>>(nnm, "Tanh").def(py::init<>());
  py::class_<nn::Sigmoid, nn::Module, std::shared_ptr<nn::Sigmoid>>(nnm, "Sigmoid").def(py::init<>());
  py::class_<nn::Sequential, nn::Module, std::shared_ptr<nn::Sequential>>(nnm, "Sequential")
      .def(py::init([](const py::args& layers) {
             auto s = std::make_shared<nn::Sequential>();
             for (const py::handle& l : layers) s->add(l.cast<std::shared_ptr<nn::Module>>());
             return s;
           }),
           py::keep_alive<1, 2>())  // the layers' Python objects live as long as the Sequential
      .def("add", [](nn::Sequential& s, const std::shared_ptr<nn::Module>& layer) -> nn::Sequential& {
        return s.add(layer);
      }, py::arg("layer"), py::keep_alive<1, 2>(), py::return_value_policy::reference_internal)
      .def("__len__", &nn::Sequential::size);

  // Optimizers: each parameter's update is one recorded op; step() returns at once.
  py::module_ om = m.def_submodule("optim", "optimizers: SGD, Adam, AdamW");
  py::class_<optim::Optimizer>(om, "Optimizer")
      .def("step", &optim::Optimizer::step)
      .def("zero_grad", &optim::Optimizer::zero_grad)
      .def_property_readonly("steps", &optim::Optimizer::steps)
      .def_property_readonly("params", &optim::Optimizer::params)
      .def("state", &optim::Optimizer::state)
      .def("load_state", &optim::Optimizer::load_state, py::arg("state"))
      .def_property("lr", &optim::Optimizer::lr, &optim::Optimizer::set_lr);
  py::class_<optim::SGD, optim::Optimizer>(om, "SGD")
      .def(py::init([](std::vector<NDArray> params, double lr, double momentum, double dampening, double weight_decay,
                       bool nesterov) {
             optim::SGDOptions o;
             o.lr = lr;
             o.momentum = momentum;
             o.dampening = dampening;
             o.weight_decay = weight_decay;
             o.nesterov = nesterov;
             return std::make_unique<optim::SGD>(std::move(params), o);
           }),
           py::arg("params"), py::arg("lr") = 0.01, py::arg("momentum") = 0.0, py::arg("dampening") = 0.0,
           py::arg("weight_decay") = 0.0, py::arg("nesterov") = false);
  auto adam_options = [](double lr, const std::pair<double, double>& betas, double eps, double weight_decay,
                         bool decoupled) {
    optim::AdamOptions o;
    o.lr = lr;
    o.beta1 = betas.first;
    o.beta2 = betas.second;
    o.eps = eps;
    o.weight_decay = weight_decay;
    o.decoupled_weight_decay = decoupled;
    return o;
  };
  py::class_<optim::Adam, optim::Optimizer>(om, "Adam")
      .def(py::init([adam_options](std::vector<NDArray> params, double lr, std::pair<double, double> betas, double eps,
                                   double weight_decay) {
             return std::make_unique<optim::Adam>(std::move(params), adam_options(lr, betas, eps, weight_decay, false));
           }),
           py::arg("params"), py::arg("lr") = 1e-3, py::arg("betas") = std::pair<double, double>(0.9, 0.999),
           py::arg("eps") = 1e-8, py::arg("weight_decay") = 0.0);
  py::class_<optim::AdamW, optim::Adam>(om, "AdamW")
      .def(py::init([adam_options](std::vector<NDArray> params, double lr, std::pair<double, double> betas, double eps,
                                   double weight_decay) {
             return std::make_unique<optim::AdamW>(std::move(params), adam_options(lr, betas, eps, weight_decay, true));
           }),
           py::arg("params"), py::arg("lr") = 1e-3, py::arg("betas") = std::pair<double, double>(0.9, 0.999),
           py::arg("eps") = 1e-8, py::arg("weight_decay") = 0.01);

  // MetricLog: append() records a device-side copy; every flush_every
  // appends one blocking transfer hands the block to `sink(first_step,
  // values)` (called with the GIL) or appends it to a CSV file.
  py::class_<MetricLog>(m, "MetricLog")
      .def(py::init([](std::string name, std::int64_t every, const py::object& sink, const py::object& d) {
             if (py::isinstance<py::str>(sink)) {
               return std::make_unique<MetricLog>(std::move(name), every, sink.cast<std::string>(), device_or(d));
             }
             auto fn = std::make_shared<py::object>(sink);
             MetricLog::Sink s = [fn](std::int64_t first, std::span<const double> values) {
               py::gil_scoped_acquire gil;
               (*fn)(first, std::vector<double>(values.begin(), values.end()));
             };
             return std::make_unique<MetricLog>(std::move(name), every, std::move(s), device_or(d));
           }),
           py::arg("name"), py::arg("flush_every"), py::arg("sink"), py::arg("device") = py::none())
      .def("append", [](MetricLog& log, const NDArray& v) {
        py::gil_scoped_release nogil;
        log.append(v);
      }, py::arg("value"))
      .def("flush", [](MetricLog& log) {
        py::gil_scoped_release nogil;
        log.flush();
      })
      .def_property_readonly("name", &MetricLog::name)
      .def_property_readonly("steps", &MetricLog::steps);

  py::class_<dist::DataParallel>(dm, "DataParallel")
      .def(py::init([](nn::Module& model, std::size_t bucket_bytes, bool overlap) {
             return std::make_unique<dist::DataParallel>(model, bucket_bytes, overlap);
           }),
           py::arg("model"), py::arg("bucket_bytes") = std::size_t{1} << 20, py::arg("overlap") = true,
           py::keep_alive<1, 2>())
      .def("synchronize", &dist::DataParallel::synchronize)
      .def_property_readonly("num_buckets", &dist::DataParallel::num_buckets);
}

}  // namespace lazydag_py
