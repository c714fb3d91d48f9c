#!/usr/bin/env bash
# Session 26, call 1 (one GPU; nvidia-h200 asked). On an H200: issue 13's mixtral rows with main
# (.carry/base/epfuse, 647f081) and this build (.carry/build.tar.xz: the dispatch's rows quantised by every
# warp), then the dsv3 row with DeepGEMM and MegaMoE beside (.carry/peers.tgz). On any other GPU: this
# build's FP8 tests, then base against this build (synchronised medians and --sustained 1500 on the
# compute-bound rows, synchronised on two decode rows), with the in-kernel phase profile once per binary.
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
declare -A BIN=([base]=.carry/base/epfuse [new]=.carry/build/tools/epfuse [u8]=.carry/u8/epfuse)
BASE=${BIN[base]}
ab() {  # ab ROUNDS "TAGS" SHAPES...  (u8: this build with 8 loads a lane in flight instead of 16)
  local rounds=$1 tags=$2; shift 2
  for round in $(seq 1 $rounds); do for tag in $tags; do
    bin=${BIN[$tag]}
    for shape in "$@"; do set -- $shape
      [ $(left) -lt 40 ] && break
      timeout 60 $bin bench --impl fused --dtype fp8 --ranks 1 --torch off --iters 30 $([ $6 -gt 128 ] && echo --sustained 1500) --ceilings $CEIL \
        --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$W/ab-$tag-$1-t$6-r$round.json" 2>&1 \
        | grep -E " fused |rror" | sed "s/^/$tag r$round $1 T=$6: /" | cut -c1-250
    done
  done; done
}
if [[ "$gpu" == *H200* ]]; then
  mkdir -p .peers && tar xzf .carry/peers.tgz -C .peers
  timeout 150 $BASE bench --impl unfused,fused --dtype bf16,fp8 --ranks 1 --torch off --sustained 1500 --ceilings $CEIL \
    --hidden 4096 --intermediate 14336 --experts 2 --topk 2 --tokens 4096 --json "$W/table-mixtral.json" > "$W/table-mixtral.log" 2>&1
  echo "mixtral: rc=$? after $(( $(date +%s) - start )) s"; grep -E "^(custom|config)" "$W/table-mixtral.log" | cut -c1-240
  ab 2 "base new" "mixtral 4096 14336 2 2 4096" 2>&1 | tee "$W/ab.log"
  timeout $(( $(left) - 10 )) $BASE bench --impl fused --dtype fp8 --ranks 1 --torch off --sustained 1500 --ceilings $CEIL \
    --hidden 7168 --intermediate 2048 --experts 64 --topk 8 --tokens 4096 --peers $PWD/.peers --json "$W/table-dsv3.json" > "$W/table-dsv3.log" 2>&1
  echo "dsv3: rc=$? after $(( $(date +%s) - start )) s"; grep -E "^(custom|config|deepgemm|megamoe)" "$W/table-dsv3.log" | cut -c1-240
else
  re='^(gpu_fp8_tile|gpu_fp8_tma_tile|test_gpu_fused_fp8_w1|test_gpu_fused_fp8_onegpu_w[248]|run_fused_fp8_w1_|run_fused_padded_fp8_w1_|run_fused_fp8_onegpu_w4_)'
  OUT=$W EPFUSE_CTEST_REGEX="$re" timeout 230 bash scripts/device-run.sh ctest > "$W/ctest-run.log" 2>&1
  echo "ctest: rc=$? after $(( $(date +%s) - start )) s"
  grep -E "tests passed|tests failed|Failed|\*\*\*|Timeout" "$W"/ctest.log | head -20
  for tag in base new; do bin=${BIN[$tag]}
    for shape in "mixtral 4096 14336 2 2 4096" "qwen3 2048 768 32 8 16384"; do set -- $shape
      EPFUSE_PROFILE=1 timeout 40 $bin bench --impl fused --dtype fp8 --ranks 1 --torch off --iters 10 --ceilings $CEIL \
        --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 > "$W/profile-$tag-$1.log" 2>&1
      echo "== profile $tag $1"; grep -iE "phase|dispatch|linear1|linear2|combine|collect|layout| fused " "$W/profile-$tag-$1.log" | head -14 | cut -c1-200
    done
  done
  { ab 2 "base new" "mixtral 4096 14336 2 2 4096" "dsv3 7168 2048 64 8 4096" "qwen3 2048 768 32 8 16384" "dsv3 7168 2048 64 8 128" "qwen3 2048 768 32 8 128"
    ab 1 "u8" "mixtral 4096 14336 2 2 4096" "dsv3 7168 2048 64 8 4096" "qwen3 2048 768 32 8 16384"; } 2>&1 | tee "$W/ab.log"
fi
echo "end: $(( $(date +%s) - start )) s"
tar czf "$OUT/call1.tgz" -C "$W" --exclude='*.csv' .
