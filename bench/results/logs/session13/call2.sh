#!/usr/bin/env bash
# Session 13, call 2 (one GPU): tiles start their k-loops at different k-blocks (first_k_block) against
# 9e2c663's kernels (.carry/base13): every per-GPU shape, bf16 and FP8, two rounds, base first; the
# in-kernel profile at qwen3 T=128; before them this build's tile test, world-1 GPU tests and CLI matrices.
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
NEW=.carry/build/tools/epfuse; BASE=.carry/base13/epfuse
EPFUSE_CTEST_REGEX='^(gpu_fp8_tma_tile|test_gpu_(fused|fused_fp8)_w1|test_gpu_fused_(fp8_)?onegpu_w4|run_fused_(fp8_)?w1_.*|run_fused_fp8_onegpu_w8_.*|run_fused_padded_fp8_w1.*)$' \
  timeout 200 bash scripts/device-run.sh ctest 2>&1 | tail -3
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$OUT/ctest.log" | tail -12
for round in 1 2; do for tag in base new; do
  bin=$([ $tag = new ] && echo $NEW || echo $BASE)
  for shape in "qwen3 2048 768 32 8 128,4096,16384" "dsv3 7168 2048 64 8 128,1024,4096" "mixtral 4096 14336 2 2 4096"; do
    set -- $shape
    timeout 150 $bin bench --impl fused --dtype bf16,fp8 --ranks 1 --torch off --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 \
      --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$OUT/ab-$tag-$1-r$round.json" 2>&1 \
      | grep -E "^custom|rror" | sed "s/^/$tag r$round $1: /"
  done
done; done 2>&1 | tee "$OUT/ab.log" | cut -c1-110
for tag in base new; do
  bin=$([ $tag = new ] && echo $NEW || echo $BASE)
  EPFUSE_PROFILE=1 timeout 60 $bin bench --impl fused --dtype fp8 --ranks 1 --torch off --hidden 2048 \
    --intermediate 768 --experts 32 --topk 8 --tokens 128 2>&1 | grep -E "layout|collect|dispatch|linear|combine|kernel" | sed "s/^/qwen3 $tag: /"
done 2>&1 | tee "$OUT/profile-t128.log"
(cd "$OUT" && tar czf ab-json.tgz ab-*.json && rm -f ab-*.json)
