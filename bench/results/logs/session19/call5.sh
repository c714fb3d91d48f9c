#!/usr/bin/env bash
# Session 19, call 5 (one GPU), on the landing build (.carry/build: f726db9): (1) the seven fault entries
# (call 3 ran out of time before them on this producer hand-over); (2) issue 13's world-1 table in one
# call: fused and unfused, bf16 and FP8, on the per-GPU shapes; the dsv3 bench also runs DeepGEMM's
# grouped GEMMs alone and MegaMoE SM90 FP8 (--peers), as session 17's call 4.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
mkdir -p .peers && tar xzf .carry/peers.tgz -C .peers
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-} PATH=/opt/torch/.venv/bin:$PATH
OUT=$W EPFUSE_CTEST_REGEX='^(test_gpu_faults_w1|test_gpu_faults_onegpu_w4|run_fused_fault_onegpu_w4.*)$' \
  timeout 90 bash scripts/device-run.sh ctest > /dev/null 2>&1
echo "faults rc=$? after $(( $(date +%s) - start )) s: $(grep -cE "Test +#.*Passed" "$W/ctest.log") passed"
grep -E "tests passed|tests failed|\*\*\*" "$W/ctest.log" | tail -4; gzip -f "$W/ctest.log"
for shape in "qwen3 2048 768 32 8 128,4096,16384 70" "mixtral 4096 14336 2 2 4096 100" "dsv3 7168 2048 64 8 128,1024,4096 0"; do
  set -- $shape
  limit=$7; [ "$limit" = 0 ] && limit=$(( 590 - ($(date +%s) - start) ))
  peers=$([ "$1" = dsv3 ] && echo "--peers $PWD/.peers")
  timeout $limit .carry/build/tools/epfuse bench --impl unfused,fused --dtype bf16,fp8 --ranks 1 --torch off \
    --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 \
    $peers --json "$W/table-$1.json" > "$W/table-$1.log" 2>&1
  echo "$1: rc=$? after $(( $(date +%s) - start )) s"
  grep -E "^(custom|qwen3|mixtral|dsv3|deepgemm|megamoe)" "$W/table-$1.log" | cut -c1-160 | tail -40
done
tar czf "$OUT/call5.tgz" -C "$W" .
