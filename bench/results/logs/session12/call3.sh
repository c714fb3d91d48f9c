#!/usr/bin/env bash
# Session 12, call 3 (one GPU): all Linear1 tiles first at world 1 (schedule_lag) against ca8c0c8's
# kernels (.carry/base12): A/B of the fused layer (bf16 and FP8, the per-GPU shapes, two rounds, base
# first), the in-kernel profile at qwen3 T=128, then the world-1 GPU tests and CLI matrices of this build.
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
for round in 1 2; do for tag in base new; do
  bin=$([ $tag = new ] && echo .carry/build/tools/epfuse || echo .carry/base12/epfuse)
  for shape in "qwen3 2048 768 32 8 128,4096,16384" "dsv3 7168 2048 64 8 128,1024,4096" "mixtral 4096 14336 2 2 4096"; do
    set -- $shape
    timeout 100 $bin bench --impl fused --dtype bf16,fp8 --ranks 1 --torch off --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 \
      --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$OUT/ab-$tag-$1-r$round.json" 2>&1 \
      | grep -E "^custom|rror" | sed "s/^/$tag r$round $1: /"
  done
done; done 2>&1 | tee "$OUT/ab.log" | cut -c1-120
for tag in base new; do
  bin=$([ $tag = new ] && echo .carry/build/tools/epfuse || echo .carry/base12/epfuse)
  EPFUSE_PROFILE=1 timeout 40 $bin bench --impl fused --dtype fp8 --ranks 1 --torch off --hidden 2048 \
    --intermediate 768 --experts 32 --topk 8 --tokens 128 2>&1 | grep -E "linear|combine|kernel" | sed "s/^/$tag: /"
done 2>&1 | tee "$OUT/profile-t128.log"
EPFUSE_CTEST_REGEX='^(test_gpu_(fused|fused_fp8)_w1|run_fused_(fp8_)?w1_.*|test_gpu_fused_(fp8_)?onegpu_w4)$' \
  timeout 200 bash scripts/device-run.sh ctest 2>&1 | tail -3
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$OUT/ctest.log" | tail -12
(cd "$OUT" && tar czf ab-json.tgz ab-*.json && rm -f ab-*.json)
