#!/usr/bin/env bash
# Session 23, call 7 (nvidia-h200-x4 asked: the first multi-GPU kind with H200s lent in a week; GPU 0
# only). If the cards are H200s: issue 13's unmet row, mixtral at world 1 (fused and unfused, bf16 and
# FP8, --sustained 1500), then fused FP8 dsv3 T=4096 and qwen3-30b T=16384 beside it; main's CLI
# (.carry/s23/main-epfuse). No peers: the remaining device time does not cover their build. On other
# cards nothing. Everything under $OUT as one tarball.
cd "$(dirname "$0")/../../../.."
nvidia-smi --query-gpu=index,name,clocks.sm,power.limit --format=csv,noheader
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
[[ "$gpu" == *H200* ]] || exit 0
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
export CUDA_VISIBLE_DEVICES=0 NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
CEIL=gemm=790,hbm=4250,nvlink=350,fp8=1447
timeout 120 .carry/s23/main-epfuse bench --impl unfused,fused --dtype bf16,fp8 --ranks 1 --torch off --sustained 1500 \
  --ceilings $CEIL --hidden 4096 --intermediate 14336 --experts 2 --topk 2 --tokens 4096 --json "$W/table-mixtral.json" 2>&1 \
  | tee "$W/table-mixtral.log" | grep -E "^(config|custom)|rror" | cut -c1-250
echo "mixtral after $(( $(date +%s) - start )) s"
for shape in "dsv3 7168 2048 64 8 4096" "qwen3 2048 768 32 8 16384"; do set -- $shape
  timeout 60 .carry/s23/main-epfuse bench --impl fused --dtype fp8 --ranks 1 --torch off --sustained 1500 --ceilings $CEIL \
    --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$W/table-$1.json" 2>&1 \
    | tee "$W/table-$1.log" | grep -E "^custom|rror" | cut -c1-250
done
echo "end: $(( $(date +%s) - start )) s"
tar czf "$OUT/call7.tgz" -C "$W" .
