#!/usr/bin/env bash
# Session 10, call 2 (nvidia-h200-x2): issue 15 at world 2 on 6bcb123: the fused world-2 matrix (GPU tests,
# CLI entries bf16 and FP8, process-mode faults), 1,000 varying calls bf16 and FP8, then the seven FACTS
# configurations over 2 GPUs: unfused and fused, bf16 and FP8, and the PyTorch peer, in one bench.
cd "$(dirname "$0")/.."
export EPFUSE_CTEST_REGEX='^(test_gpu_(fused|fused_fp8|faults|comm)_w2|run_fused_(fp8_|padded_bf16_|padded_fp8_|fault_)?w2_.*)$'
timeout 210 bash scripts/device-run.sh ctest 2>&1 | tail -8
grep -E "tests passed|tests failed" $OUT/ctest.log
cd "$(sed -n 's/^CMAKE_CACHEFILE_DIR:INTERNAL=//p' .carry/build/CMakeCache.txt)"
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-} PATH=/opt/torch/.venv/bin:$PATH
for dt in bf16 fp8; do
  timeout 60 tools/epfuse run --impl fused --dtype $dt --ranks 2 --hidden 256 --intermediate 256 --experts 16 --topk 4 \
    --tokens 128 --iters 1000 --vary --verify-every 100 2>&1 | tee $OUT/vary1000-w2-$dt.log | tail -4
done
timeout 330 tools/epfuse bench --configs facts --impl unfused,fused --ranks 2 --dtype bf16,fp8 --torch on \
  --json $OUT/bench-w2-torch.json 2>&1 | tee $OUT/bench-w2-torch.log | grep -v "^epfuse bench: .*%" | tail -40
