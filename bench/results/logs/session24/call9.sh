#!/usr/bin/env bash
# Session 24, call 9 (one GPU; nvidia-h200 asked). The task timeline of the branch head (exp/weight-multicast
# 22b79e8: fence-free hand-over, parallel segment search; trace build .carry/s24/trace-mc, launch 20) at
# qwen3-30b T=16384 and dsv3 T=4096, for what it still loses against main (call 3 has main's timeline).
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-} PATH=/opt/torch/.venv/bin:$PATH
CEIL=gemm=790,hbm=4250,nvlink=350,fp8=1447
for shape in "qwen3 2048 768 32 8 16384" "dsv3 7168 2048 64 8 4096"; do set -- $shape
  EPFUSE_TRACE_LAUNCH=20 EPFUSE_TRACE_FILE=$W/trace-mc-$1.csv timeout 120 .carry/s24/trace-mc bench --impl fused --dtype fp8 \
    --ranks 1 --torch off --ceilings $CEIL --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 \
    2>&1 | grep -E " fused |rror" | sed "s/^/trace mc $1: /" | cut -c1-170
  python3 scripts/trace_report.py $W/trace-mc-$1.csv > $W/trace-mc-$1-report.txt 2>&1
  echo "== mc $1"; sed -n '/^phase      tasks/,/^tasks before/p' $W/trace-mc-$1-report.txt; grep -A3 "^GEMM tiles" $W/trace-mc-$1-report.txt; grep -A3 "^math gaps" $W/trace-mc-$1-report.txt
done
echo "end: $(( $(date +%s) - start )) s"
gzip -f $W/*.csv
tar czf "$OUT/call9.tgz" -C "$W" .
