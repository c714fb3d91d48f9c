#!/usr/bin/env bash
# Session 21, call 4 (one GPU; nvidia-h200 asked): exp/producer-signals (.carry/build: a Linear2 tile's
# release adds issued by the producer once it reuses the tile's slot, not by the math warps) against main
# (.carry/s21/base-epfuse, the landing build f0c6fe8): (1) its world-1 and one-GPU world-4 layer tests,
# bf16 and FP8, the seven fault entries and the one-GPU world-4 FP8 CLI matrix; (2) an A/B of
# the fused layer, FP8 and bf16, two rounds. Everything under $OUT as one tarball.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
OUT=$W EPFUSE_CTEST_REGEX='^(test_gpu_fused_w1|test_gpu_fused_fp8_w1|test_gpu_fused_onegpu_w4|test_gpu_fused_fp8_onegpu_w4|test_gpu_faults_w1|test_gpu_faults_onegpu_w4|run_fused_fault_onegpu_w4.*|run_fused_fp8_onegpu_w4_.*)$' \
  timeout 150 bash scripts/device-run.sh ctest > /dev/null 2>&1
echo "tests rc=$? after $(( $(date +%s) - start )) s: $(grep -cE "Test +#.*Passed" "$W/ctest.log") passed"
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$W/ctest.log" | tail -12; gzip -f "$W/ctest.log"
OUT=$W EPFUSE_BASE_BIN=$PWD/.carry/s21/base-epfuse EPFUSE_NEW_BIN=$PWD/.carry/build/tools/epfuse EPFUSE_AB_ROUNDS=2 EPFUSE_AB_ARGS="--dtype fp8,bf16" \
  EPFUSE_AB_SHAPES="qwen3 2048 768 32 8 4096,16384;dsv3 7168 2048 64 8 1024,4096;mixtral 4096 14336 2 2 4096" \
  timeout $(( $(left) - 5 )) bash scripts/device-run.sh ab 2>&1 | grep -E "fused|rror|illegal|timed" | cut -c1-150
echo "end: $(( $(date +%s) - start )) s"
tar czf "$OUT/call4.tgz" -C "$W" .
