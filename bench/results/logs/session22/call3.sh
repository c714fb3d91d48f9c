#!/usr/bin/env bash
# Session 22, call 3 (one GPU; nvidia-h200 asked). On an H200: call2.sh (issue 13's table). Otherwise the
# math warps' per-k-block proxy fence (fence.proxy.async.shared::cta, for A rows written by cp.async):
#   main  .carry/s22/new-epfuse (97753a1: main's kernels, bench --sustained)
#   f0    .carry/s22/f0-epfuse: main without the fence (diag-no-fence.patch; a diagnostic, never merged:
#         wgmma may read stale A without it, so only its time and energy count)
#   f1    .carry/build (exp/tma-h 4c12f76): Linear2's A by TMA, whose k-loop then needs no fence
#         (correct): its FP8 tests first, then all three back to back with --sustained 1500 (ms, J a call).
cd "$(dirname "$0")/../../../.."
here=$PWD/bench/results/logs/session22
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
[[ "$gpu" == *H200* ]] && exec bash "$here/call2.sh"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-} PATH=/opt/torch/.venv/bin:$PATH
OUT=$W EPFUSE_CTEST_REGEX='^(gpu_fp8_tma_tile|test_gpu_fused_fp8_w1|test_gpu_fused_fp8_onegpu_w4|run_fused_fp8_w1.*)$' \
  timeout 120 bash scripts/device-run.sh ctest > /dev/null 2>&1
echo "tests rc=$? after $(( $(date +%s) - start )) s: $(grep -cE "Test +#.*Passed" "$W/ctest.log") passed"
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$W/ctest.log" | tail -12; gzip -f "$W/ctest.log"
CEIL=gemm=790,hbm=4250,nvlink=350,fp8=1447
for round in 1 2; do
  for shape in "mixtral 4096 14336 2 2 4096" "dsv3 7168 2048 64 8 4096" "qwen3 2048 768 32 8 16384"; do
    set -- $shape
    for b in main f0 f1; do
      [ $(left) -lt 30 ] && break 3
      bin=$(case $b in main) echo .carry/s22/new-epfuse;; f0) echo .carry/s22/f0-epfuse;; f1) echo .carry/build/tools/epfuse;; esac)
      timeout 60 $bin bench --impl fused --dtype fp8 --ranks 1 --torch off --iters 20 --sustained 1500 --ceilings $CEIL \
        --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$W/sus-$b-$1-r$round.json" 2>&1 \
        | grep -E " fused |rror|illegal|timed" | sed "s/^/$b r$round $1: /" | cut -c1-260
    done
  done
done
echo "end: $(( $(date +%s) - start )) s"
tar czf "$OUT/call3.tgz" -C "$W" .
