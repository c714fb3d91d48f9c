#!/usr/bin/env bash
# Session 13, call 8 (one GPU): the task hand-over fix (31492c1: math threads read the posted task before
# their barrier). (1) The rotation build, which faulted in 10 of 12 and 6 of 6 FP8 bench invocations,
# with the fix alone added (.carry/rotfix13, same 119 spill instructions as .carry/rot13): FP8 on every
# per-GPU shape, two rounds; the unfixed rot13 once at T=128,1024 as a same-machine control. (2) 31492c1
# itself: its GPU tests, then T=128 bf16+FP8 against 9e2c663's binary, two rounds.
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
bench() {  # tag bin dtype shape H I E k T...
  local tag=$1 bin=$2 dt=$3; shift 3
  timeout 150 $bin bench --impl fused --dtype $dt --ranks 1 --torch off --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 \
    --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$OUT/$tag-$1-r$round.json" 2>&1 \
    | grep -E "^custom|illegal instruction|timed out" | grep -v "freeing\|~Symm\|~Comm\|destroying" | sed "s/^/$tag r$round $1: /" | cut -c1-160
}
for round in 1 2; do
  for shape in "qwen3 2048 768 32 8 128,4096,16384" "dsv3 7168 2048 64 8 128,1024,4096" "mixtral 4096 14336 2 2 4096"; do
    bench rotfix .carry/rotfix13/epfuse fp8 $shape
  done
  [ $round = 1 ] && for shape in "qwen3 2048 768 32 8 128,1024" "dsv3 7168 2048 64 8 128,1024"; do bench rot .carry/rot13/epfuse fp8 $shape; done
done 2>&1 | tee "$OUT/rotfix.log"
EPFUSE_CTEST_REGEX='^(gpu_fp8_tma_tile|test_gpu_(fused|fused_fp8)_w1|test_gpu_fused_(fp8_)?onegpu_w4|run_fused_(fp8_)?w1_.*|run_fused_fault_onegpu_w4_.*)$' \
  timeout 200 bash scripts/device-run.sh ctest 2>&1 | tail -2
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$OUT/ctest.log" | tail -8
for round in 1 2; do for tag in base fix; do
  bin=$([ $tag = fix ] && echo .carry/build/tools/epfuse || echo .carry/base13/epfuse)
  for shape in "qwen3 2048 768 32 8 128" "dsv3 7168 2048 64 8 128"; do bench ab-$tag $bin bf16,fp8 $shape; done
done; done 2>&1 | tee "$OUT/ab.log"
(cd "$OUT" && tar czf json.tgz *.json && rm -f *.json)
