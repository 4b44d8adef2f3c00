// CUDA matmul through cuBLAS on the node's stream. Row-major C = A x B is
// the column-major product C^T = B^T x A^T, so row-major operands need no
// transposes and transposed views are read with CUBLAS_OP_T.
// One cuBLAS handle per stream (see handle_for): creating one per call costs
// far more than a launch.
//
// cuBLAS is loaded by the first GPU matmul, not linked: linked, libcublasLt's
// initialisers ran in every process at start, GPU or not (docs/devices.md:
// docs/examples/embed ran in 0.53-0.56 s with 26,500 page faults instead
// of 0.02 s with 720, and perf put 72% of a small program's samples in
// the loader's call_init).
#include "common.cuh"

#include <lazydag/ops/shape.hpp>

#include <cublas_v2.h>
#include <dlfcn.h>

#include <map>
#include <mutex>
#include <string>
#include <type_traits>

namespace lazydag::ops::cuda {

namespace {

// The cuBLAS entry points the matmul uses, with the types of their
// declarations in cublas_v2.h (the _v2 names are what its macros call).
struct Cublas {
  std::string path;
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSgemmStridedBatched) sgemm = nullptr;
  decltype(&cublasDgemmStridedBatched) dgemm = nullptr;
  decltype(&cublasGetStatusName) status_name = nullptr;
  decltype(&cublasGetStatusString) status_string = nullptr;
};

// The cuBLAS of the headers' major version: by its soname (the loader's
// search: LD_LIBRARY_PATH, the cache, this library's runpath), else beside
// the CUDA runtime this library runs with. Never unloaded.
Cublas load_cublas() {
  const std::string soname = "libcublas.so." + std::to_string(CUBLAS_VER_MAJOR);
  void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
  std::string why;
  auto error = [] {
    const char* e = dlerror();
    return std::string(e != nullptr ? e : "unknown dlopen error");
  };
  if (lib == nullptr) {
    why = error();
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(&cudaGetDevice), &info) != 0 && info.dli_fname != nullptr) {
      std::string beside = info.dli_fname;
      beside = beside.substr(0, beside.find_last_of('/') + 1) + soname;
      lib = dlopen(beside.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (lib == nullptr) why += "; " + error();
    }
  }
  if (lib == nullptr) throw BackendUnavailable("matmul on a gpu device needs cuBLAS: " + why);
  Cublas api;
  char resolved[4096] = {};
  api.path = dlinfo(lib, RTLD_DI_ORIGIN, resolved) == 0 ? std::string(resolved) + "/" + soname : soname;
  auto sym = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(lib, name));
    if (fn == nullptr) throw BackendUnavailable(api.path + " has no " + name + " (cuBLAS too old for these headers?)");
  };
  sym(api.create, "cublasCreate_v2");
  sym(api.set_stream, "cublasSetStream_v2");
  sym(api.destroy, "cublasDestroy_v2");
  sym(api.sgemm, "cublasSgemmStridedBatched");
  sym(api.dgemm, "cublasDgemmStridedBatched");
  sym(api.status_name, "cublasGetStatusName");
  sym(api.status_string, "cublasGetStatusString");
  return api;
}

// Loaded once; a failed load throws and is tried again by the next call.
const Cublas& cublas() {
  static const Cublas api = load_cublas();
  return api;
}

void check_cublas(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) {
    const Cublas& b = cublas();
    throw CudaError(static_cast<int>(st),
                    std::string(what) + " failed: " + b.status_name(st) + " (" + b.status_string(st) + ")",
                    CudaError::Library::kCublas);
  }
}

// One handle per (device, stream), shared by every thread: the engine
// launches a stream's work under that stream's launch lock, so a handle is
// never used by two threads at once, and it is bound to its stream once
// (cuBLAS allows a handle on several threads when its configuration does not
// change). Per thread and stream, a 16-worker engine with 4 streams per
// device held 64 handles, each with its own workspace. Handles live until
// the process ends (a stream's address may be reused by a later stream,
// which then gets the handle bound to that same value).
cublasHandle_t handle_for(cudaStream_t stream) {
  static std::mutex mu;
  static std::map<std::pair<int, cudaStream_t>, cublasHandle_t> handles;
  int device = 0;
  LAZYDAG_CUDA_CHECK(cudaGetDevice(&device), "matmul");
  std::lock_guard lk(mu);
  auto it = handles.find({device, stream});
  if (it != handles.end()) return it->second;
  // Cached only once it is bound to the stream: a failed create or set
  // leaves no null handle, and no handle on the legacy stream, behind.
  const Cublas& b = cublas();
  cublasHandle_t h = nullptr;
  check_cublas(b.create(&h), "cublasCreate");
  const cublasStatus_t st = b.set_stream(h, stream);
  if (st != CUBLAS_STATUS_SUCCESS) {
    (void)b.destroy(h);
    check_cublas(st, "cublasSetStream");
  }
  handles.emplace(std::pair{device, stream}, h);
  return h;
}

}  // namespace

std::string load_blas() { return cublas().path; }

void matmul(void* stream, const TensorView& a, const TensorView& b, const TensorView& out) {
  const bool batched = a.shape.size() == 3;
  const std::int64_t batch = batched ? a.shape[0] : 1;
  const std::int64_t m = a.shape[batched ? 1 : 0];
  const std::int64_t k = a.shape[batched ? 2 : 1];
  const std::int64_t n = b.shape[batched ? 2 : 1];
  if (m == 0 || n == 0 || batch == 0) return;
  cudaStream_t s = detail::as_stream(stream);
  if (k == 0) {
    fill(stream, out, 0.0);
    return;
  }
  cublasHandle_t h = handle_for(s);
  // Operands in place as gemm_layout describes them (the frontend copied
  // the others): a row-major operand is its column-major transpose, so a
  // transposed view is read with CUBLAS_OP_T instead of being copied.
  const GemmLayout la = gemm_layout(a.shape, a.strides);
  const GemmLayout lb = gemm_layout(b.shape, b.strides);
  if (!la.usable || !lb.usable) throw InvalidArgument("matmul: an operand cuBLAS cannot read in place");
  const cublasOperation_t op_a = la.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = lb.trans ? CUBLAS_OP_T : CUBLAS_OP_N;
  // matmul_shape refuses dims above INT_MAX at record time (the BLAS limit),
  // gemm_layout leading dimensions above it.
  const int M = static_cast<int>(m);
  const int N = static_cast<int>(n);
  const int K = static_cast<int>(k);
  const int lda = static_cast<int>(la.ld);
  const int ldb = static_cast<int>(lb.ld);
  if (a.dtype == DType::kFloat32) {
    const float one = 1.0F;
    const float zero = 0.0F;
    const float* pa = static_cast<const float*>(a.data) + a.offset;
    const float* pb = static_cast<const float*>(b.data) + b.offset;
    float* pc = static_cast<float*>(out.data) + out.offset;
    check_cublas(cublas().sgemm(h, op_b, op_a, N, M, K, &one, pb, ldb, lb.batch_stride, pa, lda,
                                           la.batch_stride, &zero, pc, N, m * n, static_cast<int>(batch)),
                 "cublasSgemmStridedBatched");
  } else {
    const double one = 1.0;
    const double zero = 0.0;
    const double* pa = static_cast<const double*>(a.data) + a.offset;
    const double* pb = static_cast<const double*>(b.data) + b.offset;
    double* pc = static_cast<double*>(out.data) + out.offset;
    check_cublas(cublas().dgemm(h, op_b, op_a, N, M, K, &one, pb, ldb, lb.batch_stride, pa, lda,
                                           la.batch_stride, &zero, pc, N, m * n, static_cast<int>(batch)),
                 "cublasDgemmStridedBatched");
  }
}

}  // namespace lazydag::ops::cuda
