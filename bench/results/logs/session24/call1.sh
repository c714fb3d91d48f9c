#!/usr/bin/env bash
# Session 24, call 1 (one GPU; nvidia-h200 asked). exp/weight-multicast (the FP8 kernel in 2-CTA clusters,
# each CTA loading one of a stage's two weight boxes into both CTAs' stages): its GPU tests (FP8 tiles,
# the FP8 layer at world 1 and in the one-GPU mode at worlds 2/4/8, the world-1 and one-GPU world-4 FP8 CLI
# matrices, padded sizes, and the bf16 layer and fault tests whose ring code changed), then an A/B against
# main (.carry/s23/main-epfuse): sustained ms on the three compute-bound rows, synchronised medians on the
# decode rows (T = 128, where every cluster task has a weights-only partner). Logs under $OUT as one tarball.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
export PATH=/opt/torch/.venv/bin:$PATH
re='^(gpu_fp8_tile|gpu_fp8_tma_tile|test_gpu_fused_fp8_w1|test_gpu_fused_fp8_onegpu_w[248]|test_gpu_fused_w1|test_gpu_fused_onegpu_w4|test_gpu_faults_w1|test_gpu_faults_onegpu_w4|run_fused_fp8_w1_|run_fused_padded_fp8_w1_|run_fused_fp8_onegpu_w4_)'
OUT=$W EPFUSE_CTEST_REGEX="$re" timeout 330 bash scripts/device-run.sh ctest > "$W/ctest-run.log" 2>&1
echo "ctest: rc=$? after $(( $(date +%s) - start )) s"
grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout" "$W"/ctest*.log | head -40
CEIL=gemm=790,hbm=4250,nvlink=350,fp8=1447
NEW=.carry/build/tools/epfuse BASE=.carry/s23/main-epfuse
for tag in main mc; do bin=$([ $tag = main ] && echo $BASE || echo $NEW)
  for shape in "mixtral 4096 14336 2 2 4096 --sustained 1500" "dsv3 7168 2048 64 8 4096 --sustained 1500" \
               "qwen3 2048 768 32 8 16384 --sustained 1500" "dsv3 7168 2048 64 8 128" "qwen3 2048 768 32 8 128"; do set -- $shape
    [ $(left) -lt 25 ] && break
    timeout 60 $bin bench --impl fused --dtype fp8 --ranks 1 --torch off --iters 30 ${7:-} ${8:-} --ceilings $CEIL \
      --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$W/ab-$tag-$1-t$6.json" 2>&1 \
      | grep -E " fused |rror" | sed "s/^/$tag $1 T=$6: /" | cut -c1-250
  done
done 2>&1 | tee $W/ab.log
echo "end: $(( $(date +%s) - start )) s"
tar czf "$OUT/call1.tgz" -C "$W" .
