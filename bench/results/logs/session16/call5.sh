#!/usr/bin/env bash
# Session 16, call 5 (one GPU): the FP8 k-block in four n64 quarters with two scratch accumulators
# (cand, .carry/build): (1) its FP8 tile and world-1 tests; (2) A/B against 81fa496 (base; FP8 SASS = c67a660's),
# FP8, two rounds.
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
start=$(date +%s)
EPFUSE_CTEST_REGEX='^(gpu_fp8_tma_tile|gpu_fp8_tile|test_gpu_fused_fp8_w1|run_fused_fp8_w1_.*)$' \
  timeout 150 bash scripts/device-run.sh ctest > /dev/null 2>&1
echo "ctest rc=$? after $(( $(date +%s) - start )) s"
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$OUT/ctest.log" | tail -12
gzip -f "$OUT/ctest.log"
bench() {  # tag bin dtype shape H I E k T
  local tag=$1 bin=$2 dt=$3; shift 3
  timeout 60 $bin bench --impl fused --dtype $dt --ranks 1 --torch off --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 \
    --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$OUT/ab-$tag-$1-$dt-r$round.json" 2>&1 \
    | grep -E "^custom|illegal|timed out|rror" | grep -v "freeing\|~Symm\|~Comm\|destroying" | sed "s/^/$tag r$round $1: /" | cut -c1-150
}
for round in 1 2; do for tag in base cand; do
  [ $(( $(date +%s) - start )) -gt 420 ] && break
  bin=$([ $tag = cand ] && echo .carry/build/tools/epfuse || echo .carry/base/epfuse)
  bench $tag $bin fp8 mixtral 4096 14336 2 2 4096
  bench $tag $bin fp8 dsv3 7168 2048 64 8 1024,4096
  bench $tag $bin fp8 qwen3 2048 768 32 8 128,16384
done; echo "after round $round: $(( $(date +%s) - start )) s"; done 2>&1 | tee "$OUT/ab.log"
(cd "$OUT" && tar czf json.tgz *.json && rm -f *.json)
