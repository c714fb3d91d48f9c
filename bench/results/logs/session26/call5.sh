#!/usr/bin/env bash
# Session 26, call 5 (nvidia-h200 asked): issue 13's open row on an H200, if one comes. On an H200: the
# mixtral per-GPU rows (fused and unfused, bf16 and FP8; synchronised medians and --sustained 1500) with
# this session's build (.carry/build.tar.xz, a41a28b), then the dsv3 and qwen3 FP8 rows with DeepGEMM and
# MegaMoE beside (.carry/peers.tgz) while time is left. On any other GPU: nothing (the name only).
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - start) )); }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
[[ "$gpu" == *H200* ]] || { echo "not an H200: nothing run"; exit 0; }
[ -d .carry/build ] || tar xJf .carry/build.tar.xz -C .carry
mkdir -p .peers && tar xzf .carry/peers.tgz -C .peers
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-} PATH=/opt/torch/.venv/bin:$PATH
CEIL=gemm=790,hbm=4250,nvlink=350,fp8=1447
BIN=.carry/build/tools/epfuse
timeout 150 $BIN bench --impl unfused,fused --dtype bf16,fp8 --ranks 1 --torch off --sustained 1500 --ceilings $CEIL \
  --hidden 4096 --intermediate 14336 --experts 2 --topk 2 --tokens 4096 --json "$W/table-mixtral.json" > "$W/table-mixtral.log" 2>&1
echo "mixtral: rc=$? after $(( $(date +%s) - start )) s"; grep -E "^(custom|config)" "$W/table-mixtral.log" | cut -c1-240
for shape in "dsv3 7168 2048 64 8 4096" "qwen3 2048 768 32 8 16384"; do set -- $shape
  [ $(left) -lt 60 ] && break
  timeout $(( $(left) - 10 )) $BIN bench --impl fused --dtype fp8 --ranks 1 --torch off --sustained 1500 --ceilings $CEIL \
    --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --peers $PWD/.peers --json "$W/table-$1.json" > "$W/table-$1.log" 2>&1
  echo "$1: rc=$? after $(( $(date +%s) - start )) s"; grep -E "^(custom|config|deepgemm|megamoe)" "$W/table-$1.log" | cut -c1-240
done
tar czf "$OUT/call5.tgz" -C "$W" .
