#!/usr/bin/env bash
# Builds epfuse and runs every test. Without GPUs the GPU tests report "Skipped" (exit code 77).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/scripts/build.sh"
cd "$build"
ctest --output-on-failure -j "$jobs" "$@"
