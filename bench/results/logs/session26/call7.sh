#!/usr/bin/env bash
# Session 26, call 7 (one GPU; nvidia-h200 asked). The quantisation's steps side by side: q8 (.carry/build.tar.xz:
# a41a28b + the new warp_quantize_row, 8 steps a batch) and q16 (.carry/q16: 16 a batch) against a41a28b
# (.carry/a41). q8's quantisation and FP8 layer tests, the phase profile, then synchronised and sustained ms.
# On an H200 issue 13's mixtral rows come first (a41a28b).
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
declare -A BIN=([a41]=.carry/a41/epfuse [q8]=.carry/build/tools/epfuse [q16]=.carry/q16/epfuse)
if [[ "$gpu" == *H200* ]]; then
  timeout 150 ${BIN[a41]} bench --impl unfused,fused --dtype bf16,fp8 --ranks 1 --torch off --sustained 1500 --ceilings $CEIL \
    --hidden 4096 --intermediate 14336 --experts 2 --topk 2 --tokens 4096 --json "$W/table-mixtral.json" > "$W/table-mixtral.log" 2>&1
  echo "mixtral: rc=$? after $(( $(date +%s) - start )) s"; grep -E "^(custom|config)" "$W/table-mixtral.log" | cut -c1-240
fi
re='^(gpu_fp8_tile|test_gpu_fused_fp8_w1|test_gpu_fused_fp8_onegpu_w[248]|run_fused_fp8_w1_)'
OUT=$W EPFUSE_CTEST_REGEX="$re" timeout 150 bash scripts/device-run.sh ctest > "$W/ctest-run.log" 2>&1
echo "ctest: rc=$? after $(( $(date +%s) - start )) s"; grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout" "$W"/ctest.log | head -20
SHAPES=("mixtral 4096 14336 2 2 4096" "qwen3 2048 768 32 8 16384" "dsv3 7168 2048 64 8 4096" "qwen3 2048 768 32 8 128")
for tag in a41 q8 q16; do
  for shape in "${SHAPES[@]}"; do set -- $shape
    [ $(left) -lt 30 ] && break
    timeout 60 ${BIN[$tag]} bench --impl fused --dtype fp8 --ranks 1 --torch off --iters 30 $([ $6 -gt 128 ] && echo --sustained 1500) --ceilings $CEIL \
      --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$W/ab-$tag-$1-t$6.json" 2>&1 \
      | grep -E " fused |rror" | sed "s/^/$tag $1 T=$6: /" | cut -c1-250
  done
done 2>&1 | tee "$W/ab.log"
echo "end: $(( $(date +%s) - start )) s"
tar czf "$OUT/call7.tgz" -C "$W" .
