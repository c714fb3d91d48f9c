#!/usr/bin/env bash
# Session 14, call 7 (one GPU): the GPU tests of the landing build d6837b5 (FP8 tile test, world-1 tests and
# CLI matrices, one-GPU world-4 tests, world-2/8 CLI matrices, the world-4 fault runs).
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
EPFUSE_CTEST_REGEX='^(gpu_fp8_tma_tile|test_gpu_(fused|fused_fp8)_w1|test_gpu_fused_(fp8_)?onegpu_w4|run_fused_fault_onegpu_w4_.*|run_fused_(fp8_)?(w1|onegpu_w2|onegpu_w8)_.*)$' \
  timeout 450 bash scripts/device-run.sh ctest > /dev/null 2>&1
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$OUT/ctest.log" | tail -12
gzip -f "$OUT/ctest.log"
