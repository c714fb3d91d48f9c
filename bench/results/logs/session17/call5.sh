#!/usr/bin/env bash
# Session 17, call 5 (one GPU): test_fp8_tile now checks fp8_block_mma_promote_quarters (the fused FP8
# tile's k-block) instead of the removed n128 form; test_fp8_tma_tile as a control (its bench case
# prints the tile's TFLOP/s alone).
cd "$(dirname "$0")/../.."
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
timeout 60 .carry/s17/t/test_fp8_tile; echo "test_fp8_tile exit $?"
timeout 120 .carry/s17/t/test_fp8_tma_tile | tail -8; echo "test_fp8_tma_tile exit ${PIPESTATUS[0]}"
