#!/usr/bin/env bash
# Session 25, calls 5-8: main's whole GPU test suite (the ctest entries labelled gpu; main's kernel is
# f0c6fe8's, src unchanged since e844625), its build carried compressed (.carry/build.tar.xz).
#   SET=multi (call 5, nvidia-h100-x4): the entries that need 2 or 4 GPUs (run_*_w2/_w4, test_gpu_*_w2/_w4,
#     one process a GPU over NVLink); SET=single PART=1|2 (calls 7-8, one GPU): the others (world 1 and
#     the one-GPU multi-rank mode), every second one each; SET=file NAMES=F: the entries listed in F
#     (call 6: call5-multi-left.txt, the 59 multi-GPU entries call 5 did not reach in its 560 s).
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
nvidia-smi --query-gpu=index,name,clocks.sm,power.limit --format=csv,noheader
tar xJf .carry/build.tar.xz -C .carry
# The ctest files name the dev machine's build and source dirs: scripts/device-run.sh's links, first.
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' .carry/build/CMakeCache.txt)
bin=$(sed -n 's/^CMAKE_CACHEFILE_DIR:INTERNAL=//p' .carry/build/CMakeCache.txt)
[ -e "$src" ] || { mkdir -p "$(dirname "$src")" && ln -sfn "$PWD" "$src"; }
[ -e "$bin" ] || ln -sfn "$PWD/.carry/build" "$bin"
(cd "$bin" && find . -name '*_tests.cmake' -exec touch {} +)
list=$(cd "$bin" && ctest -N -L gpu | sed -n 's/.*Test *#[0-9]*: //p')
multi=$(echo "$list" | grep -E '_w[24](_|$)' | grep -v onegpu)
case ${SET:?} in
  multi) names=$multi ;;
  single) names=$(echo "$list" | grep -vxF -f <(echo "$multi") | awk -v p=${PART:?} 'NR % 2 == p % 2') ;;
  file) names=$(cat "${NAMES:?}") ;;  # e.g. the entries a timed-out call did not reach
esac
echo "$SET ${PART:-}: $(echo "$names" | wc -l) entries"
re="^($(echo "$names" | paste -sd'|'))\$"
OUT=$W EPFUSE_CTEST_REGEX="$re" timeout 560 bash scripts/device-run.sh ctest > "$W/ctest-run.log" 2>&1
echo "ctest: rc=$? after $(( $(date +%s) - start )) s"
grep -E "tests passed|tests failed|Total Test time" "$W"/ctest.log; grep -E "^\s+[0-9]+ - |\*\*\*|Not Run|Skipped" "$W"/ctest.log | head -40
grep -cE "Test +#.*Passed" "$W"/ctest.log
gzip -f "$W"/ctest.log
tar czf "$OUT/call5-${SET}${PART:-}.tgz" -C "$W" .
