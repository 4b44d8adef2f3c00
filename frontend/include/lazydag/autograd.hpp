// Grad mode: whether differentiable ops recorded by this thread build the
// gradient graph (docs/guide.md, "Training").
#pragma once

namespace lazydag::autograd {

/// True unless a NoGradGuard (or set_grad_enabled(false)) is active on this
/// thread. Each thread starts with grad mode on.
[[nodiscard]] bool is_grad_enabled() noexcept;
/// Sets grad mode for this thread.
void set_grad_enabled(bool on) noexcept;

/// Grad mode off for this thread for the guard's lifetime: ops record no
/// backward nodes and arrays that require grad may be written in place (an
/// optimizer's update). Restores the previous mode.
class NoGradGuard {
 public:
  NoGradGuard() noexcept : previous_(is_grad_enabled()) { set_grad_enabled(false); }
  ~NoGradGuard() { set_grad_enabled(previous_); }
  NoGradGuard(const NoGradGuard&) = delete;
  NoGradGuard& operator=(const NoGradGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace lazydag::autograd
