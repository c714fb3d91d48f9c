#!/usr/bin/env bash
# Session 20, call 1 (one GPU), on main (829f881; fused kernels' SASS = f726db9's). If the machine is an
# H200 (issue 13's figures are H200 figures): issue 13's world-1 table first (session 19's call 5 recipe).
# Then: (1) the task timeline (.carry/s20/trace-epfuse, the same source built with -DEPFUSE_TRACE=ON) of
# the fused FP8 kernel at mixtral, dsv3 and qwen3 at large T: what is left of the producer's hand-over
# after f726db9; (2) SM clock and power every 20 ms while main benches mixtral FP8 (the power cap).
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
name=$(nvidia-smi --query-gpu=name --format=csv,noheader); echo "$name"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.limit --format=csv,noheader
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-} PATH=/opt/torch/.venv/bin:$PATH
CEIL=gemm=790,hbm=4250,nvlink=350,fp8=1447
if [[ "$name" == *H200* ]]; then
  mkdir -p .peers && tar xzf .carry/peers.tgz -C .peers
  for shape in "qwen3 2048 768 32 8 128,4096,16384 70" "mixtral 4096 14336 2 2 4096 100" "dsv3 7168 2048 64 8 128,1024,4096 330"; do
    set -- $shape
    peers=$([ "$1" = dsv3 ] && echo "--peers $PWD/.peers")
    timeout $7 .carry/build/tools/epfuse bench --impl unfused,fused --dtype bf16,fp8 --ranks 1 --torch off \
      --ceilings $CEIL --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 \
      $peers --json "$W/table-$1.json" > "$W/table-$1.log" 2>&1
    echo "$1: rc=$? after $(( $(date +%s) - start )) s"
    grep -E "^(custom|qwen3|mixtral|dsv3|deepgemm|megamoe)" "$W/table-$1.log" | cut -c1-160 | tail -40
  done
fi
for shape in "mixtral 4096 14336 2 2 4096" "dsv3 7168 2048 64 8 4096" "qwen3 2048 768 32 8 16384"; do set -- $shape
  [ $(( $(date +%s) - start )) -gt 520 ] && break
  EPFUSE_TRACE_LAUNCH=20 EPFUSE_TRACE_FILE=$W/trace-$1-fp8.csv timeout 60 .carry/s20/trace-epfuse bench --impl fused --dtype fp8 --ranks 1 --torch off \
    --ceilings $CEIL --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 \
    2>&1 | grep -E "^custom|rror" | sed "s/^/trace $1: /" | cut -c1-170
done 2>&1 | tee "$W/trace.log"
for f in $W/trace-*.csv; do python3 scripts/trace_report.py $f > ${f%.csv}-report.txt 2>&1; tail -32 ${f%.csv}-report.txt | cut -c1-250; done
gzip -f $W/*.csv
echo "after trace: $(( $(date +%s) - start )) s"
if [ $(( $(date +%s) - start )) -lt 500 ]; then
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader -lms 20 > "$W/clocks-mixtral.csv" 2>&1 &
  smi=$!
  timeout 60 .carry/build/tools/epfuse bench --impl fused --dtype fp8 --ranks 1 --torch off --ceilings $CEIL \
    --hidden 4096 --intermediate 14336 --experts 2 --topk 2 --tokens 4096 --iters 200 --json "$W/clocks-mixtral.json" 2>&1 | grep -E " fused |rror" | cut -c1-150
  kill $smi
  python3 scripts/clock_summary.py "$W/clocks-mixtral.csv"
  gzip -f "$W/clocks-mixtral.csv"
fi
echo "end: $(( $(date +%s) - start )) s"
tar czf "$OUT/call1.tgz" -C "$W" .
