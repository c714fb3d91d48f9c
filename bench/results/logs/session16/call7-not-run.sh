#!/usr/bin/env bash
# Session 16, call 7 (one GPU): PC sampling of the landed FP8 kernel (quarters; .carry/build, SASS = e9f6a65's)
# on the per-GPU mixtral shape at T=4096 (one launch under ncu), for the next session's k-loop work.
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 240 $ncu --clock-control none --section WarpStateStats --section SourceCounters --section SpeedOfLight --import-source no \
  -k regex:fused_moe_kernel --launch-skip 3 --launch-count 1 -f -o "$OUT/mixtral" .carry/build/tools/epfuse run --impl fused --dtype fp8 \
  --hidden 4096 --intermediate 14336 --experts 2 --topk 2 --ranks 1 --tokens 4096 --iters 5 --verify-rows 2 > "$OUT/ncu-mixtral.log" 2>&1
echo "mixtral exit $?"; tail -3 "$OUT/ncu-mixtral.log"
$ncu -i "$OUT/mixtral.ncu-rep" --page source --csv --print-source sass > "$OUT/mixtral-sass.csv" 2>&1
$ncu -i "$OUT/mixtral.ncu-rep" --page details > "$OUT/mixtral-details.txt" 2>&1; grep -E "Throughput|Duration|Issue|Warp Cycles" "$OUT/mixtral-details.txt" | head -20
python3 scripts/ncu_stalls.py "$OUT/mixtral-sass.csv" > "$OUT/mixtral-stalls.txt" 2>&1; head -50 "$OUT/mixtral-stalls.txt"
gzip -f "$OUT/mixtral-sass.csv"; rm -f "$OUT"/*.ncu-rep
