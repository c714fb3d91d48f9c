#!/usr/bin/env bash
# Session 18, call 1 (one GPU): A from registers in the FP8 k-loop (exp/rs-a).
# (1) test_fp8_tile on the RS quarters; (2) A/B of 7c6d8aa (main) against exp/rs-a with the producer at
# 48 registers (rs48: math 232; the carried build) and at 56 (rs56: math 224), on the compute-bound FP8
# rows and qwen3 T=128, two rounds; (3) the FP8 GPU tests of the rs48 build.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
S=$PWD/.carry/s18
(cd .carry/build && timeout 60 tests/gpu/gemm/test_fp8_tile 2>&1 | tail -8)
bench() {  # tag bin round name H I E k T
  local tag=$1 bin=$2 round=$3 name=$4; shift 4
  timeout 90 $bin bench --impl fused --dtype fp8 --ranks 1 --torch off --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 \
    --hidden $1 --intermediate $2 --experts $3 --topk $4 --tokens $5 --json "$OUT/ab-$tag-$name-r$round.json" 2>&1 \
    | grep -E " fused |illegal|timed out|rror" | grep -v "freeing\|~Symm\|~Comm\|destroying\|config " | sed "s/^/$tag r$round $name: /" | cut -c1-150
}
for round in 1 2; do
  for tag in main rs48 rs56; do
    bin=$S/$tag-epfuse; [ $tag = rs48 ] && bin=$PWD/.carry/build/tools/epfuse
    bench $tag $bin $round mixtral 4096 14336 2 2 4096
    bench $tag $bin $round dsv3 7168 2048 64 8 4096
    bench $tag $bin $round qwen3 2048 768 32 8 128,16384
  done
done 2>&1 | tee "$OUT/ab.log"
echo "after A/B: $(( $(date +%s) - start )) s"
EPFUSE_CTEST_REGEX='^(gpu_fp8_tma_tile|test_gpu_fused_fp8_w1|test_gpu_faults_w1|run_fused_fp8_w1_.*|test_gpu_fused_fp8_onegpu_w4|run_fused_fp8_onegpu_w2_.*)$' \
  timeout $(( 580 - ($(date +%s) - start) )) bash scripts/device-run.sh ctest > /dev/null 2>&1
echo "ctest rc=$? after $(( $(date +%s) - start )) s"
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$OUT/ctest.log" | tail -14
grep -cE "Test +#.*Passed" "$OUT/ctest.log"
grep -E "TFLOP|bench K" "$OUT/ctest.log" | head -5
gzip -f "$OUT/ctest.log"
(cd "$OUT" && tar czf json.tgz *.json && rm -f *.json)
