#!/usr/bin/env bash
# Session 18, call 2 (one GPU): the task timeline of 7c6d8aa (trace build, -DEPFUSE_TRACE=ON, 128 records
# a CTA) at the compute-bound FP8 rows: mixtral T=4096 and dsv3 T=4096, launch 20 of the bench.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
for shape in "mixtral 4096 14336 2 2" "dsv3 7168 2048 64 8"; do set -- $shape
  EPFUSE_TRACE_LAUNCH=20 EPFUSE_TRACE_FILE=$OUT/trace-$1-fp8.csv timeout 120 .carry/trace/epfuse bench --impl fused --dtype fp8 --ranks 1 --torch off \
    --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens 4096 \
    2>&1 | grep -E "^custom|rror" | sed "s/^/trace $1: /" | cut -c1-170
done 2>&1 | tee "$OUT/trace.log"
for f in $OUT/trace-*.csv; do python3 scripts/trace_report.py $f > ${f%.csv}-report.txt 2>&1; done
gzip -f $OUT/*.csv
