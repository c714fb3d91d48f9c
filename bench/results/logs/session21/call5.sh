#!/usr/bin/env bash
# Session 21, call 5 (one GPU; nvidia-h200 asked), the landing build (.carry/build, f0c6fe8's sources):
# only on an H200 (every call since 2026-11-25 got an H100), the fused layer's bf16 and FP8 rows on the
# per-GPU shapes (scripts/device-run.sh fp8-bench, no peers: the device time left is too short for their
# build). On an H100 it stops at once.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
[[ "$gpu" == *H200* ]] || { echo "not an H200: nothing run"; exit 0; }
EPFUSE_FP8_IMPLS=fused bash scripts/device-run.sh fp8-bench 2>&1 | grep -E "^(custom|dsv3|qwen3|mixtral)|rror" | cut -c1-160
