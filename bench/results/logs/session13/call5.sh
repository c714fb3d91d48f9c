#!/usr/bin/env bash
# Session 13, call 5 (one GPU): what lands (408fb83: tma_weight_rows; the FP8 kernel's SASS equal to
# 9e2c663's): its world-1 GPU tests, the one-GPU world-4 tests and the world-1 CLI matrices, then
# qwen3 and dsv3 at T=128 against 9e2c663's binary (.carry/base13), bf16 and FP8, two rounds.
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
EPFUSE_CTEST_REGEX='^(gpu_fp8_tma_tile|test_gpu_(fused|fused_fp8)_w1|test_gpu_fused_(fp8_)?onegpu_w4|run_fused_(fp8_)?w1_.*)$' \
  timeout 200 bash scripts/device-run.sh ctest 2>&1 | tail -2
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$OUT/ctest.log" | tail -8
NEW=.carry/build/tools/epfuse; BASE=.carry/base13/epfuse
for round in 1 2; do for tag in base new; do
  bin=$([ $tag = new ] && echo $NEW || echo $BASE)
  for shape in "qwen3 2048 768 32 8" "dsv3 7168 2048 64 8"; do set -- $shape
    timeout 100 $bin bench --impl fused --dtype bf16,fp8 --ranks 1 --torch off --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 \
      --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens 128 --json "$OUT/ab-$tag-$1-r$round.json" 2>&1 \
      | grep -E "^custom|rror" | sed "s/^/$tag r$round $1: /"
  done
done; done 2>&1 | tee "$OUT/ab.log" | cut -c1-110
(cd "$OUT" && tar czf ab-json.tgz ab-*.json && rm -f ab-*.json)
