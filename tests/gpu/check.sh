#!/usr/bin/env bash
# The GPU check: on a fresh GPU machine, runs the CUDA runtime probe, builds
# lazydag from scratch with CUDA, runs the gpu suite and the NDArray suites
# with every array on gpu(0), then the GPU benchmark; prints a summary table
# last and exits non-zero when anything failed (no usable GPU included).
# Meant to finish in under 5 minutes on a 16-core machine.
#
# Packages the machine lacks are taken from .gpu-deps/*.deb (made by
# tests/gpu/fetch-deps.sh) and unpacked into a private root. .gpu-deps/ is
# ignored by git: it reaches a GPU machine only when the copy of the tree
# sent there names it explicitly (the remote runner's `carry`).
#   tests/gpu/check.sh [output-dir]
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT_DIR=${1:-${OUT:-/tmp/lazydag-gpu-check}}
mkdir -p "$OUT_DIR"
BUILD=build-gpu-check
start=$(date +%s)
export PATH="/usr/local/cuda/bin:$PATH"

if ls .gpu-deps/*.deb >/dev/null 2>&1; then
  ROOT=/tmp/lazydag-deps
  mkdir -p "$ROOT"
  for f in .gpu-deps/*.deb; do dpkg-deb -x "$f" "$ROOT"; done
  LIB="$ROOT/usr/lib/x86_64-linux-gnu"
  export PATH="$PATH:$ROOT/usr/bin"  # pkg-config, when the image lacks it
  # The .pc files say prefix=/usr: the sysroot maps their paths into ROOT.
  export PKG_CONFIG_SYSROOT_DIR="$ROOT"
  export PKG_CONFIG_PATH="$LIB/pkgconfig:$LIB/openblas-pthread/pkgconfig:${PKG_CONFIG_PATH:-}"
  # C(PLUS)_INCLUDE_PATH, not CPATH: these act as -isystem, so the
  # packages' headers get the warnings of system headers (the build has
  # -Wundef -Werror), as they do when installed under /usr.
  inc="$ROOT/usr/include:$ROOT/usr/include/x86_64-linux-gnu/openblas-pthread"
  export CPLUS_INCLUDE_PATH="$inc${CPLUS_INCLUDE_PATH:+:$CPLUS_INCLUDE_PATH}"
  export C_INCLUDE_PATH="$inc${C_INCLUDE_PATH:+:$C_INCLUDE_PATH}"
  export LIBRARY_PATH="$LIB:$LIB/openblas-pthread:${LIBRARY_PATH:-}"
  export LD_LIBRARY_PATH="$LIB:$LIB/openblas-pthread:${LD_LIBRARY_PATH:-}"
  export BOOST_INCLUDEDIR="$ROOT/usr/include" BOOST_LIBRARYDIR="$LIB"
  export CMAKE_PREFIX_PATH="$ROOT/usr:${CMAKE_PREFIX_PATH:-}"
  ln -sf openblas-pthread/libopenblas.so.0 "$LIB/libopenblas.so.0" 2>/dev/null || true
  ln -sf openblas-pthread/libblas.so.3 "$LIB/libblas.so.3" 2>/dev/null || true
fi

declare -A result
# What the build needs from the image itself (CUDA is not fetched): say
# exactly what is missing instead of failing somewhere in the build.
missing=()
command -v nvcc >/dev/null || missing+=("nvcc (the CUDA toolkit)")
CUDA_INC=$(dirname "$(dirname "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")/include
[ -f "$CUDA_INC/cublas_v2.h" ] || missing+=("cuBLAS headers ($CUDA_INC/cublas_v2.h)")
# CUDA 13 keeps CUB under include/cccl (nvcc searches it), older ones under include
[ -f "$CUDA_INC/cub/cub.cuh" ] || [ -f "$CUDA_INC/cccl/cub/cub.cuh" ] ||
  missing+=("CUB headers ($CUDA_INC/cub/cub.cuh or $CUDA_INC/cccl/cub/cub.cuh)")
command -v pkg-config >/dev/null || missing+=("pkg-config (fetch-deps.sh fetches it)")
for tool in meson ninja g++; do command -v $tool >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -ne 0 ]; then
  printf 'missing: %s\n' "${missing[@]}"
  exit 1
fi

echo "== CUDA runtime probe"
if nvcc -O2 -std=c++17 -arch=native tests/cuda/cuda_runtime_probe.cu -o "$OUT_DIR/cuda_runtime_probe" \
     >"$OUT_DIR/probe_build.log" 2>&1; then
  timeout 60 "$OUT_DIR/cuda_runtime_probe" 2>&1 | tee "$OUT_DIR/probe.log"
  result[probe]=${PIPESTATUS[0]}
else
  tail -20 "$OUT_DIR/probe_build.log"
  result[probe]=build-failed
fi

echo "== configure and build ($(nproc) cores)"
# -Dwerror=false: another compiler's new warnings must not cost the check;
# CI builds with -Werror.
rm -rf "$BUILD"
if ! meson setup "$BUILD" -Dcuda=enabled -Dbuildtype=release -Dexamples=false -Dwerror=false >"$OUT_DIR/configure.log" 2>&1; then
  tail -40 "$OUT_DIR/configure.log"
  exit 1
fi
if ! ninja -C "$BUILD" >"$OUT_DIR/build.log" 2>&1; then
  grep -E "error|Error" -A3 "$OUT_DIR/build.log" | head -60
  exit 1
fi
echo "build: $(( $(date +%s) - start )) s"

echo "== gpu suite"
LAZYDAG_WATCHDOG=60 timeout 120 "$BUILD/tests/test_gpu" --no-intro --duration=true 2>&1 | tee "$OUT_DIR/gpu_suite.log" | tail -25
result[gpu_suite]=${PIPESTATUS[0]}

echo "== NDArray suites with every array on gpu(0)"
[ "${result[gpu_suite]}" = 77 ] && echo "(no usable device: skipped)"
for t in elementwise reduce_linalg arrays observe devices; do
  [ "${result[gpu_suite]}" = 77 ] && break
  LAZYDAG_DEFAULT_DEVICE='gpu(0)' LAZYDAG_ENGINE=eager LAZYDAG_WATCHDOG=60 timeout 120 \
    "$BUILD/tests/test_ndarray_$t" --no-intro >"$OUT_DIR/ndarray_$t.log" 2>&1
  result[ndarray_$t]=$?
  grep -E "ERROR|test cases" "$OUT_DIR/ndarray_$t.log" | head -8
done

echo "== gpu benchmark"
LAZYDAG_ENGINE=eager timeout 150 "$BUILD/tests/bench/bench_gpu" 2>&1 | tee "$OUT_DIR/bench_gpu.log"
result[bench]=${PIPESTATUS[0]}

# The gpu suite again under compute-sanitizer's memcheck (out-of-bounds and
# misaligned accesses in the kernels and copies), when the
# machine has it and the check still has time; some runtimes refuse it.
if [ "${result[gpu_suite]}" != 77 ] && command -v compute-sanitizer >/dev/null &&
   [ $(( $(date +%s) - start )) -lt 200 ]; then
  echo "== gpu suite under compute-sanitizer memcheck"
  LAZYDAG_WATCHDOG=60 timeout 90 compute-sanitizer --tool memcheck --error-exitcode 3 \
    "$BUILD/tests/test_gpu" --no-intro >"$OUT_DIR/memcheck.log" 2>&1
  result[memcheck]=$?
  grep -E "ERROR SUMMARY|Invalid|test cases|not supported" "$OUT_DIR/memcheck.log" | head -12
fi

echo
echo "== summary ($(( $(date +%s) - start )) s)"
[ "${result[gpu_suite]}" = 77 ] && echo "gpu_suite exit 77: no usable CUDA device (the check checked nothing)"
failed=0
for k in "${!result[@]}"; do
  printf '%-24s exit %s\n' "$k" "${result[$k]}"
done | sort
for k in "${!result[@]}"; do [ "${result[$k]}" = 0 ] || failed=1; done
[ -f "$OUT_DIR/probe.log" ] && sed 's/^/probe: /' "$OUT_DIR/probe.log"
awk '/^figure/{p=1} p' "$OUT_DIR/bench_gpu.log"
if [ "$failed" = 0 ]; then echo "check: all passed"; else echo "check: FAILED"; fi
exit "$failed"
