// Device dispatch of the kernels: the CPU kernels on the CPU and on the
// emulated sim device, the CUDA kernels on a gpu's stream.
#include <lazydag/engine/stream.hpp>
#include <lazydag/ops/kernels.hpp>

#include <cstring>

namespace lazydag::ops {

namespace {
bool on_gpu(const engine::RunContext& ctx) { return ctx.device.kind == engine::DeviceKind::kGpu; }
}  // namespace

void unary(const engine::RunContext& ctx, UnaryOp op, const TensorView& a, const TensorView& out) {
  on_gpu(ctx) ? cuda::unary(ctx.stream, op, a, out) : cpu::unary(op, a, out);
}
void binary(const engine::RunContext& ctx, BinaryOp op, const TensorView& a, const TensorView& b,
            const TensorView& out) {
  on_gpu(ctx) ? cuda::binary(ctx.stream, op, a, b, out) : cpu::binary(op, a, b, out);
}
void binary_scalar(const engine::RunContext& ctx, BinaryOp op, const TensorView& a, double scalar,
                   bool scalar_first, const TensorView& out) {
  on_gpu(ctx) ? cuda::binary_scalar(ctx.stream, op, a, scalar, scalar_first, out)
              : cpu::binary_scalar(op, a, scalar, scalar_first, out);
}
void compare(const engine::RunContext& ctx, CompareOp op, const TensorView& a, const TensorView& b,
             const TensorView& out) {
  on_gpu(ctx) ? cuda::compare(ctx.stream, op, a, b, out) : cpu::compare(op, a, b, out);
}
void compare_scalar(const engine::RunContext& ctx, CompareOp op, const TensorView& a, double scalar,
                    const TensorView& out) {
  on_gpu(ctx) ? cuda::compare_scalar(ctx.stream, op, a, scalar, out)
              : cpu::compare_scalar(op, a, scalar, out);
}
void where(const engine::RunContext& ctx, const TensorView& cond, const TensorView& a,
           const TensorView& b, const TensorView& out) {
  on_gpu(ctx) ? cuda::where(ctx.stream, cond, a, b, out) : cpu::where(cond, a, b, out);
}
void copy_cast(const engine::RunContext& ctx, const TensorView& a, const TensorView& out) {
  on_gpu(ctx) ? cuda::copy_cast(ctx.stream, a, out) : cpu::copy_cast(a, out);
}
void reduce(const engine::RunContext& ctx, ReduceOp op, const TensorView& a, bool all, int axis,
            const TensorView& out) {
  on_gpu(ctx) ? cuda::reduce(ctx.stream, op, a, all, axis, out) : cpu::reduce(op, a, all, axis, out);
}
void matmul(const engine::RunContext& ctx, const TensorView& a, const TensorView& b,
            const TensorView& out) {
  on_gpu(ctx) ? cuda::matmul(ctx.stream, a, b, out) : cpu::matmul(a, b, out);
}
void prepare_matmul(DType t, bool on_gpu) {
  if (!on_gpu) cpu::prepare_matmul(t);
}
void fused(const engine::RunContext& ctx, std::span<const FusedStep> steps, std::span<const TensorView> inputs,
           std::span<const TensorView> outputs, const Shape& domain) {
  on_gpu(ctx) ? cuda::fused(ctx.stream, steps, inputs, outputs, domain) : cpu::fused(steps, inputs, outputs, domain);
}
void fill(const engine::RunContext& ctx, const TensorView& out, double value) {
  on_gpu(ctx) ? cuda::fill(ctx.stream, out, value) : cpu::fill(out, value);
}
void arange(const engine::RunContext& ctx, const TensorView& out, double start, double step) {
  on_gpu(ctx) ? cuda::arange(ctx.stream, out, start, step) : cpu::arange(out, start, step);
}
void random_uniform(const engine::RunContext& ctx, const TensorView& out, std::uint64_t seed,
                    double low, double high) {
  on_gpu(ctx) ? cuda::random_uniform(ctx.stream, out, seed, low, high)
              : cpu::random_uniform(out, seed, low, high);
}
void random_normal(const engine::RunContext& ctx, const TensorView& out, std::uint64_t seed,
                   double mean, double stddev) {
  on_gpu(ctx) ? cuda::random_normal(ctx.stream, out, seed, mean, stddev)
              : cpu::random_normal(out, seed, mean, stddev);
}

// On the sim device these run on the stream's executor, in stream order, so
// a plain memcpy is the whole copy. On a gpu the host source is first copied
// into pinned staging memory, which goes back to the pool ordered after the
// transfer on the stream.
void copy_from_host(const engine::RunContext& ctx, void* dst, const void* host_src, std::size_t bytes) {
  if (bytes == 0) return;
  if (!on_gpu(ctx)) {
    std::memcpy(dst, host_src, bytes);
    return;
  }
  void* staging = ctx.stream_device->allocate_host(bytes);
  std::memcpy(staging, host_src, bytes);
  try {
    cuda::memcpy_async(ctx.stream, dst, staging, bytes, 1);
  } catch (...) {
    ctx.stream_device->release_host(staging, bytes, ctx.stream);
    throw;
  }
  ctx.stream_device->release_host(staging, bytes, ctx.stream);
}

void copy_to_staging(const engine::RunContext& ctx, void* staging, const void* src, std::size_t bytes) {
  if (bytes == 0) return;
  if (!on_gpu(ctx)) {
    std::memcpy(staging, src, bytes);
    return;
  }
  cuda::memcpy_async(ctx.stream, staging, src, bytes, 2);
}

void copy_peer(const engine::RunContext& ctx, void* dst, const void* src, engine::Device src_device,
               std::size_t bytes) {
  if (bytes == 0) return;
  if (!on_gpu(ctx)) {
    std::memcpy(dst, src, bytes);
    return;
  }
  cuda::memcpy_peer_async(ctx.stream, dst, ctx.device.id, src, src_device.id, bytes);
}

}  // namespace lazydag::ops
