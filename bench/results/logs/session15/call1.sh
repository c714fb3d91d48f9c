#!/usr/bin/env bash
# Session 15, call 1 (one GPU): the task timeline of 860f032 + two more epilogue stamps (after the
# math group's barrier, after SwiGLU), T=128: qwen3 and dsv3, FP8 and bf16; two traced launches each.
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
for launch in 20 40; do
for shape in "qwen3 2048 768 32 8" "dsv3 7168 2048 64 8"; do set -- $shape
  EPFUSE_TRACE_LAUNCH=$launch EPFUSE_TRACE_FILE=$OUT/trace-$1-l$launch.csv timeout 90 .carry/trace/epfuse bench --impl fused --dtype bf16,fp8 --ranks 1 --torch off \
    --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens 128 \
    2>&1 | grep -E "^custom|rror" | sed "s/^/trace $1 l$launch: /" | cut -c1-170
done; done 2>&1 | tee "$OUT/trace.log"
gzip -f $OUT/*.csv
