#!/usr/bin/env bash
# Session 12, call 4 (one GPU): the world-1 schedule without the serial pass against 30689ed's kernels
# (.carry/lag): A/B at the rows the collect gates (T=128, dsv3 T=1024) plus qwen3 and dsv3 T=4096, bf16
# and FP8, two rounds, base first; the in-kernel profile at T=128; then this build's world-1 GPU tests.
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
for round in 1 2; do for tag in base new; do
  bin=$([ $tag = new ] && echo .carry/build/tools/epfuse || echo .carry/lag/epfuse)
  for shape in "qwen3 2048 768 32 8 128,4096" "dsv3 7168 2048 64 8 128,1024,4096"; do
    set -- $shape
    timeout 100 $bin bench --impl fused --dtype bf16,fp8 --ranks 1 --torch off --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 \
      --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$OUT/ab-$tag-$1-r$round.json" 2>&1 \
      | grep -E "^custom|rror" | sed "s/^/$tag r$round $1: /"
  done
done; done 2>&1 | tee "$OUT/ab.log" | cut -c1-120
for shape in "qwen3 2048 768 32 8" "dsv3 7168 2048 64 8"; do set -- $shape; for tag in base new; do
  bin=$([ $tag = new ] && echo .carry/build/tools/epfuse || echo .carry/lag/epfuse)
  EPFUSE_PROFILE=1 timeout 40 $bin bench --impl fused --dtype fp8 --ranks 1 --torch off --hidden $2 \
    --intermediate $3 --experts $4 --topk $5 --tokens 128 2>&1 | grep -E "collect|dispatch|linear|combine|kernel" | sed "s/^/$1 $tag: /"
done; done 2>&1 | tee "$OUT/profile-t128.log"
EPFUSE_CTEST_REGEX='^(test_gpu_(fused|fused_fp8)_w1|run_fused_(fp8_)?w1_.*|test_gpu_fused_(fp8_)?onegpu_w4)$' \
  timeout 200 bash scripts/device-run.sh ctest 2>&1 | tail -3
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$OUT/ctest.log" | tail -12
(cd "$OUT" && tar czf ab-json.tgz ab-*.json && rm -f ab-*.json)
