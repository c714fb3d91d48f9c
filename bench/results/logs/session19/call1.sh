#!/usr/bin/env bash
# Session 19, call 1 (one GPU): (1) A/B, FP8 rows, two rounds, of
#   main    322a3f3 (kernels = 9c44c70's),
#   tanh    exp/swiglu-tanh 7fbb743 (the FP8 Linear1 SwiGLU on tanh.approx; the carried build),
#   tanhrev tanh + session 18's review patch (review-store-fragment-rows.patch: one store loop),
#   relaxed tanhrev with the Linear1 done-count and Linear2 row signals as relaxed adds (timing
#           diagnostic, EPFUSE_DIAG_RELAXED_SIGNALS: the upper bound of taking the release fences off
#           the math warps; never merged);
# (2) ncu warp-stall samples (SourceCounters) of the tanh build's fused FP8 kernel at dsv3 T=4096, whose
#     Linear2 epilogue issues its 64 KiB of stores in ~7 us (session 18's trace): which stall holds them;
# (3) exp/swiglu-tanh's FP8 GPU tests. Everything under $OUT goes back as one tarball.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
S=$PWD/.carry/s19
bench() {  # tag bin round name H I E k T
  local tag=$1 bin=$2 round=$3 name=$4; shift 4
  timeout 90 $bin bench --impl fused --dtype fp8 --ranks 1 --torch off --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 \
    --hidden $1 --intermediate $2 --experts $3 --topk $4 --tokens $5 --json "$W/ab-$tag-$name-r$round.json" 2>&1 \
    | grep -E " fused |illegal|timed out|rror" | grep -v "freeing\|~Symm\|~Comm\|destroying\|config " | sed "s/^/$tag r$round $name: /" | cut -c1-150
}
for round in 1 2; do
  for tag in main tanh tanhrev relaxed; do
    case $tag in main) bin=$S/main-epfuse ;; tanh) bin=$PWD/.carry/build/tools/epfuse ;; *) bin=$S/$tag-epfuse ;; esac
    bench $tag $bin $round mixtral 4096 14336 2 2 4096
    bench $tag $bin $round dsv3 7168 2048 64 8 4096
    [ $round = 1 ] && bench $tag $bin $round qwen3 2048 768 32 8 16384
  done
done 2>&1 | tee "$W/ab.log"
echo "after A/B: $(( $(date +%s) - start )) s"
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 200 $ncu --clock-control none --section WarpStateStats --section SourceCounters --import-source no \
  -k regex:fused_moe_kernel --launch-skip 2 --launch-count 1 -f -o "$W/dsv3" .carry/build/tools/epfuse run --impl fused --dtype fp8 \
  --hidden 7168 --intermediate 2048 --experts 64 --topk 8 --ranks 1 --tokens 4096 --iters 4 --verify-rows 2 > "$W/ncu-dsv3.log" 2>&1
echo "ncu exit $? after $(( $(date +%s) - start )) s"
$ncu -i "$W/dsv3.ncu-rep" --page source --csv --print-source sass > "$W/dsv3-sass.csv" 2>&1
python3 scripts/ncu_stalls.py "$W/dsv3-sass.csv" > "$W/dsv3-stalls.txt" 2>&1; head -24 "$W/dsv3-stalls.txt"
python3 scripts/ncu_stalls.py "$W/dsv3-sass.csv" --range 0 fffff > "$W/dsv3-all.txt" 2>&1
grep -E " (STG|RED|MEMBAR|ST\.E|ATOM)" "$W/dsv3-all.txt" | sort -k2 -n -r | head -30
gzip -f "$W/dsv3-sass.csv" "$W/dsv3-all.txt"; rm -f "$W"/*.ncu-rep
OUT=$W EPFUSE_CTEST_REGEX='^(test_fp8_tma_tile|test_gpu_fused_fp8_w1|run_fused_fp8_w1_.*|test_gpu_fused_fp8_onegpu_w4|run_fused_fp8_onegpu_w2_.*)$' \
  timeout $(( 580 - ($(date +%s) - start) )) bash scripts/device-run.sh ctest > /dev/null 2>&1
echo "ctest rc=$? after $(( $(date +%s) - start )) s"
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$W/ctest.log" | tail -14
grep -cE "Test +#.*Passed" "$W/ctest.log"
gzip -f "$W/ctest.log"
tar czf "$OUT/call1.tgz" -C "$W" .
