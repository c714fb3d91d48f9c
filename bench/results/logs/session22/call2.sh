#!/usr/bin/env bash
# Session 22, call 2 (one GPU; nvidia-h200 asked). main + `epfuse bench --sustained` (.carry/s22/new-epfuse;
# the kernels are main's). On an H200: issue 13's table (session 21 call 2's commands, --sustained 1500
# added), DeepGEMM and MegaMoE in the dsv3 bench. On any other GPU: energy per call, back to back, of
# (1) DeepGEMM's two FP8 grouped GEMMs of mixtral alone (deepgemm_mixtral_energy.py) on torch.randn data
# and on our generator's distribution (uniform x 2^-j per block), randn again last; (2) our fused layer,
# FP8 mixtral, dsv3 T=4096, qwen3 T=16384 and bf16 mixtral (--sustained 1500). nvidia-smi every 20 ms
# beside the mixtral runs. Everything under $OUT as one tarball.
cd "$(dirname "$0")/../../../.."
here=$PWD/bench/results/logs/session22
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
BIN=.carry/s22/new-epfuse
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
  sample() { nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader -lms 20 > "$1" 2>&1 & }
  # The first call compiles DeepGEMM's kernels (JIT): a short run first.
  PYTHONPATH=$PWD/.peers/deepgemm DATA=randn SUSTAIN_MS=50 timeout 240 python3 "$here/deepgemm_mixtral_energy.py" 2>&1 | grep -v Warning | tail -2
  for data in randn uniform randn; do
    n=$(ls $W/clocks-deepgemm-* 2>/dev/null | wc -l)
    sample "$W/clocks-deepgemm-$data-$n.csv"; smi=$!
    PYTHONPATH=$PWD/.peers/deepgemm DATA=$data SUSTAIN_MS=1500 timeout 90 python3 "$here/deepgemm_mixtral_energy.py" 2>&1 | grep -v Warning | tail -2
    kill $smi; sleep 1; python3 scripts/clock_summary.py "$W/clocks-deepgemm-$data-$n.csv"
  done
  echo "deepgemm done after $(( $(date +%s) - start )) s"
  for shape in "mixtral 4096 14336 2 2 4096 fp8" "mixtral 4096 14336 2 2 4096 bf16" "dsv3 7168 2048 64 8 4096 fp8" "qwen3 2048 768 32 8 16384 fp8"; do
    set -- $shape
    [ $(left) -lt 40 ] && break
    [ "$1" = mixtral ] && { sample "$W/clocks-epfuse-$1-$7.csv"; smi=$!; }
    timeout $(( $(left) - 5 )) $BIN bench --impl fused --dtype $7 --ranks 1 --torch off --iters 30 --sustained 1500 --ceilings $CEIL \
      --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$W/sustained-$1-$7.json" 2>&1 | grep -E " fused |rror|sustained" | cut -c1-250
    [ "$1" = mixtral ] && { kill $smi; sleep 1; python3 scripts/clock_summary.py "$W/clocks-epfuse-$1-$7.csv"; }
  done
fi
gzip -f $W/*.csv 2>/dev/null
echo "end: $(( $(date +%s) - start )) s"
tar czf "$OUT/call2.tgz" -C "$W" .
