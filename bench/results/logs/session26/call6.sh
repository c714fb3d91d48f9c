#!/usr/bin/env bash
# Session 26, call 6 (one GPU; nvidia-h200 asked): issue 13's world-1 table on the landing build
# (.carry/build.tar.xz: a41a28b) in one call, as session 19's call 5: fused and unfused, bf16 and FP8, on
# the per-GPU shapes; the dsv3 bench also runs DeepGEMM's grouped GEMMs alone and MegaMoE SM90 FP8 on
# every shape (--peers).
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
[ -d .carry/build ] || tar xJf .carry/build.tar.xz -C .carry
mkdir -p .peers && tar xzf .carry/peers.tgz -C .peers
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-} PATH=/opt/torch/.venv/bin:$PATH
for shape in "qwen3 2048 768 32 8 128,4096,16384 70" "mixtral 4096 14336 2 2 4096 100" "dsv3 7168 2048 64 8 128,1024,4096 0"; do
  set -- $shape
  limit=$7; [ "$limit" = 0 ] && limit=$(( 590 - ($(date +%s) - start) ))
  peers=$([ "$1" = dsv3 ] && echo "--peers $PWD/.peers")
  timeout $limit .carry/build/tools/epfuse bench --impl unfused,fused --dtype bf16,fp8 --ranks 1 --torch off \
    --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 \
    $peers --json "$W/table-$1.json" > "$W/table-$1.log" 2>&1
  echo "$1: rc=$? after $(( $(date +%s) - start )) s"
  grep -E "^(custom|qwen3|mixtral|dsv3|deepgemm|megamoe)" "$W/table-$1.log" | cut -c1-160 | tail -40
done
tar czf "$OUT/call6.tgz" -C "$W" .
