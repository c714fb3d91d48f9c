#!/usr/bin/env bash
# Session 11, call 2: A/B of the FP8 tile's mainloop. v0 = 4318191 (base), v1 = desc_advance on the low
# word only, v2 = v1 + the two math warpgroups taking turns (issue_order.h). The FP8 tile alone
# (test_fp8_tma_tile: correctness + 1056-tile timing) and the fused FP8 layer (bench, verified).
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm --format=csv,noheader
for v in v0 v1 v2; do
  timeout 60 .carry/ab/$v/test_fp8_tma_tile > "$OUT/tile-$v.log" 2>&1; echo "$v tile exit $?"
  grep -E "bench|FAIL|overall|differing" "$OUT/tile-$v.log" | sed "s/^/$v: /" | head -12
done
for round in 1 2; do for v in v0 v1 v2; do
  for shape in "dsv3 7168 2048 64 8 128,1024,4096" "mixtral 4096 14336 2 2 4096" "qwen3 2048 768 32 8 16384"; do
    set -- $shape
    timeout 100 .carry/ab/$v/epfuse bench --impl fused --dtype fp8 --ranks 1 --torch off \
      --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 \
      --json "$OUT/ab-$v-$1-r$round.json" 2>&1 | grep -E "fused fp8|rror|verif" | sed "s/^/$v r$round $1: /"
  done
done; done 2>&1 | tee "$OUT/ab.log"
(cd "$OUT" && tar czf ab-json.tgz ab-*.json && rm -f ab-*.json)
