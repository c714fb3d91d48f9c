#!/usr/bin/env bash
# Session 24, call 3 (one GPU; nvidia-h200 asked). Where exp/weight-multicast's clusters lose time: the task
# timeline (trace builds, -DEPFUSE_TRACE=ON, launch 20; scripts/trace_report.py) of main
# (.carry/s24/trace-main) and of the branch (.carry/s24/trace-mc) at qwen3-30b T=16384 and dsv3 T=4096
# FP8, where call 2 measured the branch 9-14% slower. Everything under $OUT as one tarball.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-} PATH=/opt/torch/.venv/bin:$PATH
CEIL=gemm=790,hbm=4250,nvlink=350,fp8=1447
for tag in main mc; do
  for shape in "qwen3 2048 768 32 8 16384" "dsv3 7168 2048 64 8 4096"; do set -- $shape
    EPFUSE_TRACE_LAUNCH=20 EPFUSE_TRACE_FILE=$W/trace-$tag-$1.csv timeout 120 .carry/s24/trace-$tag bench --impl fused --dtype fp8 \
      --ranks 1 --torch off --ceilings $CEIL --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 \
      2>&1 | grep -E " fused |rror" | sed "s/^/trace $tag $1: /" | cut -c1-170
    python3 scripts/trace_report.py $W/trace-$tag-$1.csv > $W/trace-$tag-$1-report.txt 2>&1
    echo "== $tag $1"; head -c 6000 $W/trace-$tag-$1-report.txt
  done
done
echo "end: $(( $(date +%s) - start )) s"
gzip -f $W/*.csv
tar czf "$OUT/call3.tgz" -C "$W" .
