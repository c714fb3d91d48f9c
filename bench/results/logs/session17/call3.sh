#!/usr/bin/env bash
# Session 17, call 3 (one GPU): the quarters pipelined across k-blocks (.carry/build, main + change 1)
# (1) A/B against 44df678 (.carry/s17/timing-epfuse: 770437d's kernel, the same bench timing) on the
# compute-bound FP8 rows and qwen3 T=128, two rounds; (2) the FP8 GPU tests.
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
EPFUSE_BASE_BIN=$PWD/.carry/s17/timing-epfuse EPFUSE_NEW_BIN=$PWD/.carry/build/tools/epfuse EPFUSE_AB_ROUNDS=2 EPFUSE_AB_ARGS="--dtype fp8" \
EPFUSE_AB_SHAPES="mixtral 4096 14336 2 2 4096;dsv3 7168 2048 64 8 1024,4096;qwen3 2048 768 32 8 128,16384" \
  timeout 330 bash scripts/device-run.sh ab 2>&1 | grep -E "fused fp8|illegal|timed out|rror|===" | grep -v "freeing\|~Symm\|~Comm\|destroying" | cut -c1-150
echo "after A/B: $(( $(date +%s) - start )) s"
EPFUSE_CTEST_REGEX='^(gpu_fp8_tma_tile|gpu_fp8_tile|test_gpu_fused_fp8_w1|test_gpu_faults_w1|run_fused_fp8_w1_.*|test_gpu_fused_fp8_onegpu_w4|run_fused_fp8_(onegpu_w2|onegpu_w8)_.*)$' \
  timeout $(( 585 - ($(date +%s) - start) )) bash scripts/device-run.sh ctest > /dev/null 2>&1
echo "ctest rc=$? after $(( $(date +%s) - start )) s"
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$OUT/ctest.log" | tail -14
grep -cE "Test +#.*Passed" "$OUT/ctest.log"
grep -E "TFLOP|bench K" "$OUT/ctest.log" | head -5
gzip -f "$OUT/ctest.log"
(cd "$OUT" && tar czf json.tgz *.json && rm -f *.json)
