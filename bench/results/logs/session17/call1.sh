#!/usr/bin/env bash
# Session 17, call 1 (one GPU): (1) ncu SpeedOfLight/Memory/Compute on the fused FP8 kernel (main,
# 770437d) at mixtral T=4096; (2) the EPFUSE_DIAG_HALF_B build (one weight box per stage, wrong results:
# time only) against main on mixtral and dsv3 T=4096; (3) exp/combine-grid (.carry/build) and
# exp/launch-excluded-timing against main at qwen3 T=128, 4096, two rounds; (4) combine-grid's GPU tests.
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
start=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
S=.carry/s17
MIX="--hidden 4096 --intermediate 14336 --experts 2 --topk 2 --tokens 4096"
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
timeout 150 $ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
  -k regex:fused_moe_kernel --launch-skip 3 --launch-count 1 -f -o "$OUT/mixtral" $S/main-epfuse run --impl fused --dtype fp8 \
  $MIX --ranks 1 --iters 5 --verify-rows 2 > "$OUT/ncu-mixtral.log" 2>&1
echo "ncu exit $? after $(( $(date +%s) - start )) s"
$ncu -i "$OUT/mixtral.ncu-rep" --page details > "$OUT/mixtral-details.txt" 2>&1
grep -E "Throughput|Duration|Busy|Bandwidth|Pipe|Hit Rate|Issue Slots|SM Frequency|DRAM Frequency" "$OUT/mixtral-details.txt" | head -40
rm -f "$OUT"/*.ncu-rep
bench() {  # tag bin round name H I E k T
  local tag=$1 bin=$2 round=$3 name=$4; shift 4
  timeout 90 $bin bench --impl fused --dtype fp8 --ranks 1 --torch off --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 \
    --hidden $1 --intermediate $2 --experts $3 --topk $4 --tokens $5 --json "$OUT/ab-$tag-$name-r$round.json" 2>&1 \
    | grep -E " fused |illegal|timed out|rror" | grep -v "freeing\|~Symm\|~Comm\|destroying" | sed "s/^/$tag r$round $name: /" | cut -c1-170
}
for round in 1 2; do
  bench main $S/main-epfuse $round mixtral 4096 14336 2 2 4096
  bench halfb $S/diagb-epfuse $round mixtral 4096 14336 2 2 4096
  [ $round = 1 ] && bench main $S/main-epfuse $round dsv3 7168 2048 64 8 4096
  [ $round = 1 ] && bench halfb $S/diagb-epfuse $round dsv3 7168 2048 64 8 4096
  for tag in main combine timing; do
    bin=$([ $tag = combine ] && echo .carry/build/tools/epfuse || echo $S/$tag-epfuse)
    bench $tag $bin $round qwen3 2048 768 32 8 128,4096
  done
done 2>&1 | tee "$OUT/ab.log"
echo "after A/B: $(( $(date +%s) - start )) s"
EPFUSE_CTEST_REGEX='^(test_gpu_fused_fp8_w1|test_gpu_fused_fp8_onegpu_w4|run_fused_fp8_(w1|onegpu_w2|onegpu_w8)_.*|test_gpu_fused_w1|test_gpu_fused_onegpu_w4|test_gpu_faults_w1|run_fused_fault_onegpu_w4_.*)$' \
  timeout $(( 570 - ($(date +%s) - start) )) bash scripts/device-run.sh ctest > /dev/null 2>&1
echo "ctest rc=$? after $(( $(date +%s) - start )) s"
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$OUT/ctest.log" | tail -14
grep -cE "Test +#.*Passed" "$OUT/ctest.log"
gzip -f "$OUT/ctest.log"
(cd "$OUT" && tar czf json.tgz *.json && rm -f *.json)
