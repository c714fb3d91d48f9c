#!/usr/bin/env bash
# Session 18, call 3 (one GPU): the warp-specialised tiles' epilogues straight from the registers
# (exp/direct-epi: FragmentStores, the FP8 h codes by the same quad transpose; no staging, one barrier).
# (1) A/B of main (d47ffd3's kernels = 7c6d8aa's) against exp/direct-epi (the carried build): FP8 on
# mixtral, dsv3 T=1024/4096, qwen3 T=128/16384, two rounds; bf16 on dsv3 T=4096 and mixtral, one round;
# (2) the GPU tests of exp/direct-epi that cover these epilogues, as far as the time allows.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
S=$PWD/.carry/s18
bench() {  # tag bin round dtype name H I E k T
  local tag=$1 bin=$2 round=$3 dtype=$4 name=$5; shift 5
  timeout 90 $bin bench --impl fused --dtype $dtype --ranks 1 --torch off --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 \
    --hidden $1 --intermediate $2 --experts $3 --topk $4 --tokens $5 --json "$OUT/ab-$tag-$dtype-$name-r$round.json" 2>&1 \
    | grep -E " fused |illegal|timed out|rror" | grep -v "freeing\|~Symm\|~Comm\|destroying\|config " | sed "s/^/$tag r$round $name: /" | cut -c1-150
}
for round in 1 2; do
  for tag in main epi; do
    bin=$S/main-epfuse; [ $tag = epi ] && bin=$PWD/.carry/build/tools/epfuse
    bench $tag $bin $round fp8 mixtral 4096 14336 2 2 4096
    bench $tag $bin $round fp8 dsv3 7168 2048 64 8 1024,4096
    bench $tag $bin $round fp8 qwen3 2048 768 32 8 128,16384
    [ $round = 1 ] && bench $tag $bin $round bf16 dsv3 7168 2048 64 8 4096
    [ $round = 1 ] && bench $tag $bin $round bf16 mixtral 4096 14336 2 2 4096
  done
done 2>&1 | tee "$OUT/ab.log"
echo "after A/B: $(( $(date +%s) - start )) s"
EPFUSE_CTEST_REGEX='^(test_gpu_fused_fp8_w1|test_gpu_fused_w1|test_gpu_faults_w1|run_fused_fp8_w1_.*|run_fused_w1_.*|test_gpu_fused_fp8_onegpu_w4|test_gpu_fused_onegpu_w4|run_fused_fp8_onegpu_w2_.*|run_fused_onegpu_w2_.*)$' \
  timeout $(( 585 - ($(date +%s) - start) )) bash scripts/device-run.sh ctest > /dev/null 2>&1
echo "ctest rc=$? after $(( $(date +%s) - start )) s"
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$OUT/ctest.log" | tail -14
grep -cE "Test +#.*Passed" "$OUT/ctest.log"
gzip -f "$OUT/ctest.log"
