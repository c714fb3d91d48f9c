#!/usr/bin/env bash
# Session 14, call 3 (one GPU). .carry/build = exp/preload + the transport's .gpu scope when every rank is
# on this GPU + spin_wait's abort flag read one period ahead (cand). (1) A/B FP8: head (78393aa), pre
# (preload only), cand; two rounds, qwen3 128/4096, dsv3 128/1024, mixtral once; (2) cand's trace at
# T=128; (3) cand's GPU tests (tile test, world-1 tests and matrices, one-GPU world-4 tests, fault runs).
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
tar xzf .carry/v2.tgz -C .carry
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
bench() {  # tag bin dtype shape H I E k T
  local tag=$1 bin=$2 dt=$3; shift 3
  timeout 100 $bin bench --impl fused --dtype $dt --ranks 1 --torch off --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 \
    --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$OUT/ab-$tag-$1-r$round.json" 2>&1 \
    | grep -E "^custom|illegal instruction|timed out|rror" | grep -v "freeing\|~Symm\|~Comm\|destroying" | sed "s/^/$tag r$round $1: /" | cut -c1-150
}
declare -A B=([head]=.carry/v/head [pre]=.carry/v/pre [cand]=.carry/build/tools/epfuse)
for round in 1 2; do for tag in head pre cand; do
  for shape in "qwen3 2048 768 32 8 128,4096" "dsv3 7168 2048 64 8 128,1024"; do bench $tag ${B[$tag]} fp8 $shape; done
  [ $round = 1 ] && bench $tag ${B[$tag]} bf16 qwen3 2048 768 32 8 128,4096
  [ $round = 1 ] && bench $tag ${B[$tag]} fp8 mixtral 4096 14336 2 2 4096
done; done 2>&1 | tee "$OUT/ab.log"
for shape in "qwen3 2048 768 32 8" "dsv3 7168 2048 64 8"; do set -- $shape
  EPFUSE_TRACE_FILE=$OUT/tcand.csv timeout 90 .carry/v/tcand bench --impl fused --dtype fp8 --ranks 1 --torch off \
    --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens 128 \
    2>&1 | grep -E "^custom|rror" | sed "s/^/tcand $1: /" | cut -c1-150
done 2>&1 | tee "$OUT/trace.log"
EPFUSE_CTEST_REGEX='^(gpu_fp8_tma_tile|test_gpu_(fused|fused_fp8)_w1|test_gpu_fused_(fp8_)?onegpu_w4|run_fused_fault_onegpu_w4_.*|run_fused_(fp8_)?w1_.*)$' \
  timeout 240 bash scripts/device-run.sh ctest > /dev/null 2>&1
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$OUT/ctest.log" | tail -12
gzip -f "$OUT/ctest.log"
(cd "$OUT" && tar czf json.tgz *.json && rm -f *.json)
