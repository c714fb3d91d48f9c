#!/usr/bin/env bash
# Session 23, call 8 (the 4x H100 machine call 7 got, still warm): main's fused FP8 layer at world 4 over
# NVLink, one process a GPU (main's CLI, .carry/s23/main-epfuse; the FP8 k-block changed since the last
# real world-4 run, session 19): the CLI matrix's FP8 cases (4 routings x T in {0, 1, 7, 128}, uneven T)
# and the three model shapes at T = 128, every run checked against the float64 reference.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
start=$(date +%s); pass=0; fail=0
run() { if timeout 60 .carry/s23/main-epfuse run --impl fused --dtype fp8 --ranks 4 "$@" > "$OUT/run.tmp" 2>&1; then pass=$((pass+1)); else fail=$((fail+1)); echo "FAIL: $*"; tail -5 "$OUT/run.tmp"; fi; { echo "== $*"; cat "$OUT/run.tmp"; } >> "$OUT/call8.log"; }
for r in uniform skewed one-expert dropped; do for t in 0 1 7 128; do
  run --hidden 256 --intermediate 384 --experts 16 --topk 4 --routing $r --tokens $t --seed $((4000 + t))
done; done
run --hidden 256 --intermediate 384 --experts 16 --topk 4 --routing uniform --tokens 128,0,7,1 --seed 4200
for m in dsv3 qwen3-30b mixtral; do run --model $m --tokens 128 --verify-rows 16; done
rm -f "$OUT/run.tmp"
echo "passed $pass, failed $fail, after $(( $(date +%s) - start )) s"; grep -E "verified|rel err|max" "$OUT/call8.log" | tail -4
