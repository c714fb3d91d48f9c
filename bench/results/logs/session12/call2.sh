#!/usr/bin/env bash
# Session 12, call 2 (one GPU): where the illegal instruction of the combine-grid build (HEAD + session 11's
# combine-grid.patch, .carry/cg/epfuse) happens: the failing qwen3 bench under a GPU core dump, read by cuda-gdb.
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
ls /usr/local/cuda/bin | grep -E "gdb|sanitizer"; /usr/local/cuda/bin/nvcc --version | tail -1
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
# (this run: no core dump) export CUDA_ENABLE_COREDUMP_ON_EXCEPTION=1 CUDA_ENABLE_LIGHTWEIGHT_COREDUMP=1 CUDA_COREDUMP_FILE=/tmp/core_%p.nvcudmp
for try in 1 2; do
  for shape in "qwen3 2048 768 32 8 128,4096,16384" "dsv3 7168 2048 64 8 128,1024,4096"; do set -- $shape
    timeout 100 .carry/cg/epfuse bench --impl fused --dtype bf16,fp8 --ranks 1 --torch off --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 \
      --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 2>&1 | grep -E "^custom|rror" | sed "s/^/try $try $1: /" | cut -c1-100
    ls /tmp/core_*.nvcudmp >/dev/null 2>&1 && break 2
  done
done 2>&1 | tee "$OUT/cg-runs.log"
core=$(ls -S /tmp/core_*.nvcudmp 2>/dev/null | head -1)
echo "core: $core $(du -h "$core" 2>/dev/null | cut -f1)"
if [ -n "$core" ]; then
  unset CUDA_ENABLE_COREDUMP_ON_EXCEPTION
  timeout 200 /usr/local/cuda/bin/cuda-gdb -batch -ex "target cudacore $core" -ex "info cuda kernels" -ex "p \$pc" \
    -ex "x/24i \$pc-0xc0" -ex "x/8i \$pc" -ex "bt" -ex "info cuda warps" -ex "info cuda lanes" .carry/cg/epfuse > "$OUT/cg-gdb.log" 2>&1
  head -c 20000 "$OUT/cg-gdb.log"
fi
