#!/usr/bin/env bash
# Session 26, call 4 (one GPU; nvidia-h200 asked). main + dispatch_tokens (.carry/build.tar.xz): its FP8
# and bf16 GPU tests at world 1 and in the one-GPU worlds 2/4/8, then main (.carry/base/epfuse, 647f081)
# against it: synchronised and sustained ms on the compute-bound rows, synchronised on the decode rows.
# On an H200 issue 13's mixtral rows come first, with this build.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - start) )); }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-} PATH=/opt/torch/.venv/bin:$PATH
[ -d .carry/build ] || tar xJf .carry/build.tar.xz -C .carry
CEIL=gemm=790,hbm=4250,nvlink=350,fp8=1447
declare -A BIN=([base]=.carry/base/epfuse [new]=.carry/build/tools/epfuse)
if [[ "$gpu" == *H200* ]]; then
  timeout 150 ${BIN[new]} bench --impl unfused,fused --dtype bf16,fp8 --ranks 1 --torch off --sustained 1500 --ceilings $CEIL \
    --hidden 4096 --intermediate 14336 --experts 2 --topk 2 --tokens 4096 --json "$W/table-mixtral.json" > "$W/table-mixtral.log" 2>&1
  echo "mixtral: rc=$? after $(( $(date +%s) - start )) s"; grep -E "^(custom|config)" "$W/table-mixtral.log" | cut -c1-240
fi
re='^(gpu_fp8_tile|test_gpu_fused_fp8_w1|test_gpu_fused_fp8_onegpu_w[248]|test_gpu_fused_w1|test_gpu_fused_onegpu_w[248]|run_fused_fp8_w1_|run_fused_fp8_onegpu_w4_|run_fused_onegpu_w4_)'
OUT=$W EPFUSE_CTEST_REGEX="$re" timeout 300 bash scripts/device-run.sh ctest > "$W/ctest-run.log" 2>&1
echo "ctest: rc=$? after $(( $(date +%s) - start )) s"; grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout" "$W"/ctest.log | head -20
SHAPES=("mixtral 4096 14336 2 2 4096" "qwen3 2048 768 32 8 16384" "dsv3 7168 2048 64 8 4096" "qwen3 2048 768 32 8 128" "dsv3 7168 2048 64 8 128")
for round in 1 2; do for tag in base new; do
  for shape in "${SHAPES[@]}"; do set -- $shape
    [ $(left) -lt 30 ] && break
    timeout 60 ${BIN[$tag]} bench --impl fused --dtype fp8 --ranks 1 --torch off --iters 30 $([ $6 -gt 128 ] && echo --sustained 1500) --ceilings $CEIL \
      --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$W/ab-$tag-$1-t$6-r$round.json" 2>&1 \
      | grep -E " fused |rror" | sed "s/^/$tag r$round $1 T=$6: /" | cut -c1-250
  done
done; done 2>&1 | tee "$W/ab.log"
echo "end: $(( $(date +%s) - start )) s"
tar czf "$OUT/call4.tgz" -C "$W" .
