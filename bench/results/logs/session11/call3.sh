#!/usr/bin/env bash
# Session 11, call 3: where the fused FP8 kernel's bytes go (ncu metrics, one launch each): DRAM bytes
# read/written against the weights' and activations' bytes, L2 read sectors and hits, tensor-pipe
# activity, on the bench's per-GPU shapes (dsv3: 64 experts); fused FP8 and bf16 at dsv3 T=4096, FP8 at dsv3 T=128 and mixtral T=4096, the FP8 tile alone.
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=index,name,clocks.sm,clocks.max.sm --format=csv,noheader
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
$ncu --query-metrics --chip gh100 > "$OUT/metrics-list.txt" 2>&1
want="gpu__time_duration dram__bytes_read dram__bytes_write lts__t_sectors_op_read lts__t_sectors_op_read_lookup_hit lts__t_sectors_op_read_lookup_miss lts__t_sectors_op_write lts__t_sector_hit_rate sm__pipe_tensor_op_gmma_cycles_active sm__inst_executed_pipe_tensor_op_gmma lts__t_sectors_srcunit_tex_op_read lts__t_sectors_srcunit_tex_op_read_lookup_miss"
m=""
for w in $want; do
  if grep -q "^$w " "$OUT/metrics-list.txt"; then
    case $w in *hit_rate*) m="$m,$w.pct" ;; *gmma_cycles_active*) m="$m,$w.avg.pct_of_peak_sustained_active" ;; *) m="$m,$w.sum" ;; esac
  else echo "no metric $w"; fi
done
m=${m#,}; echo "metrics: $m"
B=.carry/build/tools/epfuse
run() {  # name, kernel regex, command...
  local name=$1 k=$2; shift 2
  timeout 150 $ncu --clock-control none --metrics "$m" -k "regex:$k" --launch-skip 3 --launch-count 1 "$@" > "$OUT/ncu-$name.txt" 2>&1
  echo "== $name exit $?"; grep -E "^\s+(gpu__|dram__|lts__|sm__)" "$OUT/ncu-$name.txt"
}
run fp8-dsv3-t4096 fused_moe_kernel $B run --impl fused --dtype fp8 --hidden 7168 --intermediate 2048 --experts 64 --topk 8 --ranks 1 --tokens 4096 --iters 5 --verify-rows 2
run bf16-dsv3-t4096 fused_moe_kernel $B run --impl fused --hidden 7168 --intermediate 2048 --experts 64 --topk 8 --ranks 1 --tokens 4096 --iters 5 --verify-rows 2
run fp8-dsv3-t128 fused_moe_kernel $B run --impl fused --dtype fp8 --hidden 7168 --intermediate 2048 --experts 64 --topk 8 --ranks 1 --tokens 128 --iters 5 --verify-rows 2
run fp8-mixtral-t4096 fused_moe_kernel $B run --impl fused --dtype fp8 --hidden 4096 --intermediate 14336 --experts 2 --topk 2 --ranks 1 --tokens 4096 --iters 5 --verify-rows 2
run fp8-tile fp8_tma_tile_kernel .carry/build/tests/gpu/gemm/test_fp8_tma_tile
# PC sampling of the fused FP8 kernel on the per-GPU dsv3 shape at T=4096 (call 1 sampled --model dsv3: 256 experts)
timeout 200 $ncu --clock-control none --section WarpStateStats --section SourceCounters --section SpeedOfLight --import-source no \
  -k regex:fused_moe_kernel --launch-skip 3 --launch-count 1 -f -o "$OUT/fused64" $B run --impl fused --dtype fp8 --hidden 7168 \
  --intermediate 2048 --experts 64 --topk 8 --ranks 1 --tokens 4096 --iters 5 --verify-rows 2 > "$OUT/ncu-fused64.log" 2>&1; echo "fused64 exit $?"
$ncu -i "$OUT/fused64.ncu-rep" --page source --csv --print-source sass > "$OUT/fused64-sass.csv" 2>&1
$ncu -i "$OUT/fused64.ncu-rep" --page details > "$OUT/fused64-details.txt" 2>&1; grep -E "Throughput|Duration" "$OUT/fused64-details.txt"
(cd "$OUT" && tar czf ncu3.tgz ncu-*.txt fused64-sass.csv fused64-details.txt && rm -f *.ncu-rep fused64-sass.csv metrics-list.txt)
