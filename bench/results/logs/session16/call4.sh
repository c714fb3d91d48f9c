#!/usr/bin/env bash
# Session 16, call 4 (4 GPUs): c67a660 (.carry/build) over real NVLink at world 4: (1) the fused world-4
# GPU tests, bf16 and FP8 (test_gpu_fused{,_fp8}_w4, the CLI matrices run_fused{,_fp8}_w4_*, the
# process-mode fault test); (2) the seven FACTS rows, fused bf16 and FP8, this build then 81fa496's
# (.carry/base; FP8 kernels' SASS identical, the bf16 all-thread tiles without the evict_first hint).
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader; nvidia-smi topo -m | head -6
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-} PATH=/opt/torch/.venv/bin:$PATH
start=$(date +%s)
EPFUSE_CTEST_REGEX='^(test_gpu_fused_w4|test_gpu_fused_fp8_w4|test_gpu_faults_w4|run_fused_w4_.*|run_fused_fp8_w4_.*)$' \
  timeout 250 bash scripts/device-run.sh ctest > /dev/null 2>&1
echo "ctest rc=$? after $(( $(date +%s) - start )) s"
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$OUT/ctest.log" | tail -12
gzip -f "$OUT/ctest.log"
for tag in new base; do
  bin=$([ $tag = new ] && echo .carry/build/tools/epfuse || echo .carry/base/epfuse)
  left=$(( 585 - ($(date +%s) - start) )); [ $left -lt 30 ] && break
  timeout $left $bin bench --configs facts --impl fused --dtype bf16,fp8 --ranks 4 --torch off \
    --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 --json "$OUT/w4-$tag.json" > "$OUT/w4-$tag.log" 2>&1
  echo "$tag: rc=$? after $(( $(date +%s) - start )) s"
  grep -E "^(dsv3|qwen3|mixtral)" "$OUT/w4-$tag.log" | cut -c1-140
done
