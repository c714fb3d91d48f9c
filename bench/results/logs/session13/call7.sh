#!/usr/bin/env bash
# Session 13, call 7 (one GPU): compute-sanitizer racecheck on 9e2c663's binary (.carry/base13), the same
# three qwen3 T=128 FP8 calls as call 6's racecheck of the rotation build, full report kept.
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
for tag in base rot; do
  bin=$([ $tag = rot ] && echo .carry/rot13/epfuse || echo .carry/base13/epfuse)
  EPFUSE_TIMEOUT_MS=120000 timeout 150 /usr/local/cuda/bin/compute-sanitizer --tool racecheck --print-limit 40 $bin run --impl fused \
    --hidden 2048 --intermediate 768 --experts 32 --topk 8 --dtype fp8 --ranks 1 --tokens 128 --iters 3 > "$OUT/racecheck-$tag.log" 2>&1
  echo "== $tag: $(grep -c 'Race reported' "$OUT/racecheck-$tag.log") reports; $(grep 'RACECHECK SUMMARY' "$OUT/racecheck-$tag.log")"
  grep -A3 "Race reported" "$OUT/racecheck-$tag.log" | grep -oE "(Read|Write) access at [^(]*\(?[^ ]* in [a-z_0-9.]+:[0-9]+|(Read|Write) access at void [a-z:_]+<" | sort | uniq -c | head -20
done
