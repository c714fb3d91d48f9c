#!/usr/bin/env bash
# Session 11, call 1: where the FP8 k-loop waits (ncu source-level stall sampling on the FP8 tile alone and
# on the fused FP8 kernel at dsv3 T=4096), then the one-GPU-mode matrices at worlds 2 and 8 not yet run
# after 6bcb123's kernel change.
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm --format=csv,noheader
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1); echo "ncu=$ncu"
B=.carry/build
sec="--section WarpStateStats --section SourceCounters --section SpeedOfLight --section InstructionStats"
timeout 120 $ncu --clock-control none $sec --import-source no -k regex:fp8_tma_tile_kernel --launch-skip 6 --launch-count 1 \
  -f -o "$OUT/tile" $B/tests/gpu/gemm/test_fp8_tma_tile > "$OUT/ncu-tile.log" 2>&1; echo "tile exit $?"; tail -3 "$OUT/ncu-tile.log"
timeout 200 $ncu --clock-control none $sec --import-source no -k regex:fused_moe_kernel --launch-skip 3 --launch-count 1 \
  -f -o "$OUT/fused" $B/tools/epfuse run --impl fused --dtype fp8 --model dsv3 --ranks 1 --tokens 4096 --iters 5 --verify-rows 2 \
  > "$OUT/ncu-fused.log" 2>&1; echo "fused exit $?"; tail -3 "$OUT/ncu-fused.log"
for r in tile fused; do
  [ -f "$OUT/$r.ncu-rep" ] || continue
  $ncu -i "$OUT/$r.ncu-rep" --page source --csv --print-source sass > "$OUT/$r-sass.csv" 2>&1; echo "$r source page exit $? $(wc -l < "$OUT/$r-sass.csv")"
  $ncu -i "$OUT/$r.ncu-rep" --page details > "$OUT/$r-details.txt" 2>&1
  grep -E "Stall|Issue|Tensor|Warp Cycles|Eligible|Duration|Throughput" "$OUT/$r-details.txt" | head -40
done
(cd "$OUT" && tar czf ncu.tgz *-sass.csv *-details.txt ncu-*.log && rm -f *.ncu-rep *-sass.csv)
EPFUSE_CTEST_REGEX='^run_fused_(fp8_)?onegpu_w(2|8)_' timeout 330 bash scripts/device-run.sh ctest 2>&1 | tail -12
