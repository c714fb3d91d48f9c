#!/usr/bin/env bash
# Session 11, call 5: combine tasks sized to the grid (this build) against 4318191 (.carry/base11):
# GPU tests at world 1, an A/B of the fused layer (bf16 and FP8, the per-GPU shapes, two rounds, base
# first), the in-kernel profile at T=128, then the CLI matrices (world 1, one-GPU worlds 4 and 8).
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
EPFUSE_CTEST_REGEX='^test_gpu_(fused|fused_fp8|faults)_w1$' timeout 150 bash scripts/device-run.sh ctest 2>&1 | tail -6
for round in 1 2; do for tag in base new; do
  bin=$([ $tag = new ] && echo .carry/build/tools/epfuse || echo .carry/base11/epfuse)
  for shape in "dsv3 7168 2048 64 8 128,1024,4096" "qwen3 2048 768 32 8 128,4096,16384" "mixtral 4096 14336 2 2 4096"; do
    set -- $shape
    timeout 120 $bin bench --impl fused --dtype bf16,fp8 --ranks 1 --torch off --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 \
      --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$OUT/ab-$tag-$1-r$round.json" 2>&1 \
      | grep -E "^custom|rror" | sed "s/^/$tag r$round $1: /"
  done
done; done 2>&1 | tee "$OUT/ab.log" | cut -c1-150
for shape in "qwen3 2048 768 32 8" "dsv3 7168 2048 64 8"; do set -- $shape
  EPFUSE_PROFILE=1 timeout 60 .carry/build/tools/epfuse bench --impl fused --dtype fp8 --ranks 1 --torch off --hidden $2 \
    --intermediate $3 --experts $4 --topk $5 --tokens 128 2>&1 | grep -E "combine|linear2|kernel" | sed "s/^/$1: /"
done 2>&1 | tee "$OUT/profile-t128.log"
# device-run.sh made the dev machine's build path valid here: ctest directly, without the heavy shapes.
bindir=$(sed -n 's/^CMAKE_CACHEFILE_DIR:INTERNAL=//p' .carry/build/CMakeCache.txt)
(cd "$bindir" && timeout 270 ctest -R '^(run_fused_(fp8_)?w1_|run_fused_(fp8_)?onegpu_w(4|8)_|test_gpu_fused_(fp8_)?onegpu_w4$|test_gpu_faults_onegpu_w4$)' \
  -E '_(dsv3|mixtral|qwen3|qwen3-30b)$' --timeout 120 --output-on-failure > "$OUT/matrix.log" 2>&1; echo "ctest exit $?")
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$OUT/matrix.log" | tail -12
(cd "$OUT" && tar czf ab-json.tgz ab-*.json && rm -f ab-*.json)
