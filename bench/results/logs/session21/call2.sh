#!/usr/bin/env bash
# Session 21, call 2 (one GPU; nvidia-h200 asked), on the landing build (.carry/build: main with the FP8
# k-block as two n128 halves): (1) the FP8 tile and layer tests and the seven fault entries; (2) issue 13's
# world-1 table in one call: fused and unfused, bf16 and FP8, on the per-GPU shapes; the dsv3 bench also
# runs DeepGEMM's grouped GEMMs alone and MegaMoE SM90 FP8 (--peers), as session 19's call 5.
# Everything under $OUT as one tarball.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
mkdir -p .peers && tar xzf .carry/peers.tgz -C .peers
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-} PATH=/opt/torch/.venv/bin:$PATH
OUT=$W EPFUSE_CTEST_REGEX='^(gpu_fp8_tile|gpu_fp8_tma_tile|test_gpu_fused_fp8_w1|test_gpu_fused_fp8_onegpu_w4|test_gpu_fused_w1|test_gpu_faults_w1|test_gpu_faults_onegpu_w4|run_fused_fault_onegpu_w4.*)$' \
  timeout 120 bash scripts/device-run.sh ctest > /dev/null 2>&1
echo "tests rc=$? after $(( $(date +%s) - start )) s: $(grep -cE "Test +#.*Passed" "$W/ctest.log") passed"
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$W/ctest.log" | tail -12; gzip -f "$W/ctest.log"
for shape in "qwen3 2048 768 32 8 128,4096,16384 70" "mixtral 4096 14336 2 2 4096 100" "dsv3 7168 2048 64 8 128,1024,4096 0"; do
  set -- $shape
  limit=$7; [ "$limit" = 0 ] && limit=$(( $(left) - 5 ))
  peers=$([ "$1" = dsv3 ] && echo "--peers $PWD/.peers")
  timeout $limit .carry/build/tools/epfuse bench --impl unfused,fused --dtype bf16,fp8 --ranks 1 --torch off \
    --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 \
    $peers --json "$W/table-$1.json" > "$W/table-$1.log" 2>&1
  echo "$1: rc=$? after $(( $(date +%s) - start )) s"
  grep -E "^(custom|qwen3|mixtral|dsv3|deepgemm|megamoe)" "$W/table-$1.log" | cut -c1-160 | tail -40
done
echo "end: $(( $(date +%s) - start )) s"
tar czf "$OUT/call2.tgz" -C "$W" .
