#!/usr/bin/env bash
# Session 16, call 3 (one GPU), on c67a660 (.carry/build): (1) the bf16 GPU tests after the bf16 tiles'
# evict_first hint (all-thread tile test, world-1 tests and CLI matrices, one-GPU world-4 test, world-2/8
# CLI matrices, world-4 fault runs); (2) the bf16 A/B against 81fa496 (.carry/base), rounds 2 and 3;
# (3) fused FP8 with caller-quantised x (--x-fp8, as MegaMoE takes it) beside MegaMoE SM90 FP8 (--peers
# --peer-steps megamoe) on the dsv3 and qwen3 per-GPU shapes.
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm --format=csv,noheader
mkdir -p .peers && tar xzf .carry/peers.tgz -C .peers
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-} PATH=/opt/torch/.venv/bin:$PATH
start=$(date +%s)
EPFUSE_CTEST_REGEX='^(gpu_tile_gemm|test_gpu_fused_w1|test_gpu_fused_onegpu_w4|run_fused_fault_onegpu_w4_.*|run_fused_(w1|onegpu_w2|onegpu_w8)_.*)$' \
  timeout 230 bash scripts/device-run.sh ctest > /dev/null 2>&1
echo "ctest rc=$? after $(( $(date +%s) - start )) s"
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$OUT/ctest.log" | tail -12
gzip -f "$OUT/ctest.log"
bench() {  # tag bin dtype shape H I E k T
  local tag=$1 bin=$2 dt=$3; shift 3
  timeout 60 $bin bench --impl fused --dtype $dt --ranks 1 --torch off --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 \
    --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$OUT/ab-$tag-$1-$dt-r$round.json" 2>&1 \
    | grep -E "^custom|illegal|timed out|rror" | grep -v "freeing\|~Symm\|~Comm\|destroying" | sed "s/^/$tag r$round $1: /" | cut -c1-150
}
for round in 2 3; do for tag in base new; do
  bin=$([ $tag = new ] && echo .carry/build/tools/epfuse || echo .carry/base/epfuse)
  bench $tag $bin bf16 qwen3 2048 768 32 8 128,4096
  bench $tag $bin bf16 dsv3 7168 2048 64 8 128
done; done 2>&1 | tee "$OUT/ab.log"
echo "after A/B: $(( $(date +%s) - start )) s"
for shape in "qwen3 2048 768 32 8 128,4096,16384" "dsv3 7168 2048 64 8 128,1024,4096"; do
  set -- $shape
  peers=$([ "$1" = dsv3 ] && echo "--peers $PWD/.peers --peer-steps megamoe")
  timeout $(( 590 - ($(date +%s) - start) )) .carry/build/tools/epfuse bench --impl fused --dtype fp8 --x-fp8 --ranks 1 --torch off \
    --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 \
    $peers --json "$OUT/xfp8-$1.json" > "$OUT/xfp8-$1.log" 2>&1
  echo "$1 x-fp8: rc=$? after $(( $(date +%s) - start )) s"
  grep -E "^(custom|qwen3|dsv3|megamoe)" "$OUT/xfp8-$1.log" | cut -c1-160 | tail -20
done
(cd "$OUT" && tar czf json.tgz ab-*.json && rm -f ab-*.json)
