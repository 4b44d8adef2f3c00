#!/usr/bin/env bash
# Builds and runs one consumer project against this build of lazydag:
#   run.sh pkgconfig|cmake|subproject BUILD_DIR SOURCE_DIR PREFIX LIBDIR
# pkgconfig and cmake use a DESTDIR install of BUILD_DIR; subproject copies
# the source tree into the consumer's subprojects/ (no build directories).
set -euo pipefail
kind=$1 build=$(realpath "$2") src=$(realpath "$3") prefix=$4 libdir=$5
here=$src/tests/consumers
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
stage=$tmp/stage
# The consumer project and its program, copied where they build.
project_copy() {
  mkdir -p "$tmp/p"
  cp "$here/$1"/* "$here/consumer.cpp" "$tmp/p/"
}
install_stage() {
  meson install -C "$build" --destdir "$stage" --no-rebuild --quiet >/dev/null
}
case $kind in
  pkgconfig)
    install_stage
    export PKG_CONFIG_PATH=$stage$prefix/$libdir/pkgconfig PKG_CONFIG_SYSROOT_DIR=$stage
    project_copy meson_pkgconfig
    meson setup "$tmp/b" "$tmp/p" >/dev/null
    meson compile -C "$tmp/b" >/dev/null
    LD_LIBRARY_PATH=$stage$prefix/$libdir "$tmp/b/consumer"
    ;;
  cmake)
    install_stage
    project_copy cmake
    cmake -S "$tmp/p" -B "$tmp/b" -DCMAKE_PREFIX_PATH="$stage$prefix" >/dev/null
    cmake --build "$tmp/b" >/dev/null
    LD_LIBRARY_PATH=$stage$prefix/$libdir "$tmp/b/consumer"
    ;;
  subproject)
    project_copy meson_subproject
    mkdir -p "$tmp/p/subprojects/lazydag"
    tar -C "$src" --exclude='./build*' --exclude=./.git --exclude=./.gpu-deps -cf - . |
      tar -C "$tmp/p/subprojects/lazydag" -xf -
    # CUDA off only to keep this test short; -O0 for the same reason.
    meson setup "$tmp/b" "$tmp/p" -Dbuildtype=plain -Dlazydag:cuda=disabled > "$tmp/setup.log"
    # as a subproject: libraries only
    meson compile -C "$tmp/b" >/dev/null
    if find "$tmp/b/subprojects/lazydag" -name 'test_*' -type f | grep -q .; then
      echo "run.sh: the subproject built its tests" >&2
      exit 1
    fi
    "$tmp/b/consumer"
    ;;
  *)
    echo "run.sh: unknown consumer '$kind'" >&2
    exit 2
    ;;
esac
