#!/usr/bin/env bash
# Session 22, call 1 (one GPU; nvidia-h200 asked). On an H200: issue 13's world-1 table on main
# (.carry/s22/base-epfuse, the landing build of f0c6fe8, SASS identical to 0e0112a's; session 21 call 2's
# commands, DeepGEMM and MegaMoE in the dsv3 bench), nothing else. On any other GPU: exp/tma-h
# (.carry/build: Linear2's A by one TMA box a k-block) (1) its FP8 tile and layer tests, bf16 layer test,
# fault entries and the world-1 and one-GPU world-4 FP8 CLI matrices; (2) an FP8 A/B against main, two
# rounds. Everything under $OUT as one tarball.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - start) )); }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-} PATH=/opt/torch/.venv/bin:$PATH
CEIL=gemm=790,hbm=4250,nvlink=350,fp8=1447
if [[ "$gpu" == *H200* ]]; then
  mkdir -p .peers && tar xzf .carry/peers.tgz -C .peers
  for shape in "qwen3 2048 768 32 8 128,4096,16384 70" "mixtral 4096 14336 2 2 4096 100" "dsv3 7168 2048 64 8 128,1024,4096 0"; do
    set -- $shape
    limit=$7; [ "$limit" = 0 ] && limit=$(( $(left) - 5 ))
    peers=$([ "$1" = dsv3 ] && echo "--peers $PWD/.peers")
    timeout $limit .carry/s22/base-epfuse bench --impl unfused,fused --dtype bf16,fp8 --ranks 1 --torch off \
      --ceilings $CEIL --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 \
      $peers --json "$W/table-$1.json" > "$W/table-$1.log" 2>&1
    echo "$1: rc=$? after $(( $(date +%s) - start )) s"
    grep -E "^(custom|qwen3|mixtral|dsv3|deepgemm|megamoe)" "$W/table-$1.log" | cut -c1-160 | tail -40
  done
else
  OUT=$W EPFUSE_CTEST_REGEX='^(gpu_fp8_tile|gpu_fp8_tma_tile|test_gpu_fused_w1|test_gpu_fused_fp8_w1|test_gpu_fused_fp8_onegpu_w4|test_gpu_faults_w1|test_gpu_faults_onegpu_w4|run_fused_fault_onegpu_w4.*|run_fused_fp8_w1.*|run_fused_fp8_onegpu_w4.*)$' \
    timeout 200 bash scripts/device-run.sh ctest > /dev/null 2>&1
  echo "tests rc=$? after $(( $(date +%s) - start )) s: $(grep -cE "Test +#.*Passed" "$W/ctest.log") passed"
  grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$W/ctest.log" | tail -12; gzip -f "$W/ctest.log"
  OUT=$W EPFUSE_BASE_BIN=$PWD/.carry/s22/base-epfuse EPFUSE_NEW_BIN=$PWD/.carry/build/tools/epfuse EPFUSE_AB_ROUNDS=2 EPFUSE_AB_ARGS="--dtype fp8" \
    EPFUSE_AB_SHAPES="qwen3 2048 768 32 8 4096,16384;dsv3 7168 2048 64 8 1024,4096;mixtral 4096 14336 2 2 4096" \
    timeout $(( $(left) - 5 )) bash scripts/device-run.sh ab 2>&1 | grep -E "fused|rror|illegal|timed" | cut -c1-150
fi
echo "end: $(( $(date +%s) - start )) s"
tar czf "$OUT/call1.tgz" -C "$W" .
