#!/usr/bin/env bash
# Session 14, call 6 (one GPU): is run_fused_fault_onegpu_w4_bad_ids (failed once in call 4 on the landing
# build) flaky or caused by the change? The same command 6 times each with 78393aa (head), call 3's cand
# build (deferred abort read) and the landing build (new); the other fault kinds twice with new.
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
tar xzf .carry/v2.tgz -C .carry
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
fault() {  # bin kind expect
  EPFUSE_TIMEOUT_MS=1000 EPFUSE_FAULT=rank=3,kind=$2,call=2 timeout 60 bash tests/gpu/run/expect_failure.sh "$3" 60 $1 run --impl fused \
    --one-gpu --hidden 256 --intermediate 256 --experts 16 --topk 4 --ranks 4 --tokens 64 --iters 4 > $OUT/f.log 2>&1
  local rc=$?; echo "$(basename $(dirname $1))/$(basename $1) $2 rc=$rc $(grep -E "FAILED|PASSED|matches" $OUT/f.log | head -1)"
  [ $rc != 0 ] && sed 's/^/    /' $OUT/f.log | head -12
}
for i in 1 2 3 4 5 6; do for b in .carry/v/head .carry/cand-epfuse .carry/build/tools/epfuse; do
  fault $b bad_ids "rank 0: rank 3 reported invalid input"; done; done 2>&1 | tee $OUT/faults.log
for i in 1 2; do for k in skip stall throw; do fault .carry/build/tools/epfuse $k "rank 0: timed out in [a-z0-9 ]+ waiting for the count message of rank 3"; done
  fault .carry/build/tools/epfuse exit "rank 3: EPFUSE_FAULT: exit in forward call 2"; done 2>&1 | tee -a $OUT/faults.log
