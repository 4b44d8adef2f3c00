// The CPU kernels: each works on strided views of typed buffers and is
// called from inside a recorded node. Kernels do not check shapes (the
// frontend did at record time) but do report runtime faults (integer
// division by zero) by throwing.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>

#include <lazydag/engine/engine.hpp>
#include <lazydag/ops/dtype.hpp>
#include <lazydag/ops/shape.hpp>

namespace lazydag::ops {

/// A strided view of a buffer: element (i0..in) is at
/// data + (offset + sum(ik * strides[k])) * size_of(dtype).
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kFloat32;
  Shape shape;
  Strides strides;
  std::int64_t offset = 0;
};

enum class UnaryOp : std::uint8_t { kNeg, kAbs, kExp, kLog, kSqrt, kTanh, kSigmoid, kRelu, kLog1p };
enum class BinaryOp : std::uint8_t { kAdd, kSub, kMul, kDiv, kPow, kMax, kMin };
enum class CompareOp : std::uint8_t { kEq, kNe, kLt, kLe, kGt, kGe };
enum class ReduceOp : std::uint8_t { kSum, kMean, kMax, kMin, kArgmax };

/// One step of a fused elementwise program (cpu::fused): the op a single
/// recorded elementwise call would run, with its operands named by place.
struct FusedStep {
  enum class Kind : std::uint8_t { kUnary, kBinary, kScalar, kCompare, kCompareScalar, kWhere, kCast };
  Kind kind = Kind::kUnary;
  std::uint8_t op = 0;            ///< the UnaryOp, BinaryOp or CompareOp
  bool scalar_first = false;      ///< kScalar: op(scalar, a)
  DType dtype = DType::kFloat32;  ///< the step's result
  double scalar = 0;              ///< kScalar, kCompareScalar
  std::uint8_t num_in = 0;
  /// Operands: >= 0 the result of that earlier step; < 0 the external input
  /// number -1 - in.
  std::array<std::int32_t, 3> in{};
};

[[nodiscard]] std::string_view to_string(UnaryOp op) noexcept;
[[nodiscard]] std::string_view to_string(BinaryOp op) noexcept;
[[nodiscard]] std::string_view to_string(CompareOp op) noexcept;
[[nodiscard]] std::string_view to_string(ReduceOp op) noexcept;

namespace cpu {

/// out = op(a); same dtype, same shape (a broadcast to out.shape).
void unary(UnaryOp op, const TensorView& a, const TensorView& out);
/// The instruction set of exp, log, tanh and sigmoid on float arrays:
/// "avx512f", "avx2", "sse2" (the widest the CPU has, capped by
/// LAZYDAG_VMATH_ISA=avx2 or sse2), or "scalar" off x86-64.
[[nodiscard]] const char* vector_math_isa() noexcept;
/// Stops the threads OpenBLAS's pthread build starts when it is loaded,
/// which poll for work for a while before they sleep (a threaded
/// BLAS call starts them again); the first call only. nd::engine() calls it
/// when it is first used.
void stop_idle_blas_threads() noexcept;
/// out = op(a, b) with a and b broadcast to out.shape; one dtype throughout.
void binary(BinaryOp op, const TensorView& a, const TensorView& b, const TensorView& out);
/// out = op(a, scalar) (or op(scalar, a) when scalar_first).
void binary_scalar(BinaryOp op, const TensorView& a, double scalar, bool scalar_first,
                   const TensorView& out);
/// out (bool) = a op b, broadcast.
void compare(CompareOp op, const TensorView& a, const TensorView& b, const TensorView& out);
void compare_scalar(CompareOp op, const TensorView& a, double scalar, const TensorView& out);
/// out = cond ? a : b, broadcast.
void where(const TensorView& cond, const TensorView& a, const TensorView& b,
           const TensorView& out);
/// out = a converted to out.dtype (also a strided-to-contiguous copy).
void copy_cast(const TensorView& a, const TensorView& out);
/// Reduction over everything (all) or one axis; out is contiguous.
void reduce(ReduceOp op, const TensorView& a, bool all, int axis, const TensorView& out);
/// C = A x B, float32/float64, 2-D or batched 3-D, through oneDNN (float32,
/// once prepare_matmul has run) or CBLAS; C contiguous, A and B as
/// gemm_layout (shape.hpp) finds them usable.
void matmul(const TensorView& a, const TensorView& b, const TensorView& out);
/// Makes the float32 product's library ready (oneDNN's first call, which
/// makes its kernels: about 50 ms, once per process) on the calling thread
/// and registers the engine's exit handler again after it (see
/// linalg.cpp). Products that run before it, or whose first call would be
/// during exit, go through CBLAS.
void prepare_matmul(DType t);
/// Runs `steps` over the elements of `domain` in cache-sized tiles, each
/// step through the same kernel as the unfused op (so the results are bit
/// for bit the same), in parallel over tiles. `inputs` broadcast to
/// `domain`; outputs[i] is step i's contiguous result of shape `domain`, or
/// has null data when nobody reads it (it then lives in a tile's scratch).
void fused(std::span<const FusedStep> steps, std::span<const TensorView> inputs,
           std::span<const TensorView> outputs, const Shape& domain);
/// One Adam step (PyTorch's rule) over n contiguous float32 or float64
/// elements of parameter p, moments m and v, gradient g: with `decoupled`,
/// p *= shrink first, else g + weight_decay p is the gradient; then
/// m = b1 m + (1 - b1) d, v = b2 v + (1 - b2) d^2 and
/// p -= step m / (sqrt(v) rbc2 + eps). Vectorised, in parallel chunks.
struct AdamStep {
  double beta1, beta2, eps, weight_decay, step, rbc2, shrink;
  bool decoupled;
};
void adam_step(DType t, void* p, void* m, void* v, const void* g, std::int64_t n, const AdamStep& a);
/// One SGD step (PyTorch's rule) over n contiguous float32 or float64
/// elements: d = g + weight_decay p; with momentum buffer b (null: none),
/// b = first ? d : momentum b + damp d, then d = nesterov ? d + momentum b
/// : b; p -= lr d. Vectorised, in parallel chunks.
struct SgdStep {
  double lr, weight_decay, momentum, damp;
  bool nesterov, first;
};
void sgd_step(DType t, void* p, void* b, const void* g, std::int64_t n, const SgdStep& a);
/// Fills a contiguous buffer.
void fill(const TensorView& out, double value);
void arange(const TensorView& out, double start, double step);
/// Counter-based: element i depends only on (seed, i), never on threads.
void random_uniform(const TensorView& out, std::uint64_t seed, double low, double high);
void random_normal(const TensorView& out, std::uint64_t seed, double mean, double stddev);

}  // namespace cpu

// Device-generic entry points, called from inside a recorded node with its
// RunContext: the CPU kernels run on the CPU and on the emulated `sim`
// device (in stream order on its executor); on a gpu the CUDA kernels are
// enqueued on ctx.stream. Same semantics everywhere, except where the CUDA
// kernels say otherwise (integer division by zero cannot throw on a GPU).
void unary(const engine::RunContext& ctx, UnaryOp op, const TensorView& a, const TensorView& out);
void binary(const engine::RunContext& ctx, BinaryOp op, const TensorView& a, const TensorView& b,
            const TensorView& out);
void binary_scalar(const engine::RunContext& ctx, BinaryOp op, const TensorView& a, double scalar,
                   bool scalar_first, const TensorView& out);
void compare(const engine::RunContext& ctx, CompareOp op, const TensorView& a, const TensorView& b,
             const TensorView& out);
void compare_scalar(const engine::RunContext& ctx, CompareOp op, const TensorView& a, double scalar,
                    const TensorView& out);
void where(const engine::RunContext& ctx, const TensorView& cond, const TensorView& a,
           const TensorView& b, const TensorView& out);
void copy_cast(const engine::RunContext& ctx, const TensorView& a, const TensorView& out);
void reduce(const engine::RunContext& ctx, ReduceOp op, const TensorView& a, bool all, int axis,
            const TensorView& out);
void matmul(const engine::RunContext& ctx, const TensorView& a, const TensorView& b,
            const TensorView& out);
/// Called when a product of dtype t on device `dev` is recorded, before it
/// is pushed: readies the CPU product's library (cpu::prepare_matmul) on the
/// recording thread, never inside a running node.
void prepare_matmul(DType t, bool on_gpu);
/// A fused elementwise program (cpu::fused): on a gpu one kernel whose
/// threads run every step for their elements in registers, each step
/// through the unfused kernel's element function.
void fused(const engine::RunContext& ctx, std::span<const FusedStep> steps, std::span<const TensorView> inputs,
           std::span<const TensorView> outputs, const Shape& domain);
void fill(const engine::RunContext& ctx, const TensorView& out, double value);
void arange(const engine::RunContext& ctx, const TensorView& out, double start, double step);
void random_uniform(const engine::RunContext& ctx, const TensorView& out, std::uint64_t seed,
                    double low, double high);
void random_normal(const engine::RunContext& ctx, const TensorView& out, std::uint64_t seed,
                   double mean, double stddev);

/// Byte copies on the node's stream device, in stream order. Host memory
/// is pageable: it goes through the device's pinned staging pool.
/// host -> this device:
void copy_from_host(const engine::RunContext& ctx, void* dst, const void* host_src, std::size_t bytes);
/// this device -> pinned staging memory (from StreamDevice::allocate_host):
void copy_to_staging(const engine::RunContext& ctx, void* staging, const void* src, std::size_t bytes);
/// another device of the same kind -> this device:
void copy_peer(const engine::RunContext& ctx, void* dst, const void* src, engine::Device src_device,
               std::size_t bytes);

/// The CUDA kernels (ops/cuda/*.cu), each enqueued on `stream` (a
/// cudaStream_t) of the current device. In a build without CUDA they throw
/// BackendUnavailable.
namespace cuda {
void unary(void* stream, UnaryOp op, const TensorView& a, const TensorView& out);
void binary(void* stream, BinaryOp op, const TensorView& a, const TensorView& b, const TensorView& out);
void binary_scalar(void* stream, BinaryOp op, const TensorView& a, double scalar, bool scalar_first,
                   const TensorView& out);
void compare(void* stream, CompareOp op, const TensorView& a, const TensorView& b, const TensorView& out);
void compare_scalar(void* stream, CompareOp op, const TensorView& a, double scalar, const TensorView& out);
void where(void* stream, const TensorView& cond, const TensorView& a, const TensorView& b,
           const TensorView& out);
void copy_cast(void* stream, const TensorView& a, const TensorView& out);
void reduce(void* stream, ReduceOp op, const TensorView& a, bool all, int axis, const TensorView& out);
/// cuBLAS (a handle per stream), row-major via the transposed product.
/// cuBLAS is loaded by the first call (see load_blas), not at process start.
void matmul(void* stream, const TensorView& a, const TensorView& b, const TensorView& out);
/// At most 32 steps and 16 inputs (the frontend's group limits).
void fused(void* stream, std::span<const FusedStep> steps, std::span<const TensorView> inputs,
           std::span<const TensorView> outputs, const Shape& domain);
void fill(void* stream, const TensorView& out, double value);
void arange(void* stream, const TensorView& out, double start, double step);
/// The same counter-based generator as the CPU's: identical values for a
/// seed and shape (up to the last bit of libm's log/cos in random_normal).
void random_uniform(void* stream, const TensorView& out, std::uint64_t seed, double low, double high);
void random_normal(void* stream, const TensorView& out, std::uint64_t seed, double mean, double stddev);
/// cudaMemcpyAsync; kind as cudaMemcpyKind (1 host->device, 2 device->host, 3 device->device).
void memcpy_async(void* stream, void* dst, const void* src, std::size_t bytes, int kind);
void memcpy_peer_async(void* stream, void* dst, int dst_device, const void* src, int src_device,
                       std::size_t bytes);
/// Loads cuBLAS if no GPU matmul has yet (it needs no GPU) and returns the
/// path of the library loaded; throws BackendUnavailable when it cannot be
/// loaded or lacks an entry point the matmul calls.
std::string load_blas();
}  // namespace cuda

}  // namespace lazydag::ops
