#!/usr/bin/env bash
# Session 19, call 3 (one GPU): (1) A/B, FP8 rows, three rounds interleaved, of the landing build 1d0677b
# (land: .carry/s19/land-epfuse) against exp/early-claim (early: the carried build; the next id claimed
# under the tile's loads, no weight preload when a tile's inputs are already in); (2) exp/early-claim's
# GPU tests (call 2's set). Everything under $OUT goes back as one tarball.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
S=$PWD/.carry/s19
bench() {  # tag bin round name H I E k T
  local tag=$1 bin=$2 round=$3 name=$4; shift 4
  timeout 90 $bin bench --impl fused --dtype fp8 --ranks 1 --torch off --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 \
    --hidden $1 --intermediate $2 --experts $3 --topk $4 --tokens $5 --json "$W/ab-$tag-$name-r$round.json" 2>&1 \
    | grep -E " fused |illegal|timed out|rror" | grep -v "freeing\|~Symm\|~Comm\|destroying\|config " | sed "s/^/$tag r$round $name: /" | cut -c1-150
}
for round in 1 2 3; do
  for tag in land early; do
    case $tag in land) bin=$S/land-epfuse ;; early) bin=$PWD/.carry/build/tools/epfuse ;; esac
    bench $tag $bin $round mixtral 4096 14336 2 2 4096
    bench $tag $bin $round dsv3 7168 2048 64 8 128,1024,4096
    bench $tag $bin $round qwen3 2048 768 32 8 128,16384
  done
done 2>&1 | tee "$W/ab.log"
echo "after A/B: $(( $(date +%s) - start )) s"
OUT=$W EPFUSE_CTEST_REGEX='^(gpu_fp8_tma_tile|test_gpu_fused_fp8_w1|test_gpu_fused_w1|test_gpu_faults_w1|run_fused_fp8_w1_.*|run_fused_w1_.*|test_gpu_fused_fp8_onegpu_w4|test_gpu_fused_onegpu_w4|test_gpu_faults_onegpu_w4|run_fused_fault_onegpu_w4.*|run_fused_fp8_onegpu_w2_.*|run_fused_onegpu_w2_.*|run_fused_fp8_onegpu_w8_.*)$' \
  timeout $(( 590 - ($(date +%s) - start) )) bash scripts/device-run.sh ctest > /dev/null 2>&1
echo "ctest rc=$? after $(( $(date +%s) - start )) s"
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$W/ctest.log" | tail -14
grep -cE "Test +#.*Passed" "$W/ctest.log"
gzip -f "$W/ctest.log"
tar czf "$OUT/call3.tgz" -C "$W" .
