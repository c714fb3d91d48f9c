#!/usr/bin/env bash
# Session 22, call 4 (one GPU; nvidia-h200 asked). On an H200: call2.sh (issue 13's table). Otherwise the
# per-clock question, side by side under Nsight Compute (clocks locked at base, so no power cap): where
# the cycles of mixtral's FP8 GEMMs go in DeepGEMM's grouped GEMM kernels (Linear1 and Linear2, one launch
# each, DG_PRINT_CONFIGS for their tile shapes) and in our fused FP8 kernel (one launch of the layer), the
# same five sections as scripts/device-run.sh profile-fp8. Everything under $OUT as one tarball.
cd "$(dirname "$0")/../../../.."
here=$PWD/bench/results/logs/session22
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
[[ "$gpu" == *H200* ]] && exec bash "$here/call2.sh"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
mkdir -p .peers && tar xzf .carry/peers.tgz -C .peers
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-} PATH=/opt/torch/.venv/bin:$PATH
export CXX=/usr/bin/g++ CC=/usr/bin/gcc CPATH=/usr/local/cuda/include/cccl TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 PYTHONUNBUFFERED=1
ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis"
# Ours first (needs no build): one launch of the fused FP8 layer at mixtral's per-GPU shape.
timeout 200 "$ncu" $sections -k regex:fused_moe_kernel --launch-skip 3 --launch-count 1 .carry/s22/new-epfuse run --impl fused \
  --dtype fp8 --hidden 4096 --intermediate 14336 --experts 2 --topk 2 --ranks 1 --tokens 4096 --iters 5 --verify-rows 2 \
  > "$W/ncu-epfuse-mixtral-fp8.txt" 2>&1; echo "ours: exit $? after $(( $(date +%s) - start )) s"
(cd .peers/deepgemm && timeout 240 python3 setup.py build_ext --inplace > "$W/deepgemm_build.log" 2>&1) || tail -n 20 "$W/deepgemm_build.log"
for d in cute cutlass; do ln -sfn "$PWD/.peers/deepgemm/third-party/cutlass/include/$d" "$PWD/.peers/deepgemm/deep_gemm/include/$d"; done
echo "deepgemm built after $(( $(date +%s) - start )) s"
PYTHONPATH=$PWD/.peers/deepgemm DG_PRINT_CONFIGS=1 DATA=uniform SUSTAIN_MS=50 timeout 200 python3 "$here/deepgemm_mixtral_energy.py" 2>&1 | grep -v Warning | tail -12
PYTHONPATH=$PWD/.peers/deepgemm DATA=uniform SUSTAIN_MS=20 timeout 200 "$ncu" $sections --target-processes all -k regex:fp8 \
  --launch-skip 4 --launch-count 2 python3 "$here/deepgemm_mixtral_energy.py" > "$W/ncu-deepgemm-mixtral-fp8.txt" 2>&1
echo "deepgemm ncu: exit $? after $(( $(date +%s) - start )) s"
for f in "$W"/ncu-*.txt; do
  echo "== $(basename "$f")"
  grep -E "^  [a-z_0-9]+.*\(|Duration|SM Frequency|Elapsed Cycles|Compute \(SM\) Throughput|Executed Ipc Active|Issue Slots Busy|Warp Cycles Per Issued|L2 Cache Throughput|DRAM Throughput|Memory Throughput|Registers Per|Block Size|Grid Size" "$f" | cut -c1-150 | head -60
done
echo "end: $(( $(date +%s) - start )) s"
tar czf "$OUT/call4.tgz" -C "$W" .
