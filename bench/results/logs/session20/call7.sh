#!/usr/bin/env bash
# Session 20, call 7 (one GPU): is DeepGEMM's FP8 grouped GEMM power-capped on mixtral's shapes too?
# nvidia-smi every 20 ms while (1) DeepGEMM's two FP8 grouped GEMMs run back to back 1000 times
# (deepgemm_mixtral_power.py; DeepGEMM from .carry/peers.tgz, built as ../shared/peers/run_deepgemm_peers.sh
# gemm does) and (2) main benches mixtral FP8 (200 timed calls). Everything under $OUT as one tarball.
cd "$(dirname "$0")/../../../.."
here=$PWD/bench/results/logs/session20
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
nvidia-smi --query-gpu=name,power.limit --format=csv,noheader
mkdir -p .peers && tar xzf .carry/peers.tgz -C .peers
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-} PATH=/opt/torch/.venv/bin:$PATH
export CXX=/usr/bin/g++ CC=/usr/bin/gcc CPATH=/usr/local/cuda/include/cccl TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 PYTHONUNBUFFERED=1
(cd .peers/deepgemm && timeout 300 python3 setup.py build_ext --inplace > "$W/deepgemm_build.log" 2>&1) || { tail -n 20 "$W/deepgemm_build.log"; }
for d in cute cutlass; do ln -sfn "$PWD/.peers/deepgemm/third-party/cutlass/include/$d" "$PWD/.peers/deepgemm/deep_gemm/include/$d"; done
echo "built after $(( $(date +%s) - start )) s"
summary() {
  python3 scripts/clock_summary.py "$1"
}
sample() { nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader -lms 20 > "$1" 2>&1 & }
# DeepGEMM's first call compiles its kernels (JIT): a short run first, then the sampled one.
PYTHONPATH=$PWD/.peers/deepgemm ITERS=10 timeout 240 python3 "$here/deepgemm_mixtral_power.py" 2>&1 | grep -v Warning | tail -3
sample "$W/clocks-deepgemm.csv"; smi=$!
PYTHONPATH=$PWD/.peers/deepgemm ITERS=1000 timeout 120 python3 "$here/deepgemm_mixtral_power.py" 2>&1 | grep -v Warning | tail -3
kill $smi; sleep 1; summary "$W/clocks-deepgemm.csv"
sample "$W/clocks-epfuse.csv"; smi=$!
timeout 60 .carry/s20/base-epfuse bench --impl fused --dtype fp8 --ranks 1 --torch off --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 \
  --hidden 4096 --intermediate 14336 --experts 2 --topk 2 --tokens 4096 --iters 200 --json "$W/clocks-epfuse.json" 2>&1 | grep -E " fused |rror" | cut -c1-100
kill $smi; sleep 1; summary "$W/clocks-epfuse.csv"
echo "end: $(( $(date +%s) - start )) s"
gzip -f $W/*.csv
tar czf "$OUT/call7.tgz" -C "$W" .
