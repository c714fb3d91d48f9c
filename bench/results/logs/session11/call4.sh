#!/usr/bin/env bash
# Session 11, call 4: where the small-T rows spend their time (4318191): the in-kernel profile
# (EPFUSE_PROFILE=1: per phase ms/SM, waits, first start / last end) at qwen3 and dsv3 T=128, FP8 and
# bf16; then ncu PC sampling of the fused FP8 kernel at qwen3 T=128 (per-GPU shape).
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm --format=csv,noheader
B=.carry/build/tools/epfuse
for shape in "qwen3 2048 768 32 8" "dsv3 7168 2048 64 8"; do set -- $shape
  for dt in fp8 bf16; do
    echo "=== $1 $dt T=128"
    EPFUSE_PROFILE=1 timeout 120 $B bench --impl fused --dtype $dt --ranks 1 --torch off --hidden $2 --intermediate $3 \
      --experts $4 --topk $5 --tokens 128 2>&1 | grep -v "^\s*$" | tail -32
  done
done 2>&1 | tee "$OUT/profile-t128.log" | tail -100
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 150 $ncu --clock-control none --section WarpStateStats --section SourceCounters --import-source no \
  -k regex:fused_moe_kernel --launch-skip 3 --launch-count 1 -f -o "$OUT/q128" $B run --impl fused --dtype fp8 --hidden 2048 \
  --intermediate 768 --experts 32 --topk 8 --ranks 1 --tokens 128 --iters 5 --verify-rows 2 > "$OUT/ncu-q128.log" 2>&1; echo "q128 exit $?"
$ncu -i "$OUT/q128.ncu-rep" --page source --csv --print-source sass > "$OUT/q128-sass.csv" 2>&1
(cd "$OUT" && tar czf q128.tgz q128-sass.csv && rm -f q128.ncu-rep q128-sass.csv)
