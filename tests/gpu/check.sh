#!/usr/bin/env bash
# The GPU check: on a fresh GPU machine, builds lazydag from scratch with
# CUDA, runs the gpu suite and the NDArray suites with every array on gpu(0),
# then the GPU benchmark; prints a summary table last. Meant to finish in
# under 5 minutes on a 16-core machine. Packages the machine lacks are taken
# from .gpu-deps/*.deb (see fetch-deps.sh) and unpacked into a private root.
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

declare -A result
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
for k in "${!result[@]}"; do printf '%-24s exit %s\n' "$k" "${result[$k]}"; done | sort
awk '/^figure/{p=1} p' "$OUT_DIR/bench_gpu.log"
