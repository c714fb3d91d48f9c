#!/usr/bin/env bash
# Session 25, call 2 (one GPU; nvidia-h200 asked). exp/mc-ahead (the weight multicast's cluster task ids sent a
# task ahead, decoded from the schedule kept in shared memory; .carry/build): its FP8 tests and the bf16
# world-1 CLI matrix, then main (.carry/s23/main-epfuse), head (exp/weight-multicast 22b79e8,
# .carry/s25/head-epfuse) and ahead (.carry/build): sustained ms on the three compute-bound rows,
# synchronised medians on two decode rows, rounds while time is left; then ahead's timeline (trace build,
# .carry/s25/trace-ahead) at qwen3 T=16384 and dsv3 T=4096.
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
trace() {
  for shape in "qwen3 2048 768 32 8 16384" "dsv3 7168 2048 64 8 4096"; do set -- $shape
    EPFUSE_TRACE_LAUNCH=20 EPFUSE_TRACE_FILE=$W/trace-ahead-$1.csv timeout 60 .carry/s25/trace-ahead bench --impl fused --dtype fp8 \
      --ranks 1 --torch off --ceilings $CEIL --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 \
      2>&1 | grep -E " fused |rror" | sed "s/^/trace ahead $1: /" | cut -c1-170
    python3 scripts/trace_report.py $W/trace-ahead-$1.csv > $W/trace-ahead-$1-report.txt 2>&1
    echo "== ahead $1"; sed -n '/^phase      tasks/,/^tasks before/p' $W/trace-ahead-$1-report.txt; grep -A3 "^GEMM tiles" $W/trace-ahead-$1-report.txt; grep -A3 "^math gaps" $W/trace-ahead-$1-report.txt
  done
}
for round in 1 2 3; do for tag in main head ahead; do
  case $tag in main) bin=.carry/s23/main-epfuse;; head) bin=.carry/s25/head-epfuse;; ahead) bin=.carry/build/tools/epfuse;; esac
  for shape in "mixtral 4096 14336 2 2 4096" "dsv3 7168 2048 64 8 4096" "qwen3 2048 768 32 8 16384" "dsv3 7168 2048 64 8 128" "qwen3 2048 768 32 8 128"; do set -- $shape
    [ $(left) -lt 70 ] && break
    timeout 60 $bin bench --impl fused --dtype fp8 --ranks 1 --torch off --iters 30 $([ $6 -gt 128 ] && echo --sustained 1500) --ceilings $CEIL \
      --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$W/ab-$tag-$1-t$6-r$round.json" 2>&1 \
      | grep -E " fused |rror" | sed "s/^/$tag r$round $1 T=$6: /" | cut -c1-250
  done
done; [ $round = 1 ] && trace; done 2>&1 | tee $W/ab.log
echo "end: $(( $(date +%s) - start )) s"
gzip -f $W/*.csv 2>/dev/null
tar czf "$OUT/call2.tgz" -C "$W" .
