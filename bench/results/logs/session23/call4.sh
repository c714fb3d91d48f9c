#!/usr/bin/env bash
# Session 23, call 4 (one GPU; nvidia-h200 asked). On an H200: call1.sh (issue 13's table) with main's CLI.
# Otherwise a decomposition of the FP8 k-loop on the tile alone (test_fp8_tma_tile's bench case: 132 CTAs,
# 1056 full 128 x 256 tiles, K = 7168, gathered rows), four builds of main + diag-tile.patch (never
# merged; the diagnostic builds' values are wrong by design, their correctness cases fail): base (no
# define: main's code), nopro (no promotion FFMAs in the k-loop), noa (the producer copies no A rows or row
# scales), both. Three timed runs of each, interleaved, then one bench launch of each under Nsight
# Compute (clocks locked at base): cycles and tensor-pipe busy. Everything under $OUT as one tarball.
cd "$(dirname "$0")/../../../.."
here=$PWD/bench/results/logs/session23
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
if [[ "$gpu" == *H200* ]]; then cp .carry/s23/main-epfuse .carry/build/tools/epfuse; exec bash "$here/call1.sh"; fi
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
for round in 1 2 3; do for v in base nopro noa both; do
  timeout 60 .carry/s23/tile-$v > "$W/tile-$v-r$round.log" 2>&1
  echo "$v r$round: $(grep -E 'bench K=' "$W/tile-$v-r$round.log")"
done; done
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats"
for v in base nopro noa both; do
  [ $(left) -lt 60 ] && break
  timeout $(( $(left) - 30 )) "$ncu" $sections -k regex:fp8_tma_tile_kernel --launch-skip 6 --launch-count 1 .carry/s23/tile-$v \
    > "$W/ncu-tile-$v.txt" 2>&1
  echo "== ncu $v (exit $?): $(grep -E 'Elapsed Cycles|Compute \(SM\) Throughput|SM Frequency|Issue Slots Busy' "$W/ncu-tile-$v.txt" | tr -s ' ' | tr '\n' ';')"
done
echo "end: $(( $(date +%s) - start )) s"
tar czf "$OUT/call4.tgz" -C "$W" .
