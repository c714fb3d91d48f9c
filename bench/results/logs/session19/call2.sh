#!/usr/bin/env bash
# Session 19, call 2 (one GPU), on the landing build (.carry/build: main + the one-MUFU FP8 SwiGLU +
# the shared register-store loop of the three epilogues): (1) its GPU tests, bf16 and FP8: world 1
# (tile tests, layer tests, CLI matrices, faults), one-GPU world 4 (layer tests, faults), one-GPU world 2
# and world 8 CLI matrices; (2) the task timeline (EPFUSE_TRACE, .carry/s19/trace-epfuse: the same
# source) of the fused FP8 kernel at mixtral and dsv3 T=4096: session 18's trace was of the staged
# epilogues, which this kernel no longer has; (3) the SM clock and power every 20 ms while the landing
# build benches mixtral FP8 (its calls spread 5-10% from p10 to p90 within one invocation: is it the
# clock?). Everything under $OUT goes back as one tarball.
cd "$(dirname "$0")/../../../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
for shape in "mixtral 4096 14336 2 2" "dsv3 7168 2048 64 8"; do set -- $shape
  EPFUSE_TRACE_LAUNCH=20 EPFUSE_TRACE_FILE=$W/trace-$1-fp8.csv timeout 120 .carry/s19/trace-epfuse bench --impl fused --dtype fp8 --ranks 1 --torch off \
    --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens 4096 \
    2>&1 | grep -E "^custom|rror" | sed "s/^/trace $1: /" | cut -c1-170
done 2>&1 | tee "$W/trace.log"
for f in $W/trace-*.csv; do python3 scripts/trace_report.py $f > ${f%.csv}-report.txt 2>&1; tail -12 ${f%.csv}-report.txt | cut -c1-240; done
gzip -f $W/*.csv
echo "after trace: $(( $(date +%s) - start )) s"
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_throttle_reasons.active --format=csv,noheader -lms 20 > "$W/clocks-mixtral.csv" 2>&1 &
smi=$!
timeout 90 .carry/build/tools/epfuse bench --impl fused --dtype fp8 --ranks 1 --torch off --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 \
  --hidden 4096 --intermediate 14336 --experts 2 --topk 2 --tokens 4096 --iters 200 --json "$W/clocks-mixtral.json" 2>&1 | grep -E " fused |rror" | cut -c1-150
kill $smi
python3 - "$W/clocks-mixtral.csv" <<'PY'
import sys, collections
rows = [l.strip().split(", ") for l in open(sys.argv[1]) if l.count(",") >= 4]
busy = [r for r in rows if r[2].endswith("W") and float(r[2][:-2]) > 300]
print(f"{len(rows)} samples, {len(busy)} above 300 W")
for name, i in (("clock MHz", 1), ("power W", 2)):
    v = sorted(float(r[i].split()[0]) for r in busy)
    if v: print(f"  {name}: min {v[0]:.0f} p10 {v[len(v)//10]:.0f} median {v[len(v)//2]:.0f} p90 {v[9*len(v)//10]:.0f} max {v[-1]:.0f}")
print("  throttle reasons:", collections.Counter(r[4] for r in busy).most_common(4))
PY
OUT=$W EPFUSE_CTEST_REGEX='^(gpu_tile_gemm|gpu_fp8_tile|gpu_fp8_tma_tile|test_gpu_fused_fp8_w1|test_gpu_fused_w1|test_gpu_faults_w1|run_fused_fp8_w1_.*|run_fused_w1_.*|test_gpu_fused_fp8_onegpu_w4|test_gpu_fused_onegpu_w4|test_gpu_faults_onegpu_w4|run_fused_fault_onegpu_w4.*|run_fused_fp8_onegpu_w2_.*|run_fused_onegpu_w2_.*|run_fused_fp8_onegpu_w8_.*)$' \
  timeout $(( 585 - ($(date +%s) - start) )) bash scripts/device-run.sh ctest > /dev/null 2>&1
echo "ctest rc=$? after $(( $(date +%s) - start )) s"
grep -E "tests passed|tests failed|Failed|Timeout|\*\*\*" "$W/ctest.log" | tail -14
grep -cE "Test +#.*Passed" "$W/ctest.log"
gzip -f "$W/ctest.log"
tar czf "$OUT/call2.tgz" -C "$W" .
