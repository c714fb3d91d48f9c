#!/usr/bin/env bash
# Session 21, call 3 (one GPU; nvidia-h200 asked), on the landing build (.carry/build, f0c6fe8's sources).
# On an H200: issue 13's table first (call 2's commands). Then, as time allows, the fused FP8 CLI
# matrices that run on one GPU: world 1 (routings, T, the model shapes, clamp, padded sizes) and the
# one-GPU worlds 2, 4 and 8. Everything under $OUT as one tarball.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - start) )); }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-} PATH=/opt/torch/.venv/bin:$PATH
if [[ "$gpu" == *H200* ]]; then
  mkdir -p .peers && tar xzf .carry/peers.tgz -C .peers
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
fi
if [ $(left) -gt 60 ]; then
  OUT=$W EPFUSE_CTEST_REGEX='^(run_fused_fp8_w1.*|run_fused_padded_fp8_w1.*|run_fused_fp8_onegpu_w[248].*)$' \
    timeout $(( $(left) - 10 )) bash scripts/device-run.sh ctest > /dev/null 2>&1
  echo "tests rc=$? after $(( $(date +%s) - start )) s: $(grep -cE "Test +#.*Passed" "$W/ctest.log") passed"
  grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$W/ctest.log" | tail -12; gzip -f "$W/ctest.log"
fi
echo "end: $(( $(date +%s) - start )) s"
tar czf "$OUT/call3.tgz" -C "$W" .
