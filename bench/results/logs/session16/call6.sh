#!/usr/bin/env bash
# Session 16, call 6 (one GPU): the quarters build (.carry/build) again: (1) the FP8 tests call 5 left out
# (one-GPU world-4 test, the world-2/8 CLI matrices, the world-4 fault runs); (2) a third A/B round
# against 81fa496 on the compute-bound FP8 rows.
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
start=$(date +%s)
EPFUSE_CTEST_REGEX='^(test_gpu_fused_fp8_onegpu_w4|run_fused_fault_onegpu_w4_.*|run_fused_fp8_(onegpu_w2|onegpu_w8)_.*)$' \
  timeout 200 bash scripts/device-run.sh ctest > /dev/null 2>&1
echo "ctest rc=$? after $(( $(date +%s) - start )) s"
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$OUT/ctest.log" | tail -12
gzip -f "$OUT/ctest.log"
bench() {  # tag bin dtype shape H I E k T
  local tag=$1 bin=$2 dt=$3; shift 3
  timeout 60 $bin bench --impl fused --dtype $dt --ranks 1 --torch off --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 \
    --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$OUT/ab-$tag-$1-$dt-r$round.json" 2>&1 \
    | grep -E "^custom|illegal|timed out|rror" | grep -v "freeing\|~Symm\|~Comm\|destroying" | sed "s/^/$tag r$round $1: /" | cut -c1-150
}
round=3
for tag in base cand; do
  bin=$([ $tag = cand ] && echo .carry/build/tools/epfuse || echo .carry/base/epfuse)
  bench $tag $bin fp8 mixtral 4096 14336 2 2 4096
  bench $tag $bin fp8 dsv3 7168 2048 64 8 1024,4096
  bench $tag $bin fp8 qwen3 2048 768 32 8 16384
done 2>&1 | tee "$OUT/ab.log"
echo "after: $(( $(date +%s) - start )) s"
(cd "$OUT" && tar czf json.tgz *.json && rm -f *.json)
