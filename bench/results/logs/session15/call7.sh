#!/usr/bin/env bash
# Session 15, call 7 (one GPU): A/B head (860f032) vs pf (at small T the CTAs prefetch the first-wave
# Linear1 tiles' first weights into L2 at launch; EPFUSE_EXP_L2_SHARE = the share of L2 they may fill:
# 0.5, 0.8, 1.2), FP8, two rounds; then the timeline of pf at 0.8.
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
bench() {  # tag bin dtype shape H I E k T
  local tag=$1 bin=$2 dt=$3; shift 3
  timeout 100 $bin bench --impl fused --dtype $dt --ranks 1 --torch off --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 \
    --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$OUT/ab-$tag-$1-$dt-r$round.json" 2>&1 \
    | grep -E "^custom|illegal instruction|timed out|rror" | grep -v "freeing\|~Symm\|~Comm\|destroying" | sed "s/^/$tag r$round $1: /" | cut -c1-150
}
for round in 1 2; do for tag in head pf05 pf08 pf12; do
  bin=.carry/v15/pf/epfuse
  case $tag in head) bin=.carry/v15/head/epfuse ;; pf05) export EPFUSE_EXP_L2_SHARE=0.5 ;; pf08) export EPFUSE_EXP_L2_SHARE=0.8 ;; pf12) export EPFUSE_EXP_L2_SHARE=1.2 ;; esac
  bench $tag $bin fp8 qwen3 2048 768 32 8 128,4096
  bench $tag $bin fp8 dsv3 7168 2048 64 8 128
  unset EPFUSE_EXP_L2_SHARE
done; done 2>&1 | tee "$OUT/ab.log"
for shape in "qwen3 2048 768 32 8" "dsv3 7168 2048 64 8"; do set -- $shape
  EPFUSE_EXP_L2_SHARE=0.8 EPFUSE_TRACE_FILE=$OUT/trace-pf08-$1.csv timeout 90 .carry/trace/epfuse bench --impl fused --dtype fp8 --ranks 1 --torch off \
    --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens 128 \
    2>&1 | grep -E "^custom|rror" | sed "s/^/trace pf08 $1: /" | cut -c1-170
done 2>&1 | tee "$OUT/trace.log"
gzip -f $OUT/*.csv
(cd "$OUT" && tar czf json.tgz *.json && rm -f *.json)
