#!/usr/bin/env bash
# Session 13, call 3 (one GPU): where the illegal instruction of the k-block rotation build
# (.carry/rot13/epfuse, which faulted in most FP8 bench runs of call 2) happens: the qwen3 FP8 bench
# under a GPU core dump, read by cuda-gdb.
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
export CUDA_ENABLE_COREDUMP_ON_EXCEPTION=1 CUDA_ENABLE_LIGHTWEIGHT_COREDUMP=1 CUDA_COREDUMP_FILE=/tmp/core_%p.nvcudmp
BIN=.carry/rot13/epfuse
for try in 1 2 3 4; do
  for shape in "qwen3 2048 768 32 8 128,4096" "dsv3 7168 2048 64 8 128,1024"; do set -- $shape
    timeout 100 $BIN bench --impl fused --dtype fp8 --ranks 1 --torch off --hidden $2 --intermediate $3 --experts $4 \
      --topk $5 --tokens $6 2>&1 | grep -E "^custom|rror" | sed "s/^/try $try $1: /" | cut -c1-120
    ls /tmp/core_*.nvcudmp >/dev/null 2>&1 && break 2
  done
done 2>&1 | tee "$OUT/rot-runs.log"
core=$(ls -S /tmp/core_*.nvcudmp 2>/dev/null | head -1)
echo "core: $core $(du -h "$core" 2>/dev/null | cut -f1)"
if [ -n "$core" ]; then
  unset CUDA_ENABLE_COREDUMP_ON_EXCEPTION
  timeout 240 /usr/local/cuda/bin/cuda-gdb -batch -ex "target cudacore $core" -ex "info cuda kernels" -ex "p \$pc" \
    -ex "x/40i \$pc-0x180" -ex "x/12i \$pc" -ex "info cuda warps" -ex "info cuda lanes" $BIN > "$OUT/rot-gdb.log" 2>&1
  head -c 12000 "$OUT/rot-gdb.log"
fi
