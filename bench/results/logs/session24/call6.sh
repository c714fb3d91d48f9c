#!/usr/bin/env bash
# Session 24, call 6 (one GPU; nvidia-h200 asked). A GEMM task's segment found by the producer warpgroup's
# threads testing the schedule's segments at once (scheduler.cuh, task_map.h segment_holds) instead of
# the binary search's ~7 dependent global reads, on the branch (exp/weight-multicast, .carry/build) and
# on main (exp/parallel-decode, .carry/s24/fd-epfuse): the branch's FP8 tests and the bf16 world-1 CLI
# matrix, then main, fd (main + the search) and mc (the branch + the search): sustained ms on the three
# compute-bound rows, synchronised medians on two decode rows, rounds while time is left.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
export PATH=/opt/torch/.venv/bin:$PATH
re='^(gpu_fp8_tma_tile|test_gpu_fused_fp8_w1|test_gpu_fused_fp8_onegpu_w[248]|run_fused_fp8_w1_|run_fused_padded_fp8_w1_|run_fused_fp8_onegpu_w4_|run_fused_w1_)'
OUT=$W EPFUSE_CTEST_REGEX="$re" timeout 240 bash scripts/device-run.sh ctest > "$W/ctest-run.log" 2>&1
echo "ctest: rc=$? after $(( $(date +%s) - start )) s"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout" "$W"/ctest.log | head -20
CEIL=gemm=790,hbm=4250,nvlink=350,fp8=1447
for round in 1 2 3; do for tag in main fd mc; do
  case $tag in main) bin=.carry/s23/main-epfuse;; fd) bin=.carry/s24/fd-epfuse;; mc) bin=.carry/build/tools/epfuse;; esac
  for shape in "mixtral 4096 14336 2 2 4096" "dsv3 7168 2048 64 8 4096" "qwen3 2048 768 32 8 16384" "dsv3 7168 2048 64 8 128" "qwen3 2048 768 32 8 128"; do set -- $shape
    [ $(left) -lt 25 ] && break
    timeout 60 $bin bench --impl fused --dtype fp8 --ranks 1 --torch off --iters 30 $([ $6 -gt 128 ] && echo --sustained 1500) --ceilings $CEIL \
      --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$W/ab-$tag-$1-t$6-r$round.json" 2>&1 \
      | grep -E " fused |rror" | sed "s/^/$tag r$round $1 T=$6: /" | cut -c1-250
  done
done; done 2>&1 | tee $W/ab.log
echo "end: $(( $(date +%s) - start )) s"
tar czf "$OUT/call6.tgz" -C "$W" .
