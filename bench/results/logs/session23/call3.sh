#!/usr/bin/env bash
# Session 23, call 3 (one GPU; nvidia-h200 asked). On an H200: call1.sh (issue 13's table) with main's CLI.
# Otherwise exp/desc-early (.carry/build: the k-block's descriptors made before its full-barrier wait,
# its scale reads issued after the first half's MMAs): its FP8 tests (both FP8 tile tests, the world-1
# and one-GPU world-4 FP8 layer tests, the world-1 FP8 CLI matrices), then an A/B against main
# (.carry/s23/main-epfuse) back to back (--sustained 1500), two rounds. Everything under $OUT as one tarball.
cd "$(dirname "$0")/../../../.."
here=$PWD/bench/results/logs/session23
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ "$gpu" == *H200* ]]; then cp .carry/s23/main-epfuse .carry/build/tools/epfuse; exec bash "$here/call1.sh"; fi
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
OUT=$W EPFUSE_CTEST_REGEX='^(gpu_fp8_tile|gpu_fp8_tma_tile|test_gpu_fused_fp8_w1|test_gpu_fused_fp8_onegpu_w4|run_fused_fp8_w1_|run_fused_padded_fp8_w1_)' \
  timeout 300 bash scripts/device-run.sh ctest 2>&1 | tail -8
gzip -f $W/ctest.log
echo "tests done after $(( $(date +%s) - start )) s"
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
CEIL=gemm=790,hbm=4250,nvlink=350,fp8=1447
for round in 1 2; do for tag in main desc; do
  bin=$([ $tag = desc ] && echo .carry/build/tools/epfuse || echo .carry/s23/main-epfuse)
  for shape in "mixtral 4096 14336 2 2 4096" "dsv3 7168 2048 64 8 4096" "qwen3 2048 768 32 8 16384"; do set -- $shape
    [ $(left) -lt 30 ] && break
    timeout 60 $bin bench --impl fused --dtype fp8 --ranks 1 --torch off --iters 30 --sustained 1500 --ceilings $CEIL \
      --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$W/ab-$tag-$1-r$round.json" 2>&1 \
      | grep -E " fused |rror" | sed "s/^/$tag r$round $1: /" | cut -c1-250
  done
done; done 2>&1 | tee $W/ab.log
echo "end: $(( $(date +%s) - start )) s"
tar czf "$OUT/call3.tgz" -C "$W" .
