// The CUDA kernels in a build without CUDA: a gpu device cannot be created
// there, so these are reached only by a misuse; they fail loudly.
#include <lazydag/ops/kernels.hpp>

namespace lazydag::ops::cuda {

namespace {
[[noreturn]] void unavailable() {
  throw BackendUnavailable("CUDA kernels: this lazydag was built without CUDA");
}
}  // namespace

void unary(void*, UnaryOp, const TensorView&, const TensorView&) { unavailable(); }
void binary(void*, BinaryOp, const TensorView&, const TensorView&, const TensorView&) { unavailable(); }
void binary_scalar(void*, BinaryOp, const TensorView&, double, bool, const TensorView&) { unavailable(); }
void compare(void*, CompareOp, const TensorView&, const TensorView&, const TensorView&) { unavailable(); }
void compare_scalar(void*, CompareOp, const TensorView&, double, const TensorView&) { unavailable(); }
void where(void*, const TensorView&, const TensorView&, const TensorView&, const TensorView&) { unavailable(); }
void copy_cast(void*, const TensorView&, const TensorView&) { unavailable(); }
void reduce(void*, ReduceOp, const TensorView&, bool, int, const TensorView&) { unavailable(); }
void matmul(void*, const TensorView&, const TensorView&, const TensorView&) { unavailable(); }
void fused(void*, std::span<const FusedStep>, std::span<const TensorView>, std::span<const TensorView>, const Shape&) {
  unavailable();
}
void fill(void*, const TensorView&, double) { unavailable(); }
void arange(void*, const TensorView&, double, double) { unavailable(); }
void random_uniform(void*, const TensorView&, std::uint64_t, double, double) { unavailable(); }
void random_normal(void*, const TensorView&, std::uint64_t, double, double) { unavailable(); }
void memcpy_async(void*, void*, const void*, std::size_t, int) { unavailable(); }
void memcpy_peer_async(void*, void*, int, const void*, int, std::size_t) { unavailable(); }
std::string load_blas() { unavailable(); }

}  // namespace lazydag::ops::cuda
