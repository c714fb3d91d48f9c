#!/usr/bin/env bash
# Session 13, call 1 (one GPU): the L2 weight prefetch (prefetch.cuh) against 9e2c663's kernels
# (.carry/base13): FP8 at T=128 (qwen3, dsv3) and dsv3 T=1024, base / new (heuristic) / new with
# EPFUSE_L2_PREFETCH_KBLOCKS forced, two rounds; the in-kernel profile at T=128; then this build's GPU
# tests at world 1 and the one-GPU CLI matrices at worlds 2 and 8 (not run since 9e2c663).
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
NEW=.carry/build/tools/epfuse; BASE=.carry/base13/epfuse
run() {  # tag kb shape H I E k T
  local tag=$1 kb=$2 bin=$NEW; shift 2
  [ $tag = base ] && bin=$BASE
  local env=(); [ "$kb" != "-" ] && env=(EPFUSE_L2_PREFETCH_KBLOCKS=$kb)
  env "${env[@]}" timeout 90 $bin bench --impl fused --dtype fp8 --ranks 1 --torch off \
    --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 --hidden $2 --intermediate $3 --experts $4 --topk $5 \
    --tokens $6 --json "$OUT/ab-$tag-kb$kb-$1-t$6-r$round.json" 2>&1 | grep -E "^custom|rror" | sed "s/^/$tag kb=$kb r$round $1: /"
}
for round in 1 2; do
  for v in "base -" "new -" "new 0" "new 3" "new 10" "new 16"; do run $v qwen3 2048 768 32 8 128; done
  for v in "base -" "new -" "new 0" "new 12"; do run $v dsv3 7168 2048 64 8 128; done
  for v in "base -" "new -" "new 4"; do run $v dsv3 7168 2048 64 8 1024; done
done 2>&1 | tee "$OUT/ab.log" | cut -c1-150
for shape in "qwen3 2048 768 32 8" "dsv3 7168 2048 64 8"; do set -- $shape; for tag in base new; do
  bin=$([ $tag = new ] && echo $NEW || echo $BASE)
  EPFUSE_PROFILE=1 timeout 60 $bin bench --impl fused --dtype fp8 --ranks 1 --torch off --hidden $2 \
    --intermediate $3 --experts $4 --topk $5 --tokens 128 2>&1 | grep -E "collect|dispatch|linear|combine|kernel" | sed "s/^/$1 $tag: /"
done; done 2>&1 | tee "$OUT/profile-t128.log"
EPFUSE_CTEST_REGEX='^(test_gpu_(fused|fused_fp8)_w1|test_gpu_fused_(fp8_)?onegpu_w4|run_fused_(fp8_)?(w1|onegpu_w2|onegpu_w8)_.*|run_fused_padded_(bf16|fp8)_(w1|onegpu).*)$' \
  timeout 330 bash scripts/device-run.sh ctest 2>&1 | tail -3
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$OUT/ctest.log" | tail -12
(cd "$OUT" && tar czf ab-json.tgz ab-*.json && rm -f ab-*.json)
