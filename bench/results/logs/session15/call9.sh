#!/usr/bin/env bash
# Session 15, call 9 (one GPU): A/B head (860f032) vs ef (at <= 128 rows per expert the FP8 weight
# boxes are loaded with an L2 evict_first hint, EPFUSE_EXP_EVICT_FIRST=1), FP8, two rounds; the
# timeline of ef.
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
for round in 1 2; do for tag in head ef; do
  bin=.carry/v15/$tag/epfuse
  [ $tag = ef ] && export EPFUSE_EXP_EVICT_FIRST=1
  bench $tag $bin fp8 qwen3 2048 768 32 8 128,4096
  bench $tag $bin fp8 dsv3 7168 2048 64 8 128,1024
  unset EPFUSE_EXP_EVICT_FIRST
done; done 2>&1 | tee "$OUT/ab.log"
for shape in "qwen3 2048 768 32 8" "dsv3 7168 2048 64 8"; do set -- $shape
  EPFUSE_EXP_EVICT_FIRST=1 EPFUSE_TRACE_FILE=$OUT/trace-ef-$1.csv timeout 90 .carry/trace/epfuse bench --impl fused --dtype fp8 --ranks 1 --torch off \
    --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens 128 \
    2>&1 | grep -E "^custom|rror" | sed "s/^/trace ef $1: /" | cut -c1-170
done 2>&1 | tee "$OUT/trace.log"
gzip -f $OUT/*.csv
(cd "$OUT" && tar czf json.tgz *.json && rm -f *.json)
