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
# ptxas's C7511 note (every wgmma of a kernel serialised for want of registers) costs that kernel 15-40%
# and shows nowhere else (docs/performance.md#the-decode-form-at-32-rows-2026-11-30): a build that prints it fails.
cmake --build "$build" -j "$jobs" 2>&1 | tee "$build/build.log"
if grep -q 'C7511' "$build/build.log"; then
  echo "build: ptxas serialised every wgmma of a kernel (C7511); split its forms into kernels apart:" >&2
  grep 'C7511' "$build/build.log" >&2
  exit 1
fi
