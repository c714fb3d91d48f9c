#!/usr/bin/env bash
# Runs on a lent GPU machine over a build made on the dev machine and carried as .carry/build
# (see scripts/device-pack.sh). Usage: bash scripts/device-run.sh STEP... ; logs go to $OUT (or /tmp/out).
# Steps: unit (GPU unit tests), run-unfused / run-fused (CLI correctness matrix), smoke, vary1000,
# bench-<impls> (impls joined by '_', e.g. bench-unfused_fused).
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
export PATH=/opt/torch/.venv/bin:$PATH
repo=$(cd "$(dirname "$0")/.." && pwd)
# ctest files hold the dev machine's absolute paths (source and build dirs): make them valid here.
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$repo/.carry/build/CMakeCache.txt")
bin=$(sed -n 's/^CMAKE_CACHEFILE_DIR:INTERNAL=//p' "$repo/.carry/build/CMakeCache.txt")
if [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -sfn "$repo" "$src"; fi
[ -e "$bin" ] || ln -sfn "$repo/.carry/build" "$bin"
cd "$bin"
# The copy does not keep modification times in order: make gtest's discovered test lists newer than the
# executables so ctest reads them instead of re-running discovery with this machine's CMake modules.
find . -name '*_tests.cmake' -exec touch {} +
nvidia-smi --query-gpu=index,name,clocks.sm,memory.used --format=csv,noheader
for step in "$@"; do
  echo "=== $step $(date -u +%H:%M:%S)"
  case $step in
    unit) ctest -L gpu -E '^run_' --timeout 180 --output-on-failure 2>&1 | tee "$OUT/unit.log" | grep -E "Test +#|tests passed|tests failed|FAILED|Error|error" | tail -40 ;;
    run-unfused|run-fused) impl=${step#run-}
      ctest -L run -R "^run_${impl}_" --timeout 300 --output-on-failure 2>&1 | tee "$OUT/$step.log" | grep -E "tests passed|tests failed|\*\*\*|Failed|Timeout" | tail -40 ;;
    smoke)
      for impl in unfused fused; do
        EPFUSE_TIMEOUT_MS=5000 timeout 120 tools/epfuse run --impl $impl --ranks 4 --hidden 256 --intermediate 256 --experts 16 --topk 4 --tokens 128,0,7,1 2>&1 | tail -12
      done ;;
    vary1000)  # 1,000 consecutive calls, fresh routing and token counts each, checked every 100th
      for impl in fused unfused; do for w in 1 2 4; do
        timeout 300 tools/epfuse run --impl $impl --ranks $w --hidden 512 --intermediate 256 --experts 32 --topk 8 \
          --tokens random --max-tokens 256 --routing dropped --iters 1000 --vary --verify-every 100 2>&1 | tail -3
      done; done 2>&1 | tee "$OUT/vary1000.log" ;;
    bench-*) impls=${step#bench-}  # e.g. bench-unfused_fused (no "+": $OUT names allow only [A-Za-z0-9._-])
      timeout 560 tools/epfuse bench --configs facts --impl "${impls//_/,}" --ranks 4 --json "$OUT/bench-$impls.json" 2>&1 | tee "$OUT/bench-$impls.log" | tail -30 ;;
    *) echo "unknown step $step" ;;
  esac
done
