#!/usr/bin/env bash
# Session 23, call 5 (one GPU; nvidia-h200 asked). On an H200: call1.sh (issue 13's table) with main's CLI.
# Otherwise the L2 -> shared-memory bytes of the fused FP8 layer, bounded with the steady figure
# (--sustained 1500): main (.carry/s23/main-epfuse) against two diagnostic builds of main +
# diag-half.patch (never merged; their values are wrong by design): hb (one weight box a stage, both
# halves read it: a third fewer bytes a stage, what a 2-CTA weight multicast would save in L2 reads),
# ha (rows 0-63 of A copied, both groups read them: a sixth fewer). Two rounds, main first in each.
cd "$(dirname "$0")/../../../.."
here=$PWD/bench/results/logs/session23
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ "$gpu" == *H200* ]]; then cp .carry/s23/main-epfuse .carry/build/tools/epfuse; exec bash "$here/call1.sh"; fi
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
CEIL=gemm=790,hbm=4250,nvlink=350,fp8=1447
for round in 1 2; do for tag in main hb ha; do
  for shape in "mixtral 4096 14336 2 2 4096" "dsv3 7168 2048 64 8 4096" "qwen3 2048 768 32 8 16384"; do set -- $shape
    [ $(left) -lt 30 ] && break
    timeout 60 .carry/s23/$tag-epfuse bench --impl fused --dtype fp8 --ranks 1 --torch off --iters 20 --sustained 1500 --ceilings $CEIL \
      --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$W/ab-$tag-$1-r$round.json" 2>&1 \
      | grep -E " fused |rror" | sed "s/^/$tag r$round $1: /" | cut -c1-250
  done
done; done 2>&1 | tee $W/ab.log
echo "end: $(( $(date +%s) - start )) s"
tar czf "$OUT/call5.tgz" -C "$W" .
