#!/usr/bin/env bash
# Installs missing build dependencies and builds epfuse (Release) in build/. Sourced by run.sh
# and test.sh; set EPFUSE_BUILD_DIR or EPFUSE_JOBS to change the directory or parallelism.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${EPFUSE_BUILD_DIR:-$root/build}
jobs=${EPFUSE_JOBS:-$(nproc)}
export PATH=${CUDA_HOME:-/usr/local/cuda}/bin:$PATH

bash "$root/scripts/install-deps.sh"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
# ptxas's note that it serialised a kernel's wgmmas (C7511: for want of registers; its siblings name other
# causes) costs that kernel 15-40% and shows nowhere else
# (docs/performance.md#the-decode-form-at-32-rows-2026-11-30): a build that prints it fails.
cmake --build "$build" -j "$jobs" 2>&1 | tee "$build/build.log"
if grep -q 'wgmma.mma_async instructions are serialized' "$build/build.log"; then
  echo "build: ptxas serialised the wgmmas of a kernel (split its forms into kernels apart):" >&2
  grep 'wgmma.mma_async instructions are serialized' "$build/build.log" >&2
  exit 1
fi
