#!/usr/bin/env bash
# Session 26, call 3 (one GPU; nvidia-h200 asked). Diagnostic: main with kDispatchTokens 16 (.carry/d16)
# and 32 (.carry/d32) against main (.carry/base/epfuse, 647f081): the in-kernel phase profile, then
# synchronised and sustained ms. On an H200 issue 13's mixtral rows come first (main's CLI).
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - start) )); }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-} PATH=/opt/torch/.venv/bin:$PATH
CEIL=gemm=790,hbm=4250,nvlink=350,fp8=1447
declare -A BIN=([base]=.carry/base/epfuse [d16]=.carry/d16/epfuse [d32]=.carry/d32/epfuse)
if [[ "$gpu" == *H200* ]]; then
  timeout 150 ${BIN[base]} bench --impl unfused,fused --dtype bf16,fp8 --ranks 1 --torch off --sustained 1500 --ceilings $CEIL \
    --hidden 4096 --intermediate 14336 --experts 2 --topk 2 --tokens 4096 --json "$W/table-mixtral.json" > "$W/table-mixtral.log" 2>&1
  echo "mixtral: rc=$? after $(( $(date +%s) - start )) s"; grep -E "^(custom|config)" "$W/table-mixtral.log" | cut -c1-240
fi
SHAPES=("mixtral 4096 14336 2 2 4096" "dsv3 7168 2048 64 8 4096" "qwen3 2048 768 32 8 16384" "dsv3 7168 2048 64 8 128" "qwen3 2048 768 32 8 128")
for tag in base d16 d32; do
  for shape in "${SHAPES[@]}"; do set -- $shape
    EPFUSE_PROFILE=1 timeout 40 ${BIN[$tag]} bench --impl fused --dtype fp8 --ranks 1 --torch off --iters 30 --ceilings $CEIL \
      --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$W/sync-$tag-$1-t$6.json" > "$W/profile-$tag-$1-t$6.log" 2>&1
    echo "profile $tag $1 T=$6: $(grep -E 'dispatch ' "$W/profile-$tag-$1-t$6.log" | head -1 | cut -c10-) | linear1 first $(grep -E 'linear1 ' "$W/profile-$tag-$1-t$6.log" | head -1 | awk '{print $(NF-1)}') | median $(grep -E ' fused fp8' "$W/profile-$tag-$1-t$6.log" | awk '{print $5, $6, $7, $(NF-1)}')"
  done
done 2>&1 | tee "$W/profile.log"
for tag in base d32 base d32; do
  for shape in "${SHAPES[@]:0:3}"; do set -- $shape
    [ $(left) -lt 40 ] && break
    timeout 60 ${BIN[$tag]} bench --impl fused --dtype fp8 --ranks 1 --torch off --iters 30 --sustained 1500 --ceilings $CEIL \
      --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$W/ab-$tag-$1-t$6-$(date +%s).json" 2>&1 \
      | grep -E " fused |rror" | sed "s/^/$tag $1 T=$6: /" | cut -c1-250
  done
done 2>&1 | tee "$W/ab.log"
echo "end: $(( $(date +%s) - start )) s"
tar czf "$OUT/call3.tgz" -C "$W" .
