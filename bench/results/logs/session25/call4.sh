#!/usr/bin/env bash
# Session 25, call 4 (session 24 call 7 unchanged; nvidia-h200-x2 asked, GPU 0 only): issue 13's open row on an H200, if one comes. On an H200:
# the mixtral per-GPU rows (fused and unfused, bf16 and FP8) with main's CLI (.carry/s23/main-epfuse,
# the kernel of 94dc954), synchronised medians and --sustained 1500; then the dsv3 rows with DeepGEMM
# and MegaMoE beside (.carry/peers.tgz) while time is left. On any other GPU: nothing (the name only).
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - start) )); }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
[[ "$gpu" == *H200* ]] || { echo "not an H200: nothing run"; exit 0; }
mkdir -p .peers && tar xzf .carry/peers.tgz -C .peers
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-} PATH=/opt/torch/.venv/bin:$PATH
CEIL=gemm=790,hbm=4250,nvlink=350,fp8=1447
BIN=.carry/s23/main-epfuse
timeout 150 $BIN bench --impl unfused,fused --dtype bf16,fp8 --ranks 1 --torch off --sustained 1500 --ceilings $CEIL \
  --hidden 4096 --intermediate 14336 --experts 2 --topk 2 --tokens 4096 --json "$W/table-mixtral.json" > "$W/table-mixtral.log" 2>&1
echo "mixtral: rc=$? after $(( $(date +%s) - start )) s"; grep -E "^(custom|config)" "$W/table-mixtral.log" | cut -c1-240
timeout $(( $(left) - 10 )) $BIN bench --impl fused --dtype fp8 --ranks 1 --torch off --sustained 1500 --ceilings $CEIL \
  --hidden 7168 --intermediate 2048 --experts 64 --topk 8 --tokens 4096 --peers $PWD/.peers --json "$W/table-dsv3.json" > "$W/table-dsv3.log" 2>&1
echo "dsv3: rc=$? after $(( $(date +%s) - start )) s"; grep -E "^(custom|config|deepgemm|megamoe)" "$W/table-dsv3.log" | cut -c1-240
tar czf "$OUT/call4.tgz" -C "$W" .
