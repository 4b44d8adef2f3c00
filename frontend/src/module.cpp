// Modules and initialisers.
#include <lazydag/autograd.hpp>
#include <lazydag/module.hpp>

#include <atomic>
#include <cmath>

namespace lazydag::nn {

namespace {
std::atomic<std::uint64_t> g_seed{0x6c617a79};

void check_fan(std::int64_t fan, const char* what) {
  if (fan <= 0) throw InvalidArgument(std::string(what) + ": fan must be positive, got " + std::to_string(fan));
}
}  // namespace

void manual_seed(std::uint64_t seed) { g_seed.store(seed, std::memory_order_relaxed); }
std::uint64_t next_seed() { return g_seed.fetch_add(1, std::memory_order_relaxed); }

namespace init {
NDArray uniform_fan_in(const Shape& shape, std::int64_t fan_in, Device dev, DType t) {
  check_fan(fan_in, "init::uniform_fan_in");
  const double b = 1.0 / std::sqrt(static_cast<double>(fan_in));
  return nd::random_uniform(shape, dev, next_seed(), -b, b, t);
}
NDArray kaiming_normal(const Shape& shape, std::int64_t fan_in, Device dev, DType t) {
  check_fan(fan_in, "init::kaiming_normal");
  return nd::random_normal(shape, dev, next_seed(), 0.0, std::sqrt(2.0 / static_cast<double>(fan_in)), t);
}
NDArray xavier_uniform(const Shape& shape, std::int64_t fan_in, std::int64_t fan_out, Device dev, DType t) {
  check_fan(fan_in, "init::xavier_uniform");
  check_fan(fan_out, "init::xavier_uniform");
  const double b = std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  return nd::random_uniform(shape, dev, next_seed(), -b, b, t);
}
}  // namespace init

std::vector<NDArray> Module::parameters() const {
  std::vector<NDArray> out;
  for (auto& [name, p] : named_parameters()) out.push_back(p);
  return out;
}

std::vector<std::pair<std::string, NDArray>> Module::named_parameters() const {
  std::vector<std::pair<std::string, NDArray>> out = params_;
  for (const auto& [name, child] : children_) {
    for (auto& [n, p] : child->named_parameters()) out.emplace_back(name + "." + n, p);
  }
  return out;
}

void Module::zero_grad() {
  for (auto& p : parameters()) p.zero_grad();
}

NDArray Module::register_parameter(std::string name, NDArray p) {
  p.requires_grad(true);
  params_.emplace_back(std::move(name), p);
  return p;
}

void Module::register_module(std::string name, std::shared_ptr<Module> m) {
  if (!m) throw InvalidArgument("register_module: a null module");
  children_.emplace_back(std::move(name), std::move(m));
}

Linear::Linear(std::int64_t in, std::int64_t out, bool bias, Device dev, DType t) {
  if (in <= 0 || out <= 0) {
    throw InvalidArgument("Linear: sizes must be positive, got " + std::to_string(in) + " -> " +
                          std::to_string(out));
  }
  weight = register_parameter("weight", init::uniform_fan_in({in, out}, in, dev, t));
  if (bias) this->bias = register_parameter("bias", init::uniform_fan_in({out}, in, dev, t));
}

NDArray Linear::forward(const NDArray& x) {
  NDArray y = nd::matmul(x, weight);
  return bias.valid() ? y + bias : y;
}

NDArray ReLU::forward(const NDArray& x) { return nd::relu(x); }
NDArray Tanh::forward(const NDArray& x) { return nd::tanh(x); }
NDArray Sigmoid::forward(const NDArray& x) { return nd::sigmoid(x); }

Sequential& Sequential::add(std::shared_ptr<Module> m) {
  register_module(std::to_string(layers_.size()), m);
  layers_.push_back(std::move(m));
  return *this;
}

NDArray Sequential::forward(const NDArray& x) {
  if (layers_.empty()) throw InvalidArgument("Sequential: no layers");
  NDArray y = x;
  for (auto& l : layers_) y = l->forward(y);
  return y;
}

}  // namespace lazydag::nn
