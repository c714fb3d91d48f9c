#!/usr/bin/env bash
# Session 18, call 5 (4 GPUs over NVLink): the landing build (88591c9; its kernels are 9c44c70's: the
# epilogues straight from the registers, so Linear2's rows now reach the peers' combine slots as each
# lane's 16-byte stores) at world 4: test_gpu_fused_fp8_w4, test_gpu_fused_w4, test_gpu_faults_w4, then
# the FP8 and bf16 CLI matrices run_fused_fp8_w4_*, run_fused_w4_* as far as the time allows.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
start=$(date +%s)
EPFUSE_CTEST_REGEX='^(test_gpu_fused_fp8_w4|test_gpu_fused_w4|test_gpu_faults_w4|run_fused_fp8_w4_.*|run_fused_w4_.*)$' \
  timeout 150 bash scripts/device-run.sh ctest > /dev/null 2>&1
echo "ctest rc=$? after $(( $(date +%s) - start )) s"
grep -E "Test +#" "$OUT/ctest.log" | awk '{print $4, $6}' | sort | uniq -c | sort -rn | head -3
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$OUT/ctest.log" | tail -8
grep -cE "Test +#.*Passed" "$OUT/ctest.log"
gzip -f "$OUT/ctest.log"
