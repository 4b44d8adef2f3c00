// Optimizers: each parameter's update is one recorded op (a fused kernel on
// the CPU and on sim devices; on a GPU a few elementwise ops), recorded by
// step() under grad mode off and run asynchronously like any op.
#pragma once

#include <lazydag/ndarray.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace lazydag::optim {

using State = std::vector<std::pair<std::string, NDArray>>;

class Optimizer {
 public:
  /// `params`: leaves that require grad (float32 or float64), e.g. a
  /// module's parameters(). InvalidArgument otherwise.
  explicit Optimizer(std::vector<NDArray> params);
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  /// Records one update per parameter that has a gradient; returns at once.
  void step();
  /// Forgets every parameter's gradient.
  void zero_grad();
  /// Steps taken so far.
  [[nodiscard]] std::int64_t steps() const noexcept { return steps_; }
  [[nodiscard]] const std::vector<NDArray>& params() const noexcept { return params_; }
  /// The step count ("step", int64) and every buffer, named; save them with
  /// nd::save_npy and give them back to load_state.
  [[nodiscard]] State state() const;
  /// Restores what state() returned (the same optimizer type over
  /// parameters of the same shapes). Recorded copies; returns at once.
  void load_state(const State& s);
  /// The learning rate later steps use; set_lr changes it (a schedule:
  /// steps already recorded keep theirs). InvalidArgument unless lr >= 0.
  [[nodiscard]] virtual double lr() const noexcept = 0;
  virtual void set_lr(double lr) = 0;

 protected:
  /// Records parameter i's update with gradient g; `t` is the step, from 1.
  virtual void update(std::size_t i, const NDArray& g, std::int64_t t) = 0;
  /// Per-parameter buffers by name ("momentum", "m", "v"), created by
  /// buffer(); empty handles until a parameter's first update.
  NDArray& buffer(const std::string& name, std::size_t i);
  [[nodiscard]] NDArray& param(std::size_t i) { return params_[i]; }

 private:
  std::vector<NDArray> params_;
  std::vector<std::pair<std::string, std::vector<NDArray>>> buffers_;
  std::int64_t steps_ = 0;
};

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;  ///< L2: adds weight_decay * p to the gradient
  bool nesterov = false;      ///< needs momentum > 0 and dampening 0
};

/// PyTorch's SGD: b = momentum b + (1 - dampening) g (b = g the first
/// time), then p -= lr (nesterov ? g + momentum b : b).
class SGD : public Optimizer {
 public:
  SGD(std::vector<NDArray> params, SGDOptions o);
  [[nodiscard]] const SGDOptions& options() const noexcept { return o_; }
  [[nodiscard]] double lr() const noexcept override { return o_.lr; }
  void set_lr(double lr) override;

 private:
  void update(std::size_t i, const NDArray& g, std::int64_t t) override;
  SGDOptions o_;
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;
  /// AdamW: p *= 1 - lr weight_decay before the step, instead of adding
  /// weight_decay p to the gradient.
  bool decoupled_weight_decay = false;
};

/// Adam (Kingma and Ba) with PyTorch's bias corrections and epsilon placement.
class Adam : public Optimizer {
 public:
  Adam(std::vector<NDArray> params, AdamOptions o);
  [[nodiscard]] const AdamOptions& options() const noexcept { return o_; }
  [[nodiscard]] double lr() const noexcept override { return o_.lr; }
  void set_lr(double lr) override;

 private:
  void update(std::size_t i, const NDArray& g, std::int64_t t) override;
  AdamOptions o_;
};

/// Adam with decoupled weight decay (Loshchilov and Hutter); default 0.01.
class AdamW : public Adam {
 public:
  AdamW(std::vector<NDArray> params, AdamOptions o = with_decay());

 private:
  static AdamOptions with_decay() {
    AdamOptions o;
    o.weight_decay = 0.01;
    return o;
  }
};

}  // namespace lazydag::optim
