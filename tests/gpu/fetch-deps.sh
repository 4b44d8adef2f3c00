#!/usr/bin/env bash
# Downloads the Debian packages the build needs into .gpu-deps/ (ignored by
# git), for a GPU machine that has the CUDA toolkit, a C++ compiler, meson
# and ninja but cannot reach a package registry: check.sh unpacks them there
# into a private root (never over /).
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .gpu-deps
cd .gpu-deps
apt-get download libtbb-dev libtbb12 libtbbmalloc2 libtbbbind-2-5 doctest-dev \
  libopenblas-dev libopenblas0 libopenblas0-pthread libopenblas-pthread-dev libgfortran5 \
  libsleef-dev libsleef3 libdnnl-dev libdnnl2 ocl-icd-libopencl1 pkg-config pkgconf pkgconf-bin libpkgconf3 \
  libboost-dev libboost1.74-dev libboost-graph-dev libboost-graph1.74-dev 2>&1 | grep -v '^W: Download is performed unsandboxed' || true
du -sh .
