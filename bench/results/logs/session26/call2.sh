#!/usr/bin/env bash
# Session 26, call 2 (one GPU; nvidia-h200 asked). Three dispatch quantisation mappings against main's
# (.carry/base/epfuse, 647f081): span (.carry/build: each warp one contiguous span of the task's 256-element
# steps) and rowwarp (.carry/rowwarp: a warp per row, 16 loads a lane in flight). In-kernel phase profile,
# then sustained ms (two rounds), then this build's FP8 tests while time is left. On an H200 the mixtral
# rows of issue 13 come first.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - start) )); }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-} PATH=/opt/torch/.venv/bin:$PATH
[ -d .carry/build ] || tar xJf .carry/build.tar.xz -C .carry
CEIL=gemm=790,hbm=4250,nvlink=350,fp8=1447
declare -A BIN=([base]=.carry/base/epfuse [span]=.carry/build/tools/epfuse [rowwarp]=.carry/rowwarp/epfuse)
SHAPES=("mixtral 4096 14336 2 2 4096" "dsv3 7168 2048 64 8 4096" "qwen3 2048 768 32 8 16384")
if [[ "$gpu" == *H200* ]]; then
  timeout 150 ${BIN[base]} bench --impl unfused,fused --dtype bf16,fp8 --ranks 1 --torch off --sustained 1500 --ceilings $CEIL \
    --hidden 4096 --intermediate 14336 --experts 2 --topk 2 --tokens 4096 --json "$W/table-mixtral.json" > "$W/table-mixtral.log" 2>&1
  echo "mixtral: rc=$? after $(( $(date +%s) - start )) s"; grep -E "^(custom|config)" "$W/table-mixtral.log" | cut -c1-240
fi
for tag in base span rowwarp; do
  for shape in "${SHAPES[@]}"; do set -- $shape
    EPFUSE_PROFILE=1 timeout 40 ${BIN[$tag]} bench --impl fused --dtype fp8 --ranks 1 --torch off --iters 10 --ceilings $CEIL \
      --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 > "$W/profile-$tag-$1.log" 2>&1
    echo "profile $tag $1: $(grep -E 'dispatch ' "$W/profile-$tag-$1.log" | head -1 | cut -c10-) | linear1 first $(grep -E 'linear1 ' "$W/profile-$tag-$1.log" | head -1 | awk '{print $(NF-1)}') | median $(grep -E ' fused fp8' "$W/profile-$tag-$1.log" | awk '{print $5}')"
  done
done 2>&1 | tee "$W/profile.log"
for round in 1 2; do for tag in base span rowwarp; do
  [ $round = 2 ] && [ $tag = rowwarp ] && continue
  for shape in "${SHAPES[@]}"; do set -- $shape
    [ $(left) -lt 60 ] && break
    timeout 60 ${BIN[$tag]} bench --impl fused --dtype fp8 --ranks 1 --torch off --iters 30 --sustained 1500 --ceilings $CEIL \
      --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$W/ab-$tag-$1-t$6-r$round.json" 2>&1 \
      | grep -E " fused |rror" | sed "s/^/$tag r$round $1 T=$6: /" | cut -c1-250
  done
done; done 2>&1 | tee "$W/ab.log"
if [ $(left) -gt 120 ]; then
  re='^(gpu_fp8_tile|test_gpu_fused_fp8_w1|test_gpu_fused_fp8_onegpu_w[248]|run_fused_fp8_w1_|run_fused_fp8_onegpu_w4_)'
  OUT=$W EPFUSE_CTEST_REGEX="$re" timeout $(( $(left) - 15 )) bash scripts/device-run.sh ctest > "$W/ctest-run.log" 2>&1
  echo "ctest: rc=$? after $(( $(date +%s) - start )) s"; grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout" "$W"/ctest.log | head -20
fi
echo "end: $(( $(date +%s) - start )) s"
tar czf "$OUT/call2.tgz" -C "$W" .
