#!/usr/bin/env bash
# Session 10, call 1 (nvidia-h200): correctness of the padding-warpgroup skip, then an A/B against 6c20b52.
cd "$(dirname "$0")/.."
repo=$PWD
export EPFUSE_CTEST_REGEX='^(gpu_fp8_tma_tile|gpu_fp8_tile|test_gpu_fused_w1|test_gpu_fused_fp8_w1|test_gpu_fused_onegpu_w4|test_gpu_fused_fp8_onegpu_w4|run_fused_fp8_w1_.*|run_fused_w1_.*)$'
timeout 200 bash scripts/device-run.sh ctest
cd "$(sed -n 's/^CMAKE_CACHEFILE_DIR:INTERNAL=//p' .carry/build/CMakeCache.txt)"
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
ab() {  # tag dtype h i e k tokens round
  local bin=tools/epfuse; [ $1 = base ] && bin=$repo/.carry/base/epfuse
  timeout 100 $bin bench --impl fused --ranks 1 --torch off --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 --dtype $2 \
    --hidden $3 --intermediate $4 --experts $5 --topk $6 --tokens $7 --json "$OUT/ab/$1-$2-$3-r$8.json" 2>&1 | grep -E " fused|rror" | sed "s/^/$1 r$8: /"
}
timeout 60 tests/gpu/gemm/test_fp8_tma_tile 2>&1 | tee $OUT/fp8-tma-tile.log | tail -8
mkdir -p $OUT/ab
for r in 1 2; do for tag in base new; do
  ab $tag fp8 7168 2048 64 8 128,1024,4096 $r
  ab $tag fp8 2048 768 32 8 128,4096,16384 $r
  ab $tag bf16 7168 2048 64 8 128 $r
  ab $tag bf16 2048 768 32 8 128 $r
done; done 2>&1 | tee $OUT/ab.log
tar czf $OUT/ab-json.tgz -C $OUT ab && rm -rf $OUT/ab
