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
cmake --build "$build" -j "$jobs"
