#!/usr/bin/env bash
# Session 17, call 6 (4 GPUs): the landing build's fused kernels (SASS = 770437d's, the FP8 k-block in
# quarters) over real NVLink at world 4: test_gpu_fused_fp8_w4, test_gpu_faults_w4, test_gpu_fused_w4,
# then the FP8 CLI matrix run_fused_fp8_w4_* as far as the time allows.
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
start=$(date +%s)
EPFUSE_CTEST_REGEX='^(test_gpu_fused_fp8_w4|test_gpu_faults_w4|test_gpu_fused_w4|run_fused_fp8_w4_.*)$' \
  timeout 130 bash scripts/device-run.sh ctest > /dev/null 2>&1
echo "ctest rc=$? after $(( $(date +%s) - start )) s"
grep -E "Test +#" "$OUT/ctest.log" | awk '{print $4, $6}' | sort | uniq -c | sort -rn | head -3
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$OUT/ctest.log" | tail -8
grep -cE "Test +#.*Passed" "$OUT/ctest.log"
gzip -f "$OUT/ctest.log"
