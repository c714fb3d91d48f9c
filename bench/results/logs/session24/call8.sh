#!/usr/bin/env bash
# Session 24, call 8 (one GPU; nvidia-h200 asked). exp/weight-multicast with the cluster leader sending the
# partner its next task id inside its loads (once the ring is full of the tile: one st.async; the
# decoding stays after the loads), so the partner's producer holds it when its own loads end: the FP8
# tests, the task timeline at qwen3-30b T=16384 and dsv3 T=4096 (.carry/s24/trace-mc), and the A/B against
# main (.carry/s23/main-epfuse) on the three compute-bound rows, --sustained 1500, rounds while time is left.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
export PATH=/opt/torch/.venv/bin:$PATH
re='^(gpu_fp8_tma_tile|test_gpu_fused_fp8_w1|test_gpu_fused_fp8_onegpu_w[248]|run_fused_fp8_w1_|run_fused_fp8_onegpu_w4_)'
OUT=$W EPFUSE_CTEST_REGEX="$re" timeout 200 bash scripts/device-run.sh ctest > "$W/ctest-run.log" 2>&1
echo "ctest: rc=$? after $(( $(date +%s) - start )) s"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout" "$W"/ctest.log | head -20
CEIL=gemm=790,hbm=4250,nvlink=350,fp8=1447
for shape in "qwen3 2048 768 32 8 16384" "dsv3 7168 2048 64 8 4096"; do set -- $shape
  EPFUSE_TRACE_LAUNCH=20 EPFUSE_TRACE_FILE=$W/trace-mc-$1.csv timeout 120 .carry/s24/trace-mc bench --impl fused --dtype fp8 \
    --ranks 1 --torch off --ceilings $CEIL --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 \
    2>&1 | grep -E " fused |rror" | sed "s/^/trace mc $1: /" | cut -c1-170
  python3 scripts/trace_report.py $W/trace-mc-$1.csv > $W/trace-mc-$1-report.txt 2>&1
  echo "== mc $1"; grep -A3 "^GEMM tiles" $W/trace-mc-$1-report.txt; grep -A3 "^math gaps" $W/trace-mc-$1-report.txt
done
for round in 1 2 3; do for tag in main mc; do bin=$([ $tag = main ] && echo .carry/s23/main-epfuse || echo .carry/build/tools/epfuse)
  for shape in "mixtral 4096 14336 2 2 4096" "dsv3 7168 2048 64 8 4096" "qwen3 2048 768 32 8 16384"; do set -- $shape
    [ $(left) -lt 25 ] && break
    timeout 60 $bin bench --impl fused --dtype fp8 --ranks 1 --torch off --iters 30 --sustained 1500 --ceilings $CEIL \
      --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$W/ab-$tag-$1-r$round.json" 2>&1 \
      | grep -E " fused |rror" | sed "s/^/$tag r$round $1: /" | cut -c1-250
  done
done; done 2>&1 | tee $W/ab.log
echo "end: $(( $(date +%s) - start )) s"
gzip -f $W/*.csv
tar czf "$OUT/call8.tgz" -C "$W" .
