#!/usr/bin/env bash
# Session 14, call 1 (one GPU). .carry/build = exp/preload (weights of a tile's first k-blocks issued
# before its inputs are in), .carry/head = 78393aa's epfuse, .carry/trace = 78393aa + the task timeline
# (-DEPFUSE_TRACE=ON). (1) preload's GPU tests: the FP8 tile test (every second tile preloaded), world-1
# tests and CLI matrices, the one-GPU world-2/4/8 matrices and world-4 fault runs; (2) A/B head vs preload,
# bf16+fp8, T=128 (qwen3, dsv3), qwen3 4096, dsv3 1024, two rounds; (3) the trace at T=128 (qwen3, dsv3;
# fp8 and bf16) with its bench medians.
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
EPFUSE_CTEST_REGEX='^(gpu_fp8_tma_tile|test_gpu_(fused|fused_fp8)_w1|test_gpu_fused_(fp8_)?onegpu_w4|run_fused_(fp8_)?(w1|onegpu_w2|onegpu_w8)_.*|run_fused_fault_onegpu_w4_.*)$' \
  timeout 330 bash scripts/device-run.sh ctest > /dev/null 2>&1
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$OUT/ctest.log" | tail -12
gzip -f "$OUT/ctest.log"
bench() {  # tag bin dtype shape H I E k T
  local tag=$1 bin=$2 dt=$3; shift 3
  timeout 150 $bin bench --impl fused --dtype $dt --ranks 1 --torch off --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 \
    --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$OUT/ab-$tag-$1-r$round.json" 2>&1 \
    | grep -E "^custom|illegal instruction|timed out|rror" | grep -v "freeing\|~Symm\|~Comm\|destroying" | sed "s/^/$tag r$round $1: /" | cut -c1-170
}
for round in 1 2; do for tag in head preload; do
  bin=$([ $tag = preload ] && echo .carry/build/tools/epfuse || echo .carry/head/epfuse)
  for shape in "qwen3 2048 768 32 8 128,4096" "dsv3 7168 2048 64 8 128,1024"; do bench $tag $bin bf16,fp8 $shape; done
done; done 2>&1 | tee "$OUT/ab.log"
for shape in "qwen3 2048 768 32 8" "dsv3 7168 2048 64 8"; do set -- $shape
  EPFUSE_TRACE_FILE=$OUT/trace.csv timeout 90 .carry/trace/epfuse bench --impl fused --dtype bf16,fp8 --ranks 1 --torch off \
    --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens 128 \
    2>&1 | grep -E "^custom|rror" | sed "s/^/trace $1: /" | cut -c1-170
  EPFUSE_PROFILE=1 timeout 60 .carry/build/tools/epfuse bench --impl fused --dtype fp8 --ranks 1 --torch off --hidden $2 \
    --intermediate $3 --experts $4 --topk $5 --tokens 128 2>&1 | grep -E "collect|dispatch|linear|combine|kernel" | sed "s/^/profile preload $1: /"
done 2>&1 | tee "$OUT/trace.log"
(cd "$OUT" && tar czf json.tgz *.json && rm -f *.json)
