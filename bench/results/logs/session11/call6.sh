#!/usr/bin/env bash
# Session 11, call 6 (nvidia-h200-x4 / h100-x4): issue 15 at world 4 on 4318191, everything from one build:
# the fused world-4 matrix with real NVLink (GPU tests, CLI entries bf16 and FP8, the faults test), the
# 1,000-call varying run bf16 and FP8 at world 4, the Python package's world-4 checks (HF block), then the
# seven FACTS configurations over 4 GPUs: fused bf16 and FP8 beside the PyTorch peer, in one bench.
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=index,name --format=csv,noheader; nvidia-smi topo -m 2>/dev/null | head -6
export EPFUSE_CTEST_REGEX='^(test_gpu_(fused|fused_fp8|faults)_w4|run_fused_(fp8_)?w4_.*)$'
timeout 170 bash scripts/device-run.sh ctest 2>&1 | tail -4
grep -E "tests passed|tests failed|Failed|Timeout" $OUT/ctest.log | tail -8
cd "$(sed -n 's/^CMAKE_CACHEFILE_DIR:INTERNAL=//p' .carry/build/CMakeCache.txt)"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-} PATH=/opt/torch/.venv/bin:$PATH
timeout 215 tools/epfuse bench --configs facts --impl fused --ranks 4 --dtype bf16,fp8 --torch on \
  --json $OUT/bench-w4-torch.json 2>&1 | tee $OUT/bench-w4-torch.log | grep -v "^epfuse bench: .*%" | tail -40
for dt in bf16 fp8; do
  timeout 45 tools/epfuse run --impl fused --dtype $dt --ranks 4 --hidden 256 --intermediate 256 --experts 16 --topk 4 \
    --tokens 128 --iters 1000 --vary --verify-every 100 2>&1 | tee $OUT/vary1000-w4-$dt.log | tail -3
done
cd - >/dev/null
EPFUSE_PYTEST_ARGS="-k test_multi_rank" timeout 90 bash scripts/device-run.sh pytest 2>&1 | tail -5
