#!/usr/bin/env bash
# Session 13, call 6 (one GPU): the k-block rotation build's failure (.carry/rot13/epfuse) from its first
# error: FP8 benches with a 3 s wait bound (the first timeout record, if the context survives), then
# compute-sanitizer's synccheck (on it and on 9e2c663's binary, .carry/base13) and racecheck (on it) over
# three qwen3 T=128 FP8 calls.
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
ROT=.carry/rot13/epfuse; BASE=.carry/base13/epfuse
for try in 1 2 3; do
  for shape in "qwen3 2048 768 32 8" "dsv3 7168 2048 64 8"; do set -- $shape
    EPFUSE_TIMEOUT_MS=3000 timeout 90 $ROT bench --impl fused --dtype fp8 --ranks 1 --torch off --hidden $2 --intermediate $3 \
      --experts $4 --topk $5 --tokens 128,1024 2>&1 | grep -E "^custom|timed out|rror|abort" | grep -v "freeing\|~Symm\|~Comm\|destroying" \
      | sed "s/^/try $try $1: /" | cut -c1-260
  done
done 2>&1 | tee "$OUT/rot-timeout.log"
SAN=/usr/local/cuda/bin/compute-sanitizer
for run in "synccheck rot" "synccheck base" "racecheck rot"; do set -- $run; tool=$1 tag=$2
  bin=$([ $tag = rot ] && echo $ROT || echo $BASE)
  echo "=== $tool $tag"
  EPFUSE_TIMEOUT_MS=120000 timeout $([ $tool = racecheck ] && echo 150 || echo 100) $SAN --tool $tool --print-limit 20 $bin run --impl fused --hidden 2048 --intermediate 768 \
    --experts 32 --topk 8 --dtype fp8 --ranks 1 --tokens 128 --iters 3 2>&1 | grep -vE "^\s*$" | tail -40 | cut -c1-240
done 2>&1 | tee "$OUT/sanitizer.log"
