#!/usr/bin/env bash
# Session 19, call 6 (4x H100, nvidia-h100-x4): the landing build f726db9's world-4 GPU tests on four
# GPUs, the fault tests first (session 18's call 5 ran out of time before them).
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d); mkdir -p $W/a $W/b
start=$(date +%s)
nvidia-smi --query-gpu=name --format=csv,noheader | sort | uniq -c
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
OUT=$W/a EPFUSE_CTEST_REGEX='^(test_gpu_faults_w4|test_gpu_fused_fp8_w4|test_gpu_fused_w4)$' \
  timeout 120 bash scripts/device-run.sh ctest > /dev/null 2>&1
echo "a rc=$? after $(( $(date +%s) - start )) s"
OUT=$W/b EPFUSE_CTEST_REGEX='^(run_fused_fp8_w4_.*|run_fused_w4_.*)$' \
  timeout $(( 225 - ($(date +%s) - start) )) bash scripts/device-run.sh ctest > /dev/null 2>&1
echo "b rc=$? after $(( $(date +%s) - start )) s"
for d in a b; do
  grep -E "Test +#" "$W/$d/ctest.log" | grep -v Passed | head -5
  echo "$d passed: $(grep -cE "Test +#.*Passed" "$W/$d/ctest.log")"
  gzip -f "$W/$d/ctest.log"
done
tar czf "$OUT/call6.tgz" -C "$W" .
