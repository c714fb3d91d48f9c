#!/usr/bin/env bash
# Session 17, call 2 (one GPU): (1) PC sampling (ncu SourceCounters, WarpStateStats) of the fused FP8
# kernel (770437d) at mixtral T=4096; (2) the diagnostic builds EPFUSE_DIAG_HALF_B (one weight box a
# stage, read twice) and EPFUSE_DIAG_HALF_A (64 A rows a stage, read by both math groups) against
# 770437d on mixtral and dsv3 T=4096, two rounds: how the k-loop's time moves with the bytes a stage
# brings through L2 (their results are wrong: time only).
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
S=.carry/s17
bench() {  # tag bin round name H I E k T
  local tag=$1 bin=$2 round=$3 name=$4; shift 4
  timeout 90 $bin bench --impl fused --dtype fp8 --ranks 1 --torch off --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 \
    --hidden $1 --intermediate $2 --experts $3 --topk $4 --tokens $5 --json "$OUT/ab-$tag-$name-r$round.json" 2>&1 \
    | grep -E " fused |illegal|timed out|rror" | grep -v "freeing\|~Symm\|~Comm\|destroying\|config " | sed "s/^/$tag r$round $name: /" | cut -c1-150
}
for round in 1 2; do
  for tag in main halfb halfa; do
    bench $tag $S/$tag-epfuse $round mixtral 4096 14336 2 2 4096
    bench $tag $S/$tag-epfuse $round dsv3 7168 2048 64 8 4096
  done
done 2>&1 | tee "$OUT/ab.log"
echo "after A/B: $(( $(date +%s) - start )) s"
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 240 $ncu --clock-control none --section WarpStateStats --section SourceCounters --import-source no \
  -k regex:fused_moe_kernel --launch-skip 3 --launch-count 1 -f -o "$OUT/mixtral" $S/main-epfuse run --impl fused --dtype fp8 \
  --hidden 4096 --intermediate 14336 --experts 2 --topk 2 --ranks 1 --tokens 4096 --iters 5 --verify-rows 2 > "$OUT/ncu-mixtral.log" 2>&1
echo "ncu exit $? after $(( $(date +%s) - start )) s"
$ncu -i "$OUT/mixtral.ncu-rep" --page source --csv --print-source sass > "$OUT/mixtral-sass.csv" 2>&1
$ncu -i "$OUT/mixtral.ncu-rep" --page details > "$OUT/mixtral-details.txt" 2>&1
grep -E "Warp Cycles|Issue|Active|Eligible" "$OUT/mixtral-details.txt" | head -12
python3 scripts/ncu_stalls.py "$OUT/mixtral-sass.csv" > "$OUT/mixtral-stalls.txt" 2>&1; head -40 "$OUT/mixtral-stalls.txt"
gzip -f "$OUT/mixtral-sass.csv"; rm -f "$OUT"/*.ncu-rep
(cd "$OUT" && tar czf json.tgz *.json && rm -f *.json)
echo "total $(( $(date +%s) - start )) s"
