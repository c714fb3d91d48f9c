#!/usr/bin/env bash
# Session 11, call 8 (x4, warm): the unfused chain bf16 and FP8 on the FACTS rows over 4 GPUs, one model
# per bench (each writes its JSON), 4318191.
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
for m in qwen3-30b:128,4096,16384 mixtral:4096 dsv3:128,1024,4096; do
  timeout 100 .carry/build/tools/epfuse bench --model ${m%%:*} --tokens ${m#*:} --impl unfused --ranks 4 --dtype bf16,fp8 --torch off \
    --json $OUT/bench-w4-unfused-${m%%:*}.json 2>&1 | grep -E "^(dsv3|qwen3|mixtral|config)|rror" | cut -c1-215
done
