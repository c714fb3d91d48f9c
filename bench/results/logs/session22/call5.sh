#!/usr/bin/env bash
# Session 22, call 5 (one GPU; nvidia-h200 asked): exp/kb-boundary (.carry/build, 2c21e92: the next
# k-block's stage probed while the current block's second n128 half is in the tensor pipe and, if full,
# its proxy fence and scale loads issued there; math 216 registers) and the same at 56 / 224 registers
# (.carry/s22/kb224-epfuse: no spill in the math warps, 4 in the producer's copy loop) against main
# (.carry/s22/new-epfuse, 97753a1's kernels):
# (1) its FP8 tile tests, world-1 and one-GPU world-4 FP8 layer tests, the world-1 FP8 CLI matrix and the
# fault entries; (2) sustained A/B (--sustained 1500), two rounds. Everything under $OUT as one tarball.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
left() { echo $(( 420 - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-} PATH=/opt/torch/.venv/bin:$PATH
OUT=$W EPFUSE_CTEST_REGEX='^(gpu_fp8_tile|gpu_fp8_tma_tile|test_gpu_fused_fp8_w1|test_gpu_fused_fp8_onegpu_w4|test_gpu_faults_w1|run_fused_fp8_w1.*)$' \
  timeout 120 bash scripts/device-run.sh ctest > /dev/null 2>&1
echo "tests rc=$? after $(( $(date +%s) - start )) s: $(grep -cE "Test +#.*Passed" "$W/ctest.log") passed"
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$W/ctest.log" | tail -12; gzip -f "$W/ctest.log"
CEIL=gemm=790,hbm=4250,nvlink=350,fp8=1447
for round in 1 2; do
  for shape in "mixtral 4096 14336 2 2 4096" "dsv3 7168 2048 64 8 4096" "qwen3 2048 768 32 8 16384"; do
    set -- $shape
    for b in main kb kb224; do
      [ $(left) -lt 25 ] && break 3
      bin=$(case $b in main) echo .carry/s22/new-epfuse;; kb) echo .carry/build/tools/epfuse;; kb224) echo .carry/s22/kb224-epfuse;; esac)
      timeout 45 $bin bench --impl fused --dtype fp8 --ranks 1 --torch off --iters 20 --sustained 1500 --ceilings $CEIL \
        --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$W/sus-$b-$1-r$round.json" 2>&1 \
        | grep -E " fused |rror|illegal|timed" | sed "s/^/$b r$round $1: /" | cut -c1-260
    done
  done
done
echo "end: $(( $(date +%s) - start )) s"
tar czf "$OUT/call5.tgz" -C "$W" .
