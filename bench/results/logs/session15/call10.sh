#!/usr/bin/env bash
# Session 15, call 10 (one GPU): the candidate (the FP8 weight boxes of experts this call reads once,
# one m-block, load with an L2 evict_first hint; .carry/build): (1) its GPU tests (FP8 tile test, now with
# hinted tiles; world-1 tests and CLI matrices; one-GPU world-4 tests; world-2/8 CLI matrices; world-4
# fault runs); (2) A/B against head (860f032), FP8, two rounds.
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
EPFUSE_CTEST_REGEX='^(gpu_fp8_tma_tile|test_gpu_(fused|fused_fp8)_w1|test_gpu_fused_(fp8_)?onegpu_w4|run_fused_fault_onegpu_w4_.*|run_fused_(fp8_)?(w1|onegpu_w2|onegpu_w8)_.*)$' \
  timeout 400 bash scripts/device-run.sh ctest > /dev/null 2>&1
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$OUT/ctest.log" | tail -12
gzip -f "$OUT/ctest.log"
bench() {  # tag bin dtype shape H I E k T
  local tag=$1 bin=$2 dt=$3; shift 3
  timeout 90 $bin bench --impl fused --dtype $dt --ranks 1 --torch off --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 \
    --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$OUT/ab-$tag-$1-$dt-r$round.json" 2>&1 \
    | grep -E "^custom|illegal instruction|timed out|rror" | grep -v "freeing\|~Symm\|~Comm\|destroying" | sed "s/^/$tag r$round $1: /" | cut -c1-150
}
for round in 1 2; do for tag in head cand; do
  bin=$([ $tag = cand ] && echo .carry/build/tools/epfuse || echo .carry/v15/head/epfuse)
  bench $tag $bin fp8 qwen3 2048 768 32 8 128,4096
  bench $tag $bin fp8 dsv3 7168 2048 64 8 128,1024
done; done 2>&1 | tee "$OUT/ab.log"
(cd "$OUT" && tar czf json.tgz *.json && rm -f *.json)
