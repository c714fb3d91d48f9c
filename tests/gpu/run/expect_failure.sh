#!/usr/bin/env bash
# expect_failure.sh REGEX LIMIT_S COMMAND...: runs COMMAND (output shown) and passes only if it exits
# non-zero within LIMIT_S seconds and its output matches the extended regex REGEX. Exit 77 (skipped)
# passes through; a run past the limit is a hang and fails.
set -u
regex=$1 limit=$2
shift 2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
start=$(date +%s.%N)
timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
rc=$?
cat "$log"
took=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
echo "expect_failure: exit $rc after ${took} s"
[ $rc -eq 77 ] && exit 77
if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then echo "expect_failure: FAILED: still running after $limit s (a hang)"; exit 1; fi
if [ $rc -eq 0 ]; then echo "expect_failure: FAILED: exited 0 under a fault"; exit 1; fi
if ! grep -Eq "$regex" "$log"; then echo "expect_failure: FAILED: no line matches /$regex/"; exit 1; fi
echo "expect_failure: passed (non-zero exit, /$regex/ found)"
