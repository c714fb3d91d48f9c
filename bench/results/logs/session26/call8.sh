#!/usr/bin/env bash
# Session 26, call 8 (one GPU; nvidia-h200 asked): a41a28b (.carry/a41) and q8 (.carry/q8: a41a28b + the
# quantisation's steps side by side, 8 a batch) alternately, two rounds, sustained ms on the three
# compute-bound rows.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-} PATH=/opt/torch/.venv/bin:$PATH
CEIL=gemm=790,hbm=4250,nvlink=350,fp8=1447
declare -A BIN=([a41]=.carry/a41/epfuse [q8]=.carry/q8/epfuse)
SHAPES=("mixtral 4096 14336 2 2 4096" "qwen3 2048 768 32 8 16384" "dsv3 7168 2048 64 8 4096")
for round in 1 2; do for tag in q8 a41; do
  for shape in "${SHAPES[@]}"; do set -- $shape
    [ $(left) -lt 30 ] && break
    timeout 60 ${BIN[$tag]} bench --impl fused --dtype fp8 --ranks 1 --torch off --iters 30 --sustained 1500 --ceilings $CEIL \
      --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$W/ab-$tag-$1-t$6-r$round.json" 2>&1 \
      | grep -E " fused |rror" | sed "s/^/$tag r$round $1 T=$6: /" | cut -c1-250
  done
done; done 2>&1 | tee "$W/ab.log"
echo "end: $(( $(date +%s) - start )) s"
tar czf "$OUT/call8.tgz" -C "$W" .
