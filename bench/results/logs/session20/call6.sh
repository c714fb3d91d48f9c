#!/usr/bin/env bash
# Session 20, call 6 (one GPU): the SM clock, power and throttle reasons every 20 ms while three
# binaries bench mixtral FP8 (200 timed calls each): main (.carry/s20/base-epfuse), d1a (the Linear1
# epilogue skipped in every launch: h never written, Linear2 multiplies constant data) and d1r (skipped
# from the second launch on: h real). Is call 4's D1 gain the data's power? Everything under $OUT goes
# back as one tarball.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
for b in base d1a d1r base; do
  nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader -lms 20 > "$W/clocks-$b.csv" 2>&1 &
  smi=$!
  timeout 60 .carry/s20/$b-epfuse bench --impl fused --dtype fp8 --ranks 1 --torch off --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 \
    --hidden 4096 --intermediate 14336 --experts 2 --topk 2 --tokens 4096 --iters 200 --json "$W/clocks-$b.json" 2>&1 | grep -E " fused |rror" | cut -c1-100 | sed "s/^/$b: /"
  kill $smi; sleep 1
  python3 scripts/clock_summary.py "$W/clocks-$b.csv"
done
gzip -f $W/*.csv
tar czf "$OUT/call6.tgz" -C "$W" .
