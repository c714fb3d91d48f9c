#!/usr/bin/env bash
# Session 14, call 5 (one GPU): issue 13's world-1 table on the landing build: unfused and fused, bf16
# and FP8, on the per-GPU shapes; the last bench (dsv3) also runs DeepGEMM's grouped GEMMs alone and
# MegaMoE SM90 FP8 (--peers; their rows for every shape land in its table and JSON). First, the one-GPU
# world-4 bad-input fault run 8 times (its .gpu-scope variant had failed 2 of 13).
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name --format=csv,noheader
mkdir -p .peers && tar xzf .carry/peers.tgz -C .peers
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-} PATH=/opt/torch/.venv/bin:$PATH
fault() {  # kind expect
  EPFUSE_TIMEOUT_MS=1000 EPFUSE_FAULT=rank=3,kind=$1,call=2 timeout 60 bash tests/gpu/run/expect_failure.sh "$2" 60 .carry/build/tools/epfuse run \
    --impl fused --one-gpu --hidden 256 --intermediate 256 --experts 16 --topk 4 --ranks 4 --tokens 64 --iters 4 > $OUT/f.log 2>&1
  local rc=$?; echo "fault $1 rc=$rc"; [ $rc != 0 ] && sed 's/^/    /' $OUT/f.log | head -12
}
for i in 1 2 3 4 5 6 7 8; do fault bad_ids "rank 0: rank 3 reported invalid input"; done 2>&1 | tee $OUT/faults.log
start=$(date +%s)
for shape in "qwen3 2048 768 32 8 128,4096,16384 110" "mixtral 4096 14336 2 2 4096 80" "dsv3 7168 2048 64 8 128,1024,4096 0"; do
  set -- $shape
  limit=$7; [ "$limit" = 0 ] && limit=$(( 530 - ($(date +%s) - start) ))
  peers=$([ "$1" = dsv3 ] && echo "--peers $PWD/.peers")
  timeout $limit .carry/build/tools/epfuse bench --impl unfused,fused --dtype bf16,fp8 --ranks 1 --torch off \
    --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 \
    $peers --json "$OUT/fp8-$1.json" > "$OUT/fp8-$1.log" 2>&1
  echo "$1: rc=$? after $(( $(date +%s) - start )) s"
  grep -E "^(custom|qwen3|mixtral|dsv3)" "$OUT/fp8-$1.log" | cut -c1-150 | tail -30
done
