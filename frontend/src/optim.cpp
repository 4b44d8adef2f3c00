// Optimizers. An update reads the gradient and writes the parameter and its
// buffers in one pass: one recorded host kernel on CPU and sim devices
// (where a composition of elementwise ops would be five to ten passes and as
// many recorded ops per parameter), elementwise ops on a GPU.
#include <lazydag/autograd.hpp>
#include <lazydag/optim.hpp>
#include <lazydag/ops/kernels.hpp>

#include "internal.hpp"

#include <cmath>
#include <sstream>

namespace lazydag::optim {

namespace {

void check(bool ok, const char* opt, const char* what, double v) {
  if (!ok) {
    std::ostringstream m;
    m << opt << ": " << what << ", got " << v;
    throw InvalidArgument(m.str());
  }
}

}  // namespace

Optimizer::Optimizer(std::vector<NDArray> params) : params_(std::move(params)) {
  if (params_.empty()) throw InvalidArgument("optimizer: no parameters");
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const auto& p = params_[i];
    if (!p.valid()) throw InvalidArgument("optimizer: parameter " + std::to_string(i) + " is an empty handle");
    if (!p.requires_grad() || !p.is_leaf()) {
      throw InvalidArgument("optimizer: parameter " + std::to_string(i) +
                            " is not a leaf that requires grad (call requires_grad(true))");
    }
  }
}

NDArray& Optimizer::buffer(const std::string& name, std::size_t i) {
  for (auto& [n, v] : buffers_) {
    if (n == name) return v[i];
  }
  buffers_.emplace_back(name, std::vector<NDArray>(params_.size()));
  return buffers_.back().second[i];
}

void Optimizer::step() {
  autograd::NoGradGuard no_grad;
  ++steps_;
  for (std::size_t i = 0; i < params_.size(); ++i) {
    const NDArray g = params_[i].grad();
    if (!g.valid()) continue;
    update(i, g.is_contiguous() ? g : g.copy(), steps_);
  }
}

void Optimizer::zero_grad() {
  for (auto& p : params_) p.zero_grad();
}

State Optimizer::state() const {
  State s;
  s.emplace_back("step", nd::array(std::vector<std::int64_t>{steps_}, {1}, cpu()));
  for (const auto& [name, v] : buffers_) {
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (v[i].valid()) s.emplace_back(name + "." + std::to_string(i), v[i]);
    }
  }
  return s;
}

void Optimizer::load_state(const State& s) {
  autograd::NoGradGuard no_grad;
  bool have_step = false;
  for (const auto& [name, a] : s) {
    if (name == "step") {
      steps_ = a.as_in_device(cpu()).item<std::int64_t>();  // blocks: a host value
      have_step = true;
      continue;
    }
    const auto dot = name.rfind('.');
    std::size_t i = params_.size();
    try {
      if (dot != std::string::npos) i = std::stoul(name.substr(dot + 1));
    } catch (const std::exception&) {
    }
    if (i >= params_.size()) throw InvalidArgument("load_state: no parameter for '" + name + "'");
    const NDArray& p = params_[i];
    if (a.shape() != p.shape() || a.dtype() != p.dtype()) {
      throw InvalidArgument("load_state: '" + name + "' has shape " + to_string(a.shape()) +
                            ", its parameter " + to_string(p.shape()));
    }
    NDArray& b = buffer(name.substr(0, dot), i);
    b = a.as_in_device(p.device()).copy();
  }
  if (!have_step) throw InvalidArgument("load_state: no 'step' entry");
}

SGD::SGD(std::vector<NDArray> params, SGDOptions o) : Optimizer(std::move(params)), o_(o) {
  check(o.lr >= 0.0, "SGD", "lr must be >= 0", o.lr);
  check(o.momentum >= 0.0, "SGD", "momentum must be >= 0", o.momentum);
  check(o.weight_decay >= 0.0, "SGD", "weight_decay must be >= 0", o.weight_decay);
  check(!o.nesterov || (o.momentum > 0.0 && o.dampening == 0.0), "SGD",
        "nesterov needs momentum > 0 and dampening 0; momentum", o.momentum);
}

void SGD::set_lr(double lr) {
  check(lr >= 0.0, "SGD", "lr must be >= 0", lr);
  o_.lr = lr;
}

void SGD::update(std::size_t i, const NDArray& g, std::int64_t) {
  NDArray& p = param(i);
  const bool momentum = o_.momentum != 0.0;
  NDArray* b = momentum ? &buffer("momentum", i) : nullptr;
  const bool first = b != nullptr && !b->valid();
  if (first) *b = nd::zeros(p.shape(), p.dtype(), p.device());
  if (!detail::runs_host_kernels(p.device())) {
    NDArray d = o_.weight_decay != 0.0 ? g + p * o_.weight_decay : g;
    if (b != nullptr) {
      b->assign(first ? d : *b * o_.momentum + d * (1.0 - o_.dampening));
      d = o_.nesterov ? d + *b * o_.momentum : *b;
    }
    p -= d * o_.lr;
    return;
  }
  std::vector<NDArray> writes = {p};
  if (b != nullptr) writes.push_back(*b);
  const std::int64_t n = p.size();
  const DType type = p.dtype();
  const ops::cpu::SgdStep a{o_.lr, o_.weight_decay, o_.momentum, 1.0 - o_.dampening, o_.nesterov, first};
  detail::record_host_kernel("sgd", {g}, writes, [n, type, a](const std::vector<void*>& ptrs) {
    ops::cpu::sgd_step(type, ptrs[1], ptrs.size() > 2 ? ptrs[2] : nullptr, ptrs[0], n, a);
  });
}

Adam::Adam(std::vector<NDArray> params, AdamOptions o) : Optimizer(std::move(params)), o_(o) {
  check(o.lr >= 0.0, "Adam", "lr must be >= 0", o.lr);
  check(o.beta1 >= 0.0 && o.beta1 < 1.0, "Adam", "beta1 must be in [0, 1)", o.beta1);
  check(o.beta2 >= 0.0 && o.beta2 < 1.0, "Adam", "beta2 must be in [0, 1)", o.beta2);
  check(o.eps >= 0.0, "Adam", "eps must be >= 0", o.eps);
  check(o.weight_decay >= 0.0, "Adam", "weight_decay must be >= 0", o.weight_decay);
}

void Adam::set_lr(double lr) {
  check(lr >= 0.0, "Adam", "lr must be >= 0", lr);
  o_.lr = lr;
}

void Adam::update(std::size_t i, const NDArray& g, std::int64_t t) {
  NDArray& p = param(i);
  NDArray& m = buffer("m", i);
  NDArray& v = buffer("v", i);
  if (!m.valid()) m = nd::zeros(p.shape(), p.dtype(), p.device());
  if (!v.valid()) v = nd::zeros(p.shape(), p.dtype(), p.device());
  const double bc1 = 1.0 - std::pow(o_.beta1, static_cast<double>(t));
  const double bc2 = 1.0 - std::pow(o_.beta2, static_cast<double>(t));
  if (!detail::runs_host_kernels(p.device())) {
    NDArray d = g;
    if (o_.decoupled_weight_decay) {
      p *= 1.0 - o_.lr * o_.weight_decay;
    } else if (o_.weight_decay != 0.0) {
      d = d + p * o_.weight_decay;
    }
    m.assign(m * o_.beta1 + d * (1.0 - o_.beta1));
    v.assign(v * o_.beta2 + d * d * (1.0 - o_.beta2));
    p -= m * (o_.lr / bc1) / (nd::sqrt(v) * (1.0 / std::sqrt(bc2)) + o_.eps);
    return;
  }
  const std::int64_t n = p.size();
  const DType type = p.dtype();
  const ops::cpu::AdamStep a{o_.beta1, o_.beta2, o_.eps, o_.weight_decay, o_.lr / bc1, 1.0 / std::sqrt(bc2),
                             1.0 - o_.lr * o_.weight_decay, o_.decoupled_weight_decay};
  detail::record_host_kernel("adam", {g}, {p, m, v}, [n, type, a](const std::vector<void*>& ptrs) {
    ops::cpu::adam_step(type, ptrs[1], ptrs[2], ptrs[3], ptrs[0], n, a);
  });
}

AdamW::AdamW(std::vector<NDArray> params, AdamOptions o)
    : Adam(std::move(params), [&] {
        o.decoupled_weight_decay = true;
        return o;
      }()) {}

}  // namespace lazydag::optim
