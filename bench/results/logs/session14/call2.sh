#!/usr/bin/env bash
# Session 14, call 2 (one GPU): FP8 A/B of 78393aa (.carry/head) against exp/preload builds:
# preload (ring 4 k-blocks in flight, .carry/build), d2 / d3 (in-flight limit 2 / 3), g (world-1
# experiment: the protocol's .sys releases and acquires at .gpu scope); two rounds at T=128 (qwen3, dsv3)
# and qwen3 4096, mixtral once. Then the task timeline with epilogue sub-steps: preload at 4 and 2 in flight.
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
tar xzf .carry/v.tgz -C .carry
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
bench() {  # tag bin shape H I E k T
  local tag=$1 bin=$2; shift 2
  timeout 100 $bin bench --impl fused --dtype fp8 --ranks 1 --torch off --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 \
    --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$OUT/ab-$tag-$1-r$round.json" 2>&1 \
    | grep -E "^custom|illegal instruction|timed out|rror" | grep -v "freeing\|~Symm\|~Comm\|destroying" | sed "s/^/$tag r$round $1: /" | cut -c1-150
}
declare -A B=([head]=.carry/v/head [pre]=.carry/v/pre [d2]=.carry/v/rel2 [d3]=.carry/v/rel3 [g]=.carry/v/rel4g)
for round in 1 2; do for tag in head pre d2 d3 g; do
  for shape in "qwen3 2048 768 32 8 128,4096" "dsv3 7168 2048 64 8 128"; do bench $tag ${B[$tag]} $shape; done
  [ $round = 1 ] && bench $tag ${B[$tag]} mixtral 4096 14336 2 2 4096
done; done 2>&1 | tee "$OUT/ab.log"
for tag in trace4 trace2; do for shape in "qwen3 2048 768 32 8" "dsv3 7168 2048 64 8"; do set -- $shape
  EPFUSE_TRACE_FILE=$OUT/$tag.csv timeout 90 .carry/v/$tag bench --impl fused --dtype fp8 --ranks 1 --torch off \
    --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens 128 \
    2>&1 | grep -E "^custom|rror" | sed "s/^/$tag $1: /" | cut -c1-150
done; done 2>&1 | tee "$OUT/trace.log"
(cd "$OUT" && tar czf json.tgz *.json && rm -f *.json)
