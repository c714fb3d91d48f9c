#!/usr/bin/env bash
# Quick start: build epfuse, then run the layer once and check it against the float64 reference:
# the fused layer on every GPU when there are GPUs, otherwise the CPU reference on 2 simulated ranks.
# Extra arguments go to `epfuse run` (e.g. --model dsv3 --tokens 128, --impl unfused for the baseline).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
source "$root/scripts/build.sh"
if nvidia-smi -L >/dev/null 2>&1; then
  # One rank per GPU (the default); the token count is per rank.
  exec "$build/tools/epfuse" run --model qwen3-30b --tokens 128 "$@"
else
  exec "$build/tools/epfuse" run --model qwen3-30b --tokens 16 --ranks 2 "$@"
fi
