#!/usr/bin/env bash
# Session 23, call 1 (one GPU; nvidia-h200 asked). On an H200: issue 13's table on main (session 22
# call 2's H200 branch: every row with --sustained 1500, DeepGEMM and MegaMoE in the dsv3 bench). On any
# other GPU: session 22's question 5, whether DeepGEMM's tensor pipe stays busy with our spacing of
# drains: its two FP8 grouped GEMMs at mixtral's per-GPU shape with its own tile (128 x 192) and forced
# to 128 x 128 (--block-n-multiple 128), back to back with the energy counter (--sustained's peer), then
# one launch of each GEMM of each config under Nsight Compute (clocks locked at base). Everything under
# $OUT as one tarball.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - start) )); }
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
mkdir -p .peers && tar xzf .carry/peers.tgz -C .peers
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-} PATH=/opt/torch/.venv/bin:$PATH
CEIL=gemm=790,hbm=4250,nvlink=350,fp8=1447
BIN=.carry/build/tools/epfuse
if [[ "$gpu" == *H200* ]]; then
  for shape in "qwen3 2048 768 32 8 128,4096,16384 80" "mixtral 4096 14336 2 2 4096 110" "dsv3 7168 2048 64 8 128,1024,4096 0"; do
    set -- $shape
    limit=$7; [ "$limit" = 0 ] && limit=$(( $(left) - 5 ))
    peers=$([ "$1" = dsv3 ] && echo "--peers $PWD/.peers")
    timeout $limit $BIN bench --impl unfused,fused --dtype bf16,fp8 --ranks 1 --torch off --sustained 1500 \
      --ceilings $CEIL --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 \
      $peers --json "$W/table-$1.json" > "$W/table-$1.log" 2>&1
    echo "$1: rc=$? after $(( $(date +%s) - start )) s"
    grep -E "^(custom|qwen3|mixtral|dsv3|deepgemm|megamoe)" "$W/table-$1.log" | cut -c1-220 | tail -40
  done
else
  export CXX=/usr/bin/g++ CC=/usr/bin/gcc CPATH=/usr/local/cuda/include/cccl TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 PYTHONUNBUFFERED=1
  (cd .peers/deepgemm && timeout 300 python3 setup.py build_ext --inplace > "$W/deepgemm_build.log" 2>&1) || tail -n 20 "$W/deepgemm_build.log"
  for d in cute cutlass; do ln -sfn "$PWD/.peers/deepgemm/third-party/cutlass/include/$d" "$PWD/.peers/deepgemm/deep_gemm/include/$d"; done
  echo "deepgemm built after $(( $(date +%s) - start )) s"
  dg() { PYTHONPATH=$PWD/.peers/deepgemm python3 bench/peers/deepgemm_sustained.py --hidden 4096 --intermediate 14336 --experts 2 --rows 4096 --data uniform "$@"; }
  # The first call of each config compiles DeepGEMM's kernels (JIT): a short run first, configs printed.
  for n in 0 128; do DG_PRINT_CONFIGS=1 timeout 240 bash -c "$(declare -f dg); dg --sustain-ms 50 --block-n-multiple $n" 2>&1 | grep -v Warning | tail -4; done
  echo "jit done after $(( $(date +%s) - start )) s"
  for n in 0 128 0 128; do timeout 60 bash -c "$(declare -f dg); dg --sustain-ms 1500 --block-n-multiple $n" 2>&1 | grep -v Warning | tail -1; done
  ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis"
  for n in 0 128; do
    [ $(left) -lt 60 ] && break
    timeout $(( $(left) - 20 )) "$ncu" $sections --target-processes all -k regex:fp8 --launch-skip 4 --launch-count 2 \
      bash -c "$(declare -f dg); dg --sustain-ms 20 --block-n-multiple $n" > "$W/ncu-deepgemm-mixtral-n$n.txt" 2>&1
    echo "ncu n$n: exit $? after $(( $(date +%s) - start )) s"
  done
  for f in "$W"/ncu-*.txt; do
    echo "== $(basename "$f")"
    grep -E "^  [a-z_0-9]+.*\(|Duration|SM Frequency|Elapsed Cycles|Compute \(SM\) Throughput|Executed Ipc Active|Issue Slots Busy|Warp Cycles Per Issued|L2 Cache Throughput|DRAM Throughput|Registers Per|Block Size|Grid Size|Cluster Size" "$f" | cut -c1-150 | head -40
  done
fi
echo "end: $(( $(date +%s) - start )) s"
tar czf "$OUT/call1.tgz" -C "$W" .
