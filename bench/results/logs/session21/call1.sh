#!/usr/bin/env bash
# Session 21, call 1 (one GPU; nvidia-h200 asked). On an H200: issue 13's world-1 table on main
# (.carry/s21/base-epfuse, f5cd109; session 19 call 5's commands, DeepGEMM and MegaMoE in the dsv3 bench).
# On any GPU after that, as time allows: exp/fp8-halves (.carry/build: the FP8 k-block as two n128 halves)
# against main: (1) mixtral FP8, 200 timed calls a binary, base/halves/base/halves, nvidia-smi every 20 ms
# beside each (energy per flop on the power-capped row); (2) an A/B of the other FP8 rows, two rounds;
# (3) the halves build's FP8 tile and layer tests and fault entries. Everything under $OUT as one tarball.
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
    timeout $limit .carry/s21/base-epfuse bench --impl unfused,fused --dtype bf16,fp8 --ranks 1 --torch off \
      --ceilings $CEIL --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 \
      $peers --json "$W/table-$1.json" > "$W/table-$1.log" 2>&1
    echo "$1: rc=$? after $(( $(date +%s) - start )) s"
    grep -E "^(custom|qwen3|mixtral|dsv3|deepgemm|megamoe)" "$W/table-$1.log" | cut -c1-160 | tail -40
  done
fi
sample() { nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader -lms 20 > "$1" 2>&1 & }
for b in base halves base halves; do
  [ $(left) -lt 60 ] && break
  bin=$([ $b = base ] && echo .carry/s21/base-epfuse || echo .carry/build/tools/epfuse)
  n=$(ls $W/clocks-$b-*.csv 2>/dev/null | wc -l)
  sample "$W/clocks-$b-$n.csv"; smi=$!
  timeout 60 $bin bench --impl fused --dtype fp8 --ranks 1 --torch off --ceilings $CEIL \
    --hidden 4096 --intermediate 14336 --experts 2 --topk 2 --tokens 4096 --iters 200 --json "$W/clocks-$b-$n.json" 2>&1 | grep -E " fused |rror" | cut -c1-100 | sed "s/^/$b: /"
  kill $smi; sleep 1
  python3 scripts/clock_summary.py "$W/clocks-$b-$n.csv"
done
echo "after power A/B: $(( $(date +%s) - start )) s"
if [ $(left) -gt 200 ]; then
  OUT=$W EPFUSE_BASE_BIN=$PWD/.carry/s21/base-epfuse EPFUSE_NEW_BIN=$PWD/.carry/build/tools/epfuse EPFUSE_AB_ROUNDS=2 EPFUSE_AB_ARGS="--dtype fp8" \
    EPFUSE_AB_SHAPES="dsv3 7168 2048 64 8 128,4096;qwen3 2048 768 32 8 16384" \
    timeout $(( $(left) - 110 )) bash scripts/device-run.sh ab 2>&1 | grep -E "fused fp8|rror|illegal|timed" | cut -c1-150
  echo "after ab: $(( $(date +%s) - start )) s"
fi
if [ $(left) -gt 60 ]; then
  OUT=$W EPFUSE_CTEST_REGEX='^(test_gpu_faults_w1|test_gpu_faults_onegpu_w4|run_fused_fault_onegpu_w4.*|gpu_fp8_tma_tile|test_gpu_fused_fp8_w1|test_gpu_fused_fp8_onegpu_w4)$' \
    timeout $(( $(left) - 10 )) bash scripts/device-run.sh ctest > /dev/null 2>&1
  echo "tests rc=$? after $(( $(date +%s) - start )) s: $(grep -cE "Test +#.*Passed" "$W/ctest.log") passed"
  grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$W/ctest.log" | tail -12; gzip -f "$W/ctest.log"
fi
gzip -f $W/*.csv 2>/dev/null
echo "end: $(( $(date +%s) - start )) s"
tar czf "$OUT/call1.tgz" -C "$W" .
