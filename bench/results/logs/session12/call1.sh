#!/usr/bin/env bash
# Session 12, call 1 (nvidia-h200-x4): issue 15's bench at world 4 in one call, one build: the seven FACTS
# configurations over 4 GPUs, unfused and fused, bf16 and FP8, PyTorch, then MegaMoE SM90 FP8 on 4 GPUs.
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=index,name --format=csv,noheader
mkdir -p .peers && tar xzf .carry/peers.tgz -C .peers
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-} PATH=/opt/torch/.venv/bin:$PATH
start=$(date +%s)
timeout 575 .carry/build/tools/epfuse bench --configs facts --impl unfused,fused --ranks 4 --dtype bf16,fp8 --torch on \
  --peers $PWD/.peers --peer-steps megamoe --json $OUT/bench-w4-all.json > $OUT/bench-w4-all.log 2>&1
echo "bench rc=$? after $(( $(date +%s) - start )) s"
grep -v "^epfuse bench: .*%" $OUT/bench-w4-all.log | grep -vE "^  peers\| .*(Warning|warn)" | tail -60 | cut -c1-250
