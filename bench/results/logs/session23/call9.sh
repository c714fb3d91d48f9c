#!/usr/bin/env bash
# Session 23, call 9 (one GPU): test_fp8_tma_tile with its new k-loop-only bench case (no epilogue: the
# tile's k-loop and ring alone, the same 1056 tiles, K = 7168), the whole test (its correctness cases
# too), then that case's first timed launch under Nsight Compute (clocks locked): cycles, tensor busy.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
for r in 1 2; do timeout 60 .carry/s23/tile-kloop > "$OUT/call9-test-r$r.log" 2>&1; echo "test r$r: exit $?"; grep -E "bench|PASS|FAIL" "$OUT/call9-test-r$r.log"; done
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 120 "$ncu" --section SpeedOfLight --section WarpStateStats --section SchedulerStats -k regex:fp8_tma_tile_kernel \
  --launch-skip 16 --launch-count 1 .carry/s23/tile-kloop > "$OUT/call9-ncu-kloop.txt" 2>&1
echo "ncu exit $?: $(grep -E 'Elapsed Cycles|Compute \(SM\) Throughput|SM Frequency|Issue Slots Busy' "$OUT/call9-ncu-kloop.txt" | tr -s ' ' | tr '\n' ';')"
