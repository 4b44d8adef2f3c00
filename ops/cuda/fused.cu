// The CUDA interpreter of fused elementwise programs (the CPU's is
// ops/cpu/fused.cpp). One launch for the whole program: each thread takes
// elements of the domain (grid-stride), loads the external inputs it needs
// once, runs the steps in order, each through the element function of the
// unfused kernel (element_ops.cuh, so a fused result is bit for bit the
// separate kernels'), and stores only the results someone holds. The other
// step results never leave the thread.
//
// The program travels as the kernel's parameter block (under 3 KiB of the
// 4 KiB CUDA allows): the steps, the inputs' pointers and dtypes, and their
// strides broadcast to the domain over the merged loop nest the per-op
// kernels use (../src/indexer.hpp), so a dense program needs no division
// and a broadcast one no 64-bit division.
#include "common.cuh"
#include "element_ops.cuh"

#include <cstring>
#include <string>

namespace lazydag::ops::cuda {

namespace {

constexpr int kMaxSteps = 32;   // the frontend's group limits (frontend/src/fusion.cpp)
constexpr int kMaxInputs = 16;

struct Step {
  std::uint8_t kind;
  std::uint8_t op;
  bool scalar_first;
  DType dtype;
  std::uint8_t num_in;
  std::int32_t in[3];
  double scalar;
};

struct Program {
  int num_steps = 0;
  int num_inputs = 0;
  Step steps[kMaxSteps];
  const void* in[kMaxInputs] = {};
  DType in_type[kMaxInputs] = {};
  void* out[kMaxSteps] = {};  // null: the result is not kept
  detail::Indexer<kMaxInputs> ix;
};

// A value of any element type in 8 bytes.
using Slot = std::uint64_t;

template <class T>
__device__ __forceinline__ T get(Slot s) {
  T v;
  memcpy(&v, &s, sizeof(T));
  return v;
}
template <class T>
__device__ __forceinline__ Slot put(T v) {
  Slot s = 0;
  memcpy(&s, &v, sizeof(T));
  return s;
}

// Runs BODY with T bound to the element type of `t`.
#define LAZYDAG_FUSED_DISPATCH(t, T, ...)     \
  switch (t) {                                \
    case DType::kFloat32: {                   \
      using T = float;                        \
      __VA_ARGS__;                            \
    } break;                                  \
    case DType::kFloat64: {                   \
      using T = double;                       \
      __VA_ARGS__;                            \
    } break;                                  \
    case DType::kInt32: {                     \
      using T = std::int32_t;                 \
      __VA_ARGS__;                            \
    } break;                                  \
    case DType::kInt64: {                     \
      using T = std::int64_t;                 \
      __VA_ARGS__;                            \
    } break;                                  \
    case DType::kBool: {                      \
      using T = bool;                         \
      __VA_ARGS__;                            \
    } break;                                  \
  }

__device__ Slot run_step(const Step& s, Slot a, Slot b, Slot c, DType a_type) {
  Slot r = 0;
  switch (static_cast<FusedStep::Kind>(s.kind)) {
    case FusedStep::Kind::kUnary:
      LAZYDAG_FUSED_DISPATCH(s.dtype, T, r = put<T>(detail::apply_unary<T>(static_cast<UnaryOp>(s.op), get<T>(a))))
      break;
    case FusedStep::Kind::kBinary:
      LAZYDAG_FUSED_DISPATCH(s.dtype, T,
                             r = put<T>(detail::apply_binary<T>(static_cast<BinaryOp>(s.op), get<T>(a), get<T>(b))))
      break;
    case FusedStep::Kind::kScalar:
      LAZYDAG_FUSED_DISPATCH(s.dtype, T, {
        const T k = detail::convert_value<T>(s.scalar);
        const auto op = static_cast<BinaryOp>(s.op);
        r = put<T>(s.scalar_first ? detail::apply_binary<T>(op, k, get<T>(a)) : detail::apply_binary<T>(op, get<T>(a), k));
      })
      break;
    case FusedStep::Kind::kCompare:
      LAZYDAG_FUSED_DISPATCH(a_type, T,
                             r = put<bool>(ops::detail::apply_compare(static_cast<CompareOp>(s.op), get<T>(a), get<T>(b))))
      break;
    case FusedStep::Kind::kCompareScalar:
      LAZYDAG_FUSED_DISPATCH(a_type, T,
                             r = put<bool>(ops::detail::apply_compare(static_cast<CompareOp>(s.op), get<T>(a),
                                                                      detail::convert_value<T>(s.scalar))))
      break;
    case FusedStep::Kind::kWhere:
      LAZYDAG_FUSED_DISPATCH(s.dtype, T, r = put<T>(get<bool>(a) ? get<T>(b) : get<T>(c)))
      break;
    case FusedStep::Kind::kCast:
      LAZYDAG_FUSED_DISPATCH(a_type, S, {
        LAZYDAG_FUSED_DISPATCH(s.dtype, D, r = put<D>(detail::convert_value<D>(get<S>(a))))
      })
      break;
  }
  return r;
}

__device__ Slot load(const void* p, DType t, std::int64_t i) {
  Slot r = 0;
  LAZYDAG_FUSED_DISPATCH(t, T, r = put<T>(static_cast<const T*>(p)[i]))
  return r;
}

__device__ void store(void* p, DType t, std::int64_t i, Slot v) {
  LAZYDAG_FUSED_DISPATCH(t, T, static_cast<T*>(p)[i] = get<T>(v))
}

__global__ void fused_kernel(const Program p, std::int64_t n) {
  Slot ext[kMaxInputs];
  Slot val[kMaxSteps];
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(blockDim.x) * gridDim.x) {
    // The inputs' element offsets for the domain's row-major index i.
    std::int64_t off[kMaxInputs];
    p.ix.offsets(i, off, p.num_inputs);
    for (int k = 0; k < p.num_inputs; ++k) ext[k] = load(p.in[k], p.in_type[k], off[k]);
    for (int s = 0; s < p.num_steps; ++s) {
      const Step& st = p.steps[s];
      Slot operand[3] = {0, 0, 0};
      DType a_type = st.dtype;
      for (int j = 0; j < st.num_in; ++j) {
        const std::int32_t r = st.in[j];
        operand[j] = r >= 0 ? val[r] : ext[-1 - r];
        if (j == 0) a_type = r >= 0 ? p.steps[r].dtype : p.in_type[-1 - r];
      }
      val[s] = run_step(st, operand[0], operand[1], operand[2], a_type);
      if (p.out[s] != nullptr) store(p.out[s], st.dtype, i, val[s]);
    }
  }
}

#undef LAZYDAG_FUSED_DISPATCH

}  // namespace

void fused(void* stream, std::span<const FusedStep> steps, std::span<const TensorView> inputs,
           std::span<const TensorView> outputs, const Shape& domain) {
  if (steps.size() > static_cast<std::size_t>(kMaxSteps) || inputs.size() > static_cast<std::size_t>(kMaxInputs) ||
      outputs.size() != steps.size()) {
    throw InvalidArgument("fused kernel: " + std::to_string(steps.size()) + " steps and " +
                          std::to_string(inputs.size()) + " inputs (at most " + std::to_string(kMaxSteps) +
                          " and " + std::to_string(kMaxInputs) + ", one output per step)");
  }
  const std::int64_t n = numel(domain);
  if (n == 0) return;
  Program p;
  p.num_steps = static_cast<int>(steps.size());
  p.num_inputs = static_cast<int>(inputs.size());
  for (std::size_t s = 0; s < steps.size(); ++s) {
    const FusedStep& f = steps[s];
    Step& t = p.steps[s];
    t.kind = static_cast<std::uint8_t>(f.kind);
    t.op = f.op;
    t.scalar_first = f.scalar_first;
    t.dtype = f.dtype;
    t.num_in = f.num_in;
    for (std::size_t j = 0; j < 3; ++j) t.in[j] = f.in[j];
    t.scalar = f.scalar;
    p.out[s] = outputs[s].data;  // contiguous over the domain, or null
  }
  // Unused operand slots broadcast a single element: they never limit the
  // merging of the loop nest.
  TensorView none;
  none.shape = Shape{1};
  none.strides = Strides{0};
  const TensorView* views[kMaxInputs];
  for (int k = 0; k < kMaxInputs; ++k) {
    const bool used = k < p.num_inputs;
    views[k] = used ? &inputs[static_cast<std::size_t>(k)] : &none;
    if (used) {
      p.in[k] = inputs[static_cast<std::size_t>(k)].data;
      p.in_type[k] = inputs[static_cast<std::size_t>(k)].dtype;
    }
  }
  p.ix = detail::make_indexer<kMaxInputs>(views, domain);
  static_assert(sizeof(Program) <= 4096, "a kernel's parameters are limited to 4 KiB");
  detail::clear_last_error();
  fused_kernel<<<detail::blocks_for(n), 256, 0, detail::as_stream(stream)>>>(p, n);
  detail::check_launch("fused kernel");
}

}  // namespace lazydag::ops::cuda
