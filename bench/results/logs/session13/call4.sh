#!/usr/bin/env bash
# Session 13, call 4 (one GPU): the k-block rotation build's illegal instruction, live under cuda-gdb
# (call 3's lightweight core dump could not be opened: cuda-gdb asserted m_num_devices > 0), run as the
# bench's rank process itself (--worker-dir and the launcher's variables: cuda-gdb cannot follow a fork).
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
BIN=$PWD/.carry/rot13/epfuse
export RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=29517
mkdir -p /tmp/wd
for try in 1 2 3; do
  timeout 150 /usr/local/cuda/bin/cuda-gdb -batch -ex "set cuda break_on_launch none" -ex "set pagination off" -ex run \
    -ex "info cuda kernels" -ex "p \$pc" -ex "p \$errorpc" -ex "x/48i \$pc-0x200" -ex "x/16i \$pc" -ex "info cuda warps" \
    -ex "bt" --args $BIN bench --impl fused --dtype fp8 --ranks 1 --torch off --hidden 7168 --intermediate 2048 \
    --experts 64 --topk 8 --tokens 128,1024 --worker-dir /tmp/wd > "$OUT/rot-gdb-$try.log" 2>&1
  grep -qiE "CUDA_EXCEPTION|illegal" "$OUT/rot-gdb-$try.log" && break
done
for f in "$OUT"/rot-gdb-*.log; do echo "== $f"; grep -vE "^\[New Thread|^\[Thread .* exited|^\[Detaching|^\[Inferior" "$f" | head -c 9000; done
