#!/usr/bin/env bash
# Session 20, call 4 (one GPU): an upper bound for hiding the epilogues. Diagnostic builds of main
# (829f881 + logs/session20/diag-no-epi.patch; results wrong by design, only their times count):
# .carry/s20/d1-epfuse (-DEPFUSE_DIAG_NO_EPI=1: no FP8 Linear1 epilogue values or stores) and
# .carry/s20/d2-epfuse (=2: also no Linear2 stores), each against main (.carry/s20/base-epfuse) in
# scripts/device-run.sh ab, two rounds, base first. Call 5 reran it as DIAGS="d1r d2r" (the same
# patch after its second version: the epilogues skipped from the second launch of a process on, so the
# data the tensor cores multiply stays real). Everything under $OUT goes back as one tarball.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
for d in ${DIAGS:-d1 d2}; do
  mkdir -p "$W/$d"
  OUT=$W/$d EPFUSE_BASE_BIN=$PWD/.carry/s20/base-epfuse EPFUSE_NEW_BIN=$PWD/.carry/s20/$d-epfuse EPFUSE_AB_ROUNDS=2 EPFUSE_AB_ARGS="--dtype fp8" \
    EPFUSE_AB_SHAPES="mixtral 4096 14336 2 2 4096;dsv3 7168 2048 64 8 4096;qwen3 2048 768 32 8 16384" \
    timeout 270 bash scripts/device-run.sh ab 2>&1 | grep -E "fused fp8|illegal|timed" | sed "s/^/$d /" | cut -c1-110
  echo "after $d: $(( $(date +%s) - start )) s"
done
tar czf "$OUT/${TARBALL:-call4}.tgz" -C "$W" .
