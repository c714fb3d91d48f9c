#!/usr/bin/env bash
# Session 23, call 2 (one GPU; nvidia-h200 asked). On an H200: call1.sh (issue 13's table). Otherwise:
# (1) the task timeline of main (trace build, .carry/s23/trace-epfuse: -DEPFUSE_TRACE=ON) at mixtral and
# dsv3 T=4096 FP8, launch 20 (session 18 call 2's protocol; scripts/trace_report.py), to see where a
# compute-bound tile's time goes with today's epilogue; (2) exp/release-early (.carry/s23/rel-epfuse: the
# stage released once its last MMAs are done, before their promotion, as DeepGEMM does) against main
# back to back (--sustained 1500), two rounds. Everything under $OUT as one tarball.
cd "$(dirname "$0")/../../../.."
here=$PWD/bench/results/logs/session23
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
[[ "$gpu" == *H200* ]] && exec bash "$here/call1.sh"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
W=$(mktemp -d)
start=$(date +%s)
left() { echo $(( 585 - ($(date +%s) - start) )); }
nvidia-smi --query-gpu=name,clocks.sm,power.limit --format=csv,noheader
export NCCL_NVLS_ENABLE=0 LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-} PATH=/opt/torch/.venv/bin:$PATH
CEIL=gemm=790,hbm=4250,nvlink=350,fp8=1447
for shape in "mixtral 4096 14336 2 2" "dsv3 7168 2048 64 8"; do set -- $shape
  EPFUSE_TRACE_LAUNCH=20 EPFUSE_TRACE_FILE=$W/trace-$1-fp8.csv timeout 120 .carry/s23/trace-epfuse bench --impl fused --dtype fp8 \
    --ranks 1 --torch off --ceilings $CEIL --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens 4096 \
    2>&1 | grep -E " fused |rror" | sed "s/^/trace $1: /" | cut -c1-170
  python3 scripts/trace_report.py $W/trace-$1-fp8.csv > $W/trace-$1-fp8-report.txt 2>&1
  sed -n '/^GEMM tiles/,/^math gaps/p' $W/trace-$1-fp8-report.txt
done
echo "traces done after $(( $(date +%s) - start )) s"
for round in 1 2; do for tag in main rel; do
  bin=$([ $tag = rel ] && echo .carry/s23/rel-epfuse || echo .carry/build/tools/epfuse)
  for shape in "mixtral 4096 14336 2 2 4096" "dsv3 7168 2048 64 8 4096" "qwen3 2048 768 32 8 16384"; do set -- $shape
    [ $(left) -lt 30 ] && break
    timeout 60 $bin bench --impl fused --dtype fp8 --ranks 1 --torch off --iters 30 --sustained 1500 --ceilings $CEIL \
      --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$W/ab-$tag-$1-r$round.json" 2>&1 \
      | grep -E " fused |rror|sustained" | sed "s/^/$tag r$round $1: /" | cut -c1-250
  done
done; done
echo "end: $(( $(date +%s) - start )) s"
gzip -f $W/*.csv
tar czf "$OUT/call2.tgz" -C "$W" .
