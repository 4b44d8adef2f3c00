// Layers for model code: parameters, Linear, activations, a sequential
// container and parameter initialisers (docs/guide.md, "Training").
#pragma once

#include <lazydag/ndarray.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace lazydag::nn {

/// The seed the initialisers draw from next; each initialised array takes
/// one seed and advances it, so a program that sets it builds the same
/// model every run. Thread-safe.
void manual_seed(std::uint64_t seed);
[[nodiscard]] std::uint64_t next_seed();

namespace init {
/// U(-1/sqrt(fan_in), 1/sqrt(fan_in)): PyTorch's default for Linear.
[[nodiscard]] NDArray uniform_fan_in(const Shape& shape, std::int64_t fan_in, Device dev = default_device(),
                                     DType t = DType::kFloat32);
/// N(0, 2 / fan_in) (He et al.), for layers followed by ReLU.
[[nodiscard]] NDArray kaiming_normal(const Shape& shape, std::int64_t fan_in, Device dev = default_device(),
                                     DType t = DType::kFloat32);
/// U(-b, b), b = sqrt(6 / (fan_in + fan_out)) (Glorot and Bengio).
[[nodiscard]] NDArray xavier_uniform(const Shape& shape, std::int64_t fan_in, std::int64_t fan_out,
                                     Device dev = default_device(), DType t = DType::kFloat32);
}  // namespace init

/// A layer: a forward function and the parameters it owns (arrays that
/// require grad), its children's included.
class Module {
 public:
  virtual ~Module() = default;
  Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  [[nodiscard]] virtual NDArray forward(const NDArray& x) = 0;
  [[nodiscard]] NDArray operator()(const NDArray& x) { return forward(x); }
  /// Every parameter, this module's in registration order, then each
  /// child's. The handles share the parameters' storage.
  [[nodiscard]] std::vector<NDArray> parameters() const;
  /// The same, named "child.name" (for saving).
  [[nodiscard]] std::vector<std::pair<std::string, NDArray>> named_parameters() const;
  /// Forgets every parameter's gradient.
  void zero_grad();

 protected:
  /// Makes `p` a parameter (requires_grad(true)) and returns it.
  NDArray register_parameter(std::string name, NDArray p);
  /// Adds a child whose parameters this module reports as its own.
  void register_module(std::string name, std::shared_ptr<Module> m);

 private:
  std::vector<std::pair<std::string, NDArray>> params_;
  std::vector<std::pair<std::string, std::shared_ptr<Module>>> children_;
};

/// y = x W + b, with W of shape [in, out] (so the forward multiplies
/// without a transposed copy) initialised by init::uniform_fan_in, and b of
/// shape [out] likewise (or none).
class Linear : public Module {
 public:
  Linear(std::int64_t in, std::int64_t out, bool bias = true, Device dev = default_device(),
         DType t = DType::kFloat32);
  [[nodiscard]] NDArray forward(const NDArray& x) override;
  NDArray weight;
  NDArray bias;  // empty without bias
};

class ReLU : public Module {
 public:
  [[nodiscard]] NDArray forward(const NDArray& x) override;
};
class Tanh : public Module {
 public:
  [[nodiscard]] NDArray forward(const NDArray& x) override;
};
class Sigmoid : public Module {
 public:
  [[nodiscard]] NDArray forward(const NDArray& x) override;
};

/// Children applied in order.
class Sequential : public Module {
 public:
  /// Appends a new M(args...).
  template <class M, class... Args>
  Sequential& add(Args&&... args) {
    return add(std::make_shared<M>(std::forward<Args>(args)...));
  }
  Sequential& add(std::shared_ptr<Module> m);
  [[nodiscard]] NDArray forward(const NDArray& x) override;
  [[nodiscard]] std::size_t size() const noexcept { return layers_.size(); }

 private:
  std::vector<std::shared_ptr<Module>> layers_;
};

}  // namespace lazydag::nn
