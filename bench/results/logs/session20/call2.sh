#!/usr/bin/env bash
# Session 20, call 2 (one GPU): exp/scheduler-warps (.carry/build: the producer warpgroup split into
# loading warps 0-1 and scheduling warps 2-3) against main (.carry/s20/base-epfuse, 829f881):
# (1) its fault entries and the FP8 tile / world-1 FP8 layer tests; (2) an A/B of the fused FP8 layer,
# two rounds, base first; (3) its task timeline (.carry/s20/sched-trace-epfuse, the branch with
# -DEPFUSE_TRACE=ON) at mixtral, dsv3 and qwen3 at large T. Everything under $OUT goes back as one tarball.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
OUT=$W EPFUSE_CTEST_REGEX='^(test_gpu_faults_w1|test_gpu_faults_onegpu_w4|run_fused_fault_onegpu_w4.*|gpu_fp8_tma_tile|test_gpu_fused_fp8_w1)$' \
  timeout 150 bash scripts/device-run.sh ctest > /dev/null 2>&1
echo "tests rc=$? after $(( $(date +%s) - start )) s: $(grep -cE "Test +#.*Passed" "$W/ctest.log") passed"
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$W/ctest.log" | tail -12; mv "$W/ctest.log" "$W/ctest-1.log"; gzip -f "$W/ctest-1.log"
OUT=$W EPFUSE_BASE_BIN=$PWD/.carry/s20/base-epfuse EPFUSE_NEW_BIN=$PWD/.carry/build/tools/epfuse EPFUSE_AB_ROUNDS=2 EPFUSE_AB_ARGS="--dtype fp8" \
  EPFUSE_AB_SHAPES="mixtral 4096 14336 2 2 4096;dsv3 7168 2048 64 8 128,1024,4096;qwen3 2048 768 32 8 128,16384" \
  timeout 330 bash scripts/device-run.sh ab 2>&1 | grep -E "fused fp8|rror|illegal|timed" | cut -c1-150
echo "after ab: $(( $(date +%s) - start )) s"
for shape in "mixtral 4096 14336 2 2 4096" "dsv3 7168 2048 64 8 4096" "qwen3 2048 768 32 8 16384"; do set -- $shape
  [ $(( $(date +%s) - start )) -gt 540 ] && break
  EPFUSE_TRACE_LAUNCH=20 EPFUSE_TRACE_FILE=$W/trace-$1-fp8.csv timeout 40 .carry/s20/sched-trace-epfuse bench --impl fused --dtype fp8 --ranks 1 --torch off \
    --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 \
    2>&1 | grep -E "^custom|rror" | sed "s/^/trace $1: /" | cut -c1-170
done 2>&1 | tee "$W/trace.log"
for f in $W/trace-*.csv; do python3 scripts/trace_report.py $f > ${f%.csv}-report.txt 2>&1; grep -A3 "^GEMM tiles\|^math gaps\|^hand-over" ${f%.csv}-report.txt | cut -c1-250; done
gzip -f $W/*.csv
echo "end: $(( $(date +%s) - start )) s"
tar czf "$OUT/call2.tgz" -C "$W" .
