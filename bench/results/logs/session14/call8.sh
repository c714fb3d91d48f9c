#!/usr/bin/env bash
# Session 14, call 8 (2 GPUs): d6837b5 on real NVLink: the fused layer's GPU tests at world 2 (bf16 and FP8)
# and the world-2 CLI matrices, bf16 and FP8 (the preload runs there; the protocol keeps .sys).
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=index,name --format=csv,noheader
EPFUSE_CTEST_REGEX='^(test_gpu_fused(_fp8)?_w2|run_fused_(fp8_)?w2_.*)$' timeout 200 bash scripts/device-run.sh ctest > /dev/null 2>&1
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$OUT/ctest.log" | tail -12
gzip -f "$OUT/ctest.log"
