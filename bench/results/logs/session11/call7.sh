#!/usr/bin/env bash
# Session 11, call 7 (x4): issue 15's fault-injection test in process mode at world 4 (call 6's ctest step
# ran out of time on it), 4318191.
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
EPFUSE_CTEST_REGEX='^test_gpu_faults_w4$' timeout 200 bash scripts/device-run.sh ctest 2>&1 | tail -4
grep -E "^\[ +(OK|FAILED|PASSED) |tests passed|tests failed|Total Test" $OUT/ctest.log | tail -30
