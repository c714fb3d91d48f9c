#!/usr/bin/env bash
# Session 23 (dev machine, no GPU): DeepGEMM's SM90 FP8 1D2D kernel compiled here for mixtral's Linear1
# configs (call 1: 128 x 192 with cluster_m 2, and 128 x 128 with cluster_n 2), with the flags of its JIT
# (csrc/jit/compiler.hpp), for its SASS beside ours. DEEPGEMM: the tree ../shared/peers' recipe unpacks
# (.carry/peers.tgz's deepgemm/). CUOBJDUMP: any cuobjdump (this machine's CUDA has none; triton's works).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
DEEPGEMM=${DEEPGEMM:?set DEEPGEMM to the deepgemm tree}
out=${1:-/tmp/dg_sass}; mkdir -p "$out"
nvcc -std=c++20 -O3 --expt-relaxed-constexpr -cubin -gencode=arch=compute_90a,code=sm_90a \
  -I"$DEEPGEMM/deep_gemm/include" -I"$DEEPGEMM/third-party/cutlass/include" -I/usr/local/cuda/include/cccl \
  --diag-suppress=39,161,174,177,186,940 --ptxas-options=--register-usage-level=10,--verbose \
  -o "$out/dg.cubin" "$here/dg_sass.cu"
"${CUOBJDUMP:-cuobjdump}" -sass "$out/dg.cubin" > "$out/dg.sass"
echo "$out/dg.sass"
