#!/usr/bin/env bash
# Session 25, call 3 (one GPU; nvidia-h200 asked): exp/mc-ahead's timeline (b06df5f, trace build,
# .carry/s25/trace-ahead) at qwen3 T=16384 and dsv3 T=4096. Call 2's trace ran the branch head's trace
# build by mistake (the CMake target `epfuse` is the library, not the CLI); this one is the branch's.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-} PATH=/opt/torch/.venv/bin:$PATH
CEIL=gemm=790,hbm=4250,nvlink=350,fp8=1447
for shape in "qwen3 2048 768 32 8 16384" "dsv3 7168 2048 64 8 4096" "mixtral 4096 14336 2 2 4096"; do set -- $shape
  EPFUSE_TRACE_LAUNCH=20 EPFUSE_TRACE_FILE=$W/trace-ahead-$1.csv timeout 60 .carry/s25/trace-ahead bench --impl fused --dtype fp8 \
    --ranks 1 --torch off --ceilings $CEIL --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 \
    2>&1 | grep -E " fused |rror" | sed "s/^/trace ahead $1: /" | cut -c1-170
  python3 scripts/trace_report.py $W/trace-ahead-$1.csv > $W/trace-ahead-$1-report.txt 2>&1
  echo "== ahead $1"; grep -A1 "^phase            weights" $W/trace-ahead-$1-report.txt | cut -c1-200; grep -A3 "^math gaps" $W/trace-ahead-$1-report.txt
done
echo "end: $(( $(date +%s) - start )) s"
gzip -f $W/*.csv
tar czf "$OUT/call3.tgz" -C "$W" .
