#!/usr/bin/env bash
# Runs checks and benchmarks on a GPU host over a build made elsewhere and copied there as .carry/build
# (scripts/remote-pack.sh). Usage: bash scripts/remote-run.sh STEP... ; logs go to $OUT (or /tmp/out).
# Steps: unit (GPU unit tests, one process per GPU), run-unfused / run-fused (CLI correctness matrix,
# one process per GPU), onegpu-unit / run-onegpu (the same with every rank on GPU 0: --one-gpu),
# sanitize (compute-sanitizer memcheck, racecheck and synccheck on a small world-4 one-GPU run, FP8 and bf16; EPFUSE_SANITIZE_DTYPES picks), sanitize-w1
# (the same tools on the FP8 and bf16 layer at world 1, over NCCL, at a prefill and a decode size), smoke,
# vary1000, soak (10,000 calls at world 1 and at world 4 one-GPU, $OUT/soak-w*.json), faults (the
# fault-injection tests on one GPU: test_gpu_faults one-GPU and the CLI's run_fused_fault_onegpu_*),
# ctest (the entries matching $EPFUSE_CTEST_REGEX), spread (the one-GPU entries over every GPU of the host),
# bench-<impls> (impls joined by '_', e.g. bench-unfused_fused), bench-w1 (the fused layer on the
# per-GPU shapes at world 1; with EPFUSE_BASE_BIN set, that binary's rows too, interleaved, for an A/B),
# sass (the fused kernels GEMM loops against EPFUSE_BASE_BIN), fp8 (the unfused FP8 chain's GPU tests
# and world-1 run matrix), fp8-fused (the fused FP8 layer's tests and run matrix), profile-fp8 (ncu on the
# fused FP8 kernel and the FP8 tile alone), pytest (tests/python on the GPU), fp8-bench (bf16 and FP8 rows on the per-GPU shapes; EPFUSE_PEERS=DIR adds --peers),
# ab (a focused A/B of the fused layer, this build's or EPFUSE_NEW_BIN, against EPFUSE_BASE_BIN; EPFUSE_AB_SHAPES, EPFUSE_AB_ROUNDS, EPFUSE_AB_ARGS
# e.g. --dtype fp8; scripts/ab_summary.py's table at the end), ab-layer (the same over EPFUSE_RANKS GPUs on the
# models' decode and prefill rows together), decode (dsv3 and qwen3-30b at T = 1, 8, 32 with the 58-layer graph step; EPFUSE_PEERS adds MegaMoE),
# decode-trace (timelines of qwen3-30b T=8, 32 and dsv3 T=8 from a trace build, EPFUSE_TRACE_BIN), decode-sweep
# (the per-GPU shapes' FP8 decode rows against T, each with its weight floor),
# speed-w4 (issue 41's world-4 FP8 rows over EPFUSE_RANKS GPUs, default 4; EPFUSE_PEERS adds MegaMoE),
# lag-sweep (the fused FP8 layer over EPFUSE_RANKS GPUs, default 4, at each EPFUSE_SCHEDULE_LAG of
# EPFUSE_LAGS, default "auto first 0.5 2", on dsv3 T = 512, 1024, 4096 and qwen3-30b T = 4096, 16384),
# prefill-trace (the world-1 prefill rows traced, with their per-SM budgets, from EPFUSE_TRACE_BIN),
# source-view (ncu's per-line warp-state samples of one fused FP8 launch, EPFUSE_SV_SHAPES), tile-peers (the
# FP8 tile alone and DeepGEMM's grouped GEMM on the tile benchmark's shapes, EPFUSE_DEEPGEMM=DIR).
# EPFUSE_OUT_ARCHIVE=1 leaves $OUT as one archive, out.tgz, after the steps.
set -uo pipefail
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export LD_LIBRARY_PATH=/opt/torch/.venv/lib/python3.12/site-packages/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
export PATH=/opt/torch/.venv/bin:$PATH
repo=$(cd "$(dirname "$0")/.." && pwd)
# The binaries of an A/B (steps ab, ab-layer), "tag=path ..." in the order each round runs them:
# EPFUSE_AB_BINS, or EPFUSE_BASE_BIN as "base" against EPFUSE_NEW_BIN (default this build) as "new".
ab_bins() { echo "${EPFUSE_AB_BINS:-"base=$EPFUSE_BASE_BIN new=${EPFUSE_NEW_BIN:-tools/epfuse}"}"; }
# The build may come compressed (scripts/remote-pack.sh writes both).
if [ ! -d "$repo/.carry/build" ] && [ -f "$repo/.carry/build.tar.xz" ]; then tar xJf "$repo/.carry/build.tar.xz" -C "$repo/.carry"; fi
# ctest files hold the building host's absolute paths (source and build dirs): make them valid here.
src=$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$repo/.carry/build/CMakeCache.txt")
bin=$(sed -n 's/^CMAKE_CACHEFILE_DIR:INTERNAL=//p' "$repo/.carry/build/CMakeCache.txt")
if [ ! -e "$src" ]; then mkdir -p "$(dirname "$src")" && ln -sfn "$repo" "$src"; fi
[ -e "$bin" ] || ln -sfn "$repo/.carry/build" "$bin"
cd "$bin"
# The copy does not keep modification times in order: make gtest's discovered test lists newer than the
# executables so ctest reads them instead of re-running discovery with this machine's CMake modules.
find . -name '*_tests.cmake' -exec touch {} +
nvidia-smi --query-gpu=index,name,clocks.sm,memory.used --format=csv,noheader
# One compute-sanitizer run of `epfuse run` (every wait bounded generously: the tools slow the kernels by
# orders of magnitude): sanitize_layer "TOOL [LABEL]" TAIL [SANITIZER FLAGS --] RUN ARGS; the run's last
# TAIL lines and its exit status.
sanitize_layer() {
  local label=$1 tail_lines=$2 tool=${1%% *}; shift 2
  local flags=()
  if [[ " $* " == *" -- "* ]]; then while [ "$1" != "--" ]; do flags+=("$1"); shift; done; shift; fi
  echo "--- $label"
  EPFUSE_TIMEOUT_MS=600000 timeout ${EPFUSE_SANITIZER_LIMIT_S:-150} compute-sanitizer --tool "$tool" "${flags[@]}" \
    --error-exitcode 9 tools/epfuse run "$@" 2>&1 | tail -"$tail_lines"
  echo "exit ${PIPESTATUS[0]}"
}
for step in "$@"; do
  echo "=== $step $(date -u +%H:%M:%S)"
  case $step in
    unit) ctest -L gpu -E '^run_|onegpu' --timeout 180 --output-on-failure 2>&1 | tee "$OUT/unit.log" | grep -E "Test +#|tests passed|tests failed|FAILED|Error|error" | tail -40 ;;
    run-unfused|run-fused) impl=${step#run-}
      ctest -L run -R "^run_${impl}_" -E onegpu --timeout 300 --output-on-failure 2>&1 | tee "$OUT/$step.log" | grep -E "tests passed|tests failed|\*\*\*|Failed|Timeout" | tail -40 ;;
    onegpu-unit) ctest -L onegpu --timeout 600 --output-on-failure 2>&1 | tee "$OUT/onegpu-unit.log" | grep -E "Test +#|tests passed|tests failed|FAILED|Error|error" | tail -40 ;;
    run-onegpu)
      ctest -L run -R '^run_fused_onegpu_' --timeout 600 --output-on-failure 2>&1 | tee "$OUT/run-onegpu.log" | grep -E "tests passed|tests failed|\*\*\*|Failed|Timeout" | tail -40 ;;
    sanitize)  # the one-GPU world 4, FP8 and bf16
      for dt in ${EPFUSE_SANITIZE_DTYPES:-fp8 bf16}; do for tool in ${EPFUSE_SANITIZERS:-memcheck racecheck synccheck}; do
        sanitize_layer "$tool $dt" 25 --one-gpu --impl fused --dtype $dt --ranks 4 --hidden 256 --intermediate 256 \
          --experts 16 --topk 4 --tokens 24,0,7,1 --routing one-rank
      done; done 2>&1 | tee "$OUT/sanitize.log" ;;
    sanitize-w1)  # world 1 through NCCL: its communicator set-up probes kernels and allocations that this GPU
      # refuses and NCCL handles (memcheck reported 9 such API errors, none from the layer: 2026-11-29), so API
      # errors are not reported here; the layer checks every CUDA return code itself. T = 300 (75 rows an expert)
      # runs the 64-row kernels, T = 32 (8) the decode kernels (fused_layer.cpp's rows for plan.cpp choose_fused_tile);
      # EPFUSE_SANITIZE_W1_TOKENS picks
      for t in ${EPFUSE_SANITIZE_W1_TOKENS:-300 32}; do for dt in fp8 bf16; do for tool in ${EPFUSE_SANITIZERS:-memcheck racecheck synccheck}; do
        sanitize_layer "$tool $dt T=$t" 6 --report-api-errors no -- --impl fused --dtype $dt --ranks 1 --hidden 256 \
          --intermediate 768 --experts 16 --topk 4 --tokens $t
      done; done; done 2>&1 | tee "$OUT/sanitize-w1.log" ;;
    bench-w1)  # the FACTS one-GPU table's shapes: one GPU's share of each world-4 config, at world 1
      bins=("tools/epfuse"); [ -n "${EPFUSE_BASE_BIN:-}" ] && bins+=("$EPFUSE_BASE_BIN")
      for round in 1 2; do for bin in "${bins[@]}"; do tag=$( [ "$bin" = tools/epfuse ] && echo new || echo base )
        for shape in "dsv3 7168 2048 64 8 128,1024,4096" "qwen3 2048 768 32 8 128,4096,16384" "mixtral 4096 14336 2 2 4096"; do
          set -- $shape
          timeout 300 $bin bench --impl fused --ranks 1 --torch off --ceilings gemm=790,hbm=4250,nvlink=350 \
            --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --json "$OUT/bench-w1-$tag-$1-r$round.json" 2>&1 \
            | grep -E "fused|verified" | sed "s/^/$tag r$round $1: /"
        done
      done; done 2>&1 | tee "$OUT/bench-w1.log" ;;
    fp8)  # issue 13, the unfused FP8 chain on one GPU: GEMM unit, layer tests, the world-1 run matrix, a run
      (ctest -R '^(test_gpu_fp8_gemm|test_gpu_unfused_fp8_w1)$' --timeout 300 --output-on-failure
       ctest -L run -R '^run_unfused_fp8_w1_' -E '_(dsv3|qwen3-30b|mixtral)$' --timeout 300 --output-on-failure
       timeout 120 tools/epfuse run --impl unfused --dtype fp8 --ranks 1 --hidden 2048 --intermediate 768 \
         --experts 32 --topk 8 --tokens 4096 --iters 20 --verify-rows 16 --json "$OUT/run-fp8-qwen3-w1.json" | tail -6
      ) 2>&1 | tee "$OUT/fp8.log" | grep -E "fp8 gemm|fp8 unfused|Test +#|tests passed|tests failed|FAILED|Failed|rror|verified|cuBLASLt" | tail -80 ;;
    fp8-fused)  # issue 13, the fused FP8 layer: its GPU tests and run matrix, world 1 and the one-GPU worlds
      ctest -R '(test_gpu_fused_fp8_|run_fused_fp8_)' --timeout 600 --output-on-failure 2>&1 | tee "$OUT/fp8-fused.log" | grep -E "Test +#|tests passed|tests failed|FAILED|Failed|Timeout" | tail -60 ;;
    fp8-bench)  # bf16 and FP8 rows of EPFUSE_FP8_IMPLS (default unfused,fused) on the per-GPU shapes at world 1;
      # the peers (EPFUSE_PEERS) run once, with the first shape: their other rows follow that table
      peers=${EPFUSE_PEERS:-}
      for shape in "dsv3 7168 2048 64 8 128,1024,4096" "qwen3 2048 768 32 8 128,4096,16384" "mixtral 4096 14336 2 2 4096"; do
        set -- $shape
        timeout $([ -n "$peers" ] && echo 560 || echo 300) tools/epfuse bench --impl ${EPFUSE_FP8_IMPLS:-unfused,fused} --dtype bf16,fp8 --ranks 1 --torch off \
          --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 \
          ${peers:+--peers $peers} --json "$OUT/bench-fp8-$1.json" 2>&1 | tail -40
        peers=
      done 2>&1 | tee "$OUT/fp8-bench.log" ;;
    profile-fp8)  # ncu on the fused FP8 kernel (dsv3 T=4096, world 1) and on the FP8 tile alone: tensor-pipe
      # activity, warp stall reasons, shared-memory traffic (one launch each; the kernel runs slowly under ncu)
      ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu); [ -x "$ncu" ] || { echo "no ncu on this machine"; continue; }
      sections="--section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section MemoryWorkloadAnalysis"
      timeout 240 "$ncu" $sections -k regex:fused_moe_kernel --launch-skip 3 --launch-count 1 tools/epfuse run --impl fused \
        --dtype fp8 --model dsv3 --ranks 1 --tokens 4096 --iters 5 --verify-rows 2 > "$OUT/ncu-fused-fp8.txt" 2>&1; echo "exit $?"
      timeout 120 "$ncu" $sections -k regex:fp8_tma_tile_kernel --launch-skip 6 --launch-count 1 tests/gpu/gemm/test_fp8_tma_tile > "$OUT/ncu-fp8-tile.txt" 2>&1; echo "exit $?"
      grep -E "Tensor|Stall|Issue Slot|Shared|Throughput|Duration|Registers" "$OUT"/ncu-*.txt | head -60 ;;
    source-view)  # ncu's per-source-line view (warp-state samples, instructions executed) of one fused FP8
      # launch at world 1 for each EPFUSE_SV_SHAPES entry ("name H I E k T;..."; default qwen3-30b's per-GPU
      # shape at T=16384), exported as CSV by CUDA line and by SASS instruction ($OUT/sv-NAME-*.csv.gz; the
      # SASS one by role and phase: scripts/source_view.py --csv ... --binary tools/epfuse)
      ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu); [ -x "$ncu" ] || { echo "no ncu on this machine"; continue; }
      "$ncu" --version | tail -1; "$ncu" --help | grep -A4 -e "--print-source" | head -12
      IFS=';' read -ra list <<<"${EPFUSE_SV_SHAPES:-qwen3 2048 768 32 8 16384}"
      for shape in "${list[@]}"; do
        read -r name h i e k t <<<"$shape"
        EPFUSE_TIMEOUT_MS=600000 timeout 300 "$ncu" --clock-control none --section SourceCounters --section WarpStateStats \
          --import-source yes -k regex:fused_moe_kernel --launch-skip 3 --launch-count 1 -f -o "$OUT/sv-$name" \
          tools/epfuse run --impl fused --dtype fp8 --ranks 1 --hidden $h --intermediate $i --experts $e --topk $k \
          --tokens $t --iters 5 --verify-rows 2 2>&1 | tail -4
        for view in cuda sass; do
          "$ncu" -i "$OUT/sv-$name.ncu-rep" --page source --csv --print-source $view 2>&1 | gzip > "$OUT/sv-$name-$view.csv.gz"
          echo "$view: $(zcat "$OUT/sv-$name-$view.csv.gz" | wc -l) lines"
        done
        "$ncu" -i "$OUT/sv-$name.ncu-rep" --page details 2>&1 | grep -E "Duration|Stall|Warp Cycles|Issued" | head -20
      done ;;
    pytest)  # the Python package's tests on this GPU (EPFUSE_PYTEST_ARGS, e.g. "-k fp8"), the carried libepfuse_c.so
      (cd "$repo" && EPFUSE_LIB="$repo/.carry/build/src/capi/libepfuse_c.so" PYTHONPATH=python EPFUSE_TORCH_RESULTS="$OUT/torch.json" \
        timeout 400 python3 -m pytest tests/python -q -rs -p no:logging -p no:cacheprovider ${EPFUSE_PYTEST_ARGS:-}) 2>&1 | tee "$OUT/pytest.log" | tail -25 ;;
    ab)  # A/B of the fused layer against EPFUSE_BASE_BIN on EPFUSE_AB_SHAPES ("name H I E k T,T..;..."; default
      # dsv3 at T = 1024, 4096; EPFUSE_AB_SHAPE "H I E k T" still names one), EPFUSE_AB_ROUNDS rounds (default 3),
      # the base first in each: the spread between rounds is the noise. On the power-capped
      # rows add --sustained 1500 to EPFUSE_AB_ARGS and compare its ms a call (the summary's second table): it repeats within 0.3%
      # where the synchronised medians spread 3-5% (docs/performance.md#power-cap-and-energy).
      shapes=${EPFUSE_AB_SHAPES:-$([ -n "${EPFUSE_AB_SHAPE:-}" ] && echo "custom $EPFUSE_AB_SHAPE" || echo "dsv3 7168 2048 64 8 1024,4096")}
      bins=$(ab_bins)  # EPFUSE_AB_BINS: several variants against one base in the same rounds
      for round in $(seq 1 "${EPFUSE_AB_ROUNDS:-3}"); do for tagbin in $bins; do
        tag=${tagbin%%=*} bin=${tagbin#*=}
        IFS=';' read -ra list <<<"$shapes"
        for shape in "${list[@]}"; do
          read -r name h i e k t <<<"$shape"
          timeout 120 $bin bench --impl fused --ranks 1 --torch off --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 --hidden $h \
            --intermediate $i --experts $e --topk $k --tokens $t ${EPFUSE_AB_ARGS:-} --json "$OUT/ab-$tag-$name-r$round.json" 2>&1 \
            | grep -E " fused |illegal|timed out|rror" | sed "s/^/$tag r$round $name: /"
        done
      done; done 2>&1 | tee "$OUT/ab.log"
      python3 "$repo/scripts/ab_summary.py" "$OUT"/ab-*-r*.json 2>&1 | tee "$OUT/ab-summary.log" ;;
    tile-peers)  # the FP8 tile alone (bench_fp8_tile_shapes, the layer's GEMM shapes) and DeepGEMM's grouped GEMM
      # on each of its shapes, one GPU, one job; EPFUSE_DEEPGEMM=DIR, a DeepGEMM tree (built here when it
      # has no extension yet); scripts/tile_peers.py's table at the end
      timeout 200 tests/gpu/gemm/bench_fp8_tile_shapes 1 > "$OUT/tile.log" 2>&1; echo "tile exit $?"
      grep -E "^(ok|FAIL)" "$OUT/tile.log" | grep -v "k-loop only"
      dg=${EPFUSE_DEEPGEMM:?tile-peers: set EPFUSE_DEEPGEMM to a DeepGEMM tree}
      for d in cute cutlass; do ln -sfn "$dg/third-party/cutlass/include/$d" "$dg/deep_gemm/include/$d"; done
      if ! ls "$dg"/deep_gemm/_C*.so > /dev/null 2>&1; then
        (cd "$dg" && CXX=/usr/bin/g++ CC=/usr/bin/gcc CPATH=/usr/local/cuda/include/cccl TORCH_CUDA_ARCH_LIST=9.0 MAX_JOBS=16 \
          python3 setup.py build_ext --inplace > "$OUT/deepgemm-build.log" 2>&1) || { tail -20 "$OUT/deepgemm-build.log"; continue; }
      fi
      python3 "$repo/scripts/tile_peers.py" shapes "$OUT/tile.log" | while IFS='|' read -r name e r n k; do
        PYTHONPATH="$dg" timeout 120 python3 "$repo/bench/peers/deepgemm_tile_shape.py" --experts "$e" --rows "$r" --n "$n" --k "$k" 2>&1 \
          | grep -E "^deepgemm|Error|error"
      done > "$OUT/deepgemm.log"
      python3 "$repo/scripts/tile_peers.py" table "$OUT/tile.log" "$OUT/deepgemm.log" | tee "$OUT/tile-peers.log" ;;
    ab-layer)  # A/B of the whole layer over EPFUSE_RANKS GPUs (default 2) at decode and prefill sizes together
      # (EPFUSE_AB_MODELS, default qwen3-30b,dsv3; EPFUSE_AB_TOKENS, default 1,8,128,4096), binaries as in ab
      # (EPFUSE_AB_BINS, or EPFUSE_BASE_BIN against this build), EPFUSE_AB_ROUNDS rounds (default 2) in
      # that order; a phase change moves rows it does not run
      # (docs/performance.md#the-count-messages-before-the-layout-and-the-layout-of-one-block-2026-11-30-not-kept).
      bins=$(ab_bins)
      for round in $(seq 1 "${EPFUSE_AB_ROUNDS:-2}"); do for tagbin in $bins; do
        tag=${tagbin%%=*} bin=${tagbin#*=}
        timeout 150 $bin bench --impl fused --ranks "${EPFUSE_RANKS:-2}" --torch off --model "${EPFUSE_AB_MODELS:-qwen3-30b,dsv3}" \
          --tokens "${EPFUSE_AB_TOKENS:-1,8,128,4096}" ${EPFUSE_AB_ARGS:-} --json "$OUT/$tag-layer-r$round.json" 2>&1 \
          | grep -E " fused |illegal|timed out|rror" | sed "s/^/$tag r$round: /"
      done; done 2>&1 | tee "$OUT/ab-layer.log"
      python3 "$repo/scripts/ab_summary.py" "$OUT"/*-layer-r*.json 2>&1 | tee "$OUT/ab-layer-summary.log" ;;
    sass)  # the LSA kernels' SASS against the base binary's (scripts/sass_compare.py)
      cuobjdump -sass tools/epfuse > "$OUT/sass-new.txt" && cuobjdump -sass "$EPFUSE_BASE_BIN" > "$OUT/sass-base.txt" &&
        python3 "$repo/scripts/sass_compare.py" "$OUT/sass-new.txt" "$OUT/sass-base.txt" 2>&1 | tee "$OUT/sass-compare.log" ;;
    smoke)
      for impl in unfused fused; do
        EPFUSE_TIMEOUT_MS=5000 timeout 120 tools/epfuse run --impl $impl --ranks 4 --hidden 256 --intermediate 256 --experts 16 --topk 4 --tokens 128,0,7,1 2>&1 | tail -12
      done ;;
    soak)  # 10,000 calls, routing and T fresh every call, checked every 500th and the last; memory and time drift
      # EAGER: every kernel loaded before the first call, so that memory in use measures the calls alone.
      for w in 1 4; do flags=""; [ $w -gt 1 ] && flags="--one-gpu"
        CUDA_MODULE_LOADING=EAGER timeout 280 tools/epfuse run --impl fused $flags --ranks $w --hidden 256 --intermediate 256 \
          --experts 16 --topk 4 --tokens 128 --routing skewed --iters 10000 --vary --verify-every 500 \
          --json "$OUT/soak-w$w.json" 2>&1 | tail -6
        echo "exit ${PIPESTATUS[0]}"
      done 2>&1 | tee "$OUT/soak.log" ;;
    faults)  # fault injection on one GPU: the Faults tests (world 1, one-GPU worlds 2, 4) and the CLI (one-GPU world 4)
      ctest -R '^(test_gpu_faults_w1|test_gpu_faults_onegpu_|run_fused_fault_onegpu_)' --timeout 180 --output-on-failure 2>&1 | tee "$OUT/faults.log" | grep -E "Test +#|tests passed|tests failed|FAILED|Failed|Timeout" | tail -40 ;;
    ctest)  # the ctest entries matching $EPFUSE_CTEST_REGEX (e.g. a few regression checks)
      ctest -R "${EPFUSE_CTEST_REGEX:?set EPFUSE_CTEST_REGEX}" --timeout 300 --output-on-failure 2>&1 | tee "$OUT/ctest.log" | grep -E "Test +#|tests passed|tests failed|FAILED|Failed|Timeout" | tail -40 ;;
    spread)  # the entries that need one GPU (default: the one-GPU worlds, world 1 and their GPU tests; or
      # $EPFUSE_CTEST_REGEX) spread over the host's GPUs, one ctest per GPU on every n-th entry: 232 entries
      # took ~260 s on 4 GPUs (2026-11-28) where one GPU needs ~4x that
      ng=$(nvidia-smi -L | wc -l)
      re=${EPFUSE_CTEST_REGEX:-'^(run_(fused|unfused)_(fp8_|padded_[a-z0-9]+_)?(onegpu|w1)_.*|test_gpu_[a-z0-9_]+_(w1|onegpu_w[0-9]+))$'}
      for i in $(seq 0 $((ng - 1))); do
        CUDA_VISIBLE_DEVICES=$i ctest -R "$re" -I $((i + 1)),,$ng --timeout 300 --output-on-failure > "$OUT/spread-$i.log" 2>&1 &
      done; wait
      cat "$OUT"/spread-*.log | grep -E "tests passed|tests failed|\*\*\*|Failed|Timeout" | tail -40 ;;
    vary1000)  # 1,000 consecutive calls, fresh routing and token counts each, checked every 100th
      for impl in fused unfused; do for w in 1 2 4; do
        timeout 300 tools/epfuse run --impl $impl --ranks $w --hidden 512 --intermediate 256 --experts 32 --topk 8 \
          --tokens random --max-tokens 256 --routing dropped --iters 1000 --vary --verify-every 100 2>&1 | tail -3
      done; done 2>&1 | tee "$OUT/vary1000.log" ;;
    decode)  # issue 42's rows: dsv3 and qwen3-30b at T = 1, 8, 32 over EPFUSE_RANKS GPUs (default 4), fused FP8
      # and bf16 with the 58-layer graph step of each row; EPFUSE_PEERS=DIR adds MegaMoE at the same T
      timeout 560 tools/epfuse bench --model dsv3,qwen3-30b --tokens 1,8,32 --impl fused --ranks "${EPFUSE_RANKS:-4}" \
        --dtype fp8,bf16 --torch off --layers 58 --graph --check-layers 3 ${EPFUSE_PEERS:+--peers "$EPFUSE_PEERS" --peer-steps megamoe} \
        --json "$OUT/decode.json" 2>&1 | tee "$OUT/decode.log" | grep -E "^(dsv3|qwen3)|58 layers|rror" | tail -40 ;;
    decode-sweep)  # decode against T over EPFUSE_RANKS GPUs (default 1), FP8, the per-GPU shapes: each row's distance
      # to its weight floor as Linear1's tiles pass a wave (docs/performance.md#decode-against-t-at-world-1-the-weight-floor-plus-a-constant-2026-12-02);
      # EPFUSE_SMS sets the kernel's SM budget (bench --sms)
      for spec in "qwen3 2048 768 32 1,2,3,4,5,6,7,8,10,12,16,24,32" "dsv3 7168 2048 64 1,2,3,4,6,8"; do set -- $spec
        timeout 200 tools/epfuse bench --impl fused --torch off --dtype fp8 --ranks "${EPFUSE_RANKS:-1}" --hidden $2 --intermediate $3 \
          --experts $4 --topk 8 --tokens $5 --iters 200 --sets 8 --verify-rows 4 --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 \
          ${EPFUSE_SMS:+--sms "$EPFUSE_SMS"} --json "$OUT/decode-sweep-$1.json" 2>&1 | grep -E "^custom|rror|timed"
      done 2>&1 | tee "$OUT/decode-sweep.log" ;;
    speed-w4)  # issue 41's world-4 rows over EPFUSE_RANKS GPUs (default 4), fused FP8, every row verified:
      # qwen3-30b T = 1024, 4096, 16384 and dsv3 T = 128, 1024, 4096 a rank; EPFUSE_PEERS=DIR adds MegaMoE
      # SM90 FP8 at the same T in the same process (tools/bench/peers.cpp sets its batches)
      for spec in "qwen3-30b 1024,4096,16384" "dsv3 128,1024,4096"; do
        set -- $spec
        timeout 280 tools/epfuse bench --impl fused --torch off --dtype fp8 --ranks "${EPFUSE_RANKS:-4}" --model "$1" \
          --tokens "$2" --ceilings gemm=790,hbm=4250,nvlink=350,fp8=1447 \
          ${EPFUSE_PEERS:+--peers "$EPFUSE_PEERS" --peer-steps megamoe} --json "$OUT/speed-w4-$1.json" 2>&1 \
          | tee "$OUT/speed-w4-$1.log" | grep -E "^(dsv3|qwen3)|megamoe|rror|timed" | tail -20
      done ;;
    lag-sweep)  # the GEMM order at prefill sizes (docs/performance.md#the-gemm-order-at-world-4-a-lag-sweep-2026-11-28)
      for lag in ${EPFUSE_LAGS:-auto first 0.5 2}; do
        EPFUSE_SCHEDULE_LAG=$lag timeout 150 tools/epfuse bench --impl fused --torch off --dtype fp8 --ranks "${EPFUSE_RANKS:-4}" \
          --model dsv3 --tokens 512,1024,4096 --ceilings gemm=805,hbm=4230,nvlink=351,fp8=1447 --verify-rows 4 \
          --json "$OUT/lag-$lag-dsv3.json" 2>&1 | grep -E "^dsv3|rror|timed" | sed "s/^/lag $lag: /"
        EPFUSE_SCHEDULE_LAG=$lag timeout 90 tools/epfuse bench --impl fused --torch off --dtype fp8 --ranks "${EPFUSE_RANKS:-4}" \
          --model qwen3-30b --tokens 4096,16384 --ceilings gemm=805,hbm=4230,nvlink=351,fp8=1447 --verify-rows 4 \
          --json "$OUT/lag-$lag-qwen3.json" 2>&1 | grep -E "^qwen3|rror|timed" | sed "s/^/lag $lag: /"
      done 2>&1 | tee "$OUT/lag-sweep.log" ;;
    decode-trace)  # timelines of the decode rows whose fixed cost is not yet placed (qwen3-30b T=8, 32, dsv3
      # T=8, FP8, over EPFUSE_RANKS GPUs, default 4): EPFUSE_TRACE_BIN, the epfuse of a -DEPFUSE_TRACE=ON
      # build; each trace and rank 0's figure of its last launch (scripts/trace_plot.py) go to $OUT
      for row in "qwen3-30b 8" "qwen3-30b 32" "dsv3 8"; do set -- $row
        timeout 120 "${EPFUSE_TRACE_BIN:?set EPFUSE_TRACE_BIN}" bench --impl fused --torch off --dtype fp8 \
          --ranks "${EPFUSE_RANKS:-4}" --model $1 --tokens $2 --trace "$OUT/trace-$1-t$2.json" 2>&1 | grep -E "^$1|rror"
        python3 "$repo/scripts/trace_plot.py" "$OUT/trace-$1-t$2.json" "$OUT/trace-$1-t$2.png" --title "$1 T=$2 FP8" 2>&1 | tail -2
      done 2>&1 | tee "$OUT/decode-trace.log" ;;
    prefill-trace)  # where a prefill call goes at world 1 (docs/performance.md#where-a-prefill-call-goes-at-world-1-2026-11-28-the-trace):
      # the per-GPU shapes' FP8 rows (and dsv3 T=4096 bf16) traced by EPFUSE_TRACE_BIN, the epfuse of a
      # -DEPFUSE_TRACE=ON build; each trace's report with its per-SM budget to $OUT (the CSVs stay in /tmp)
      for row in "dsv3 7168 2048 64 8 4096 fp8" "dsv3 7168 2048 64 8 1024 fp8" "qwen3 2048 768 32 8 16384 fp8" \
                 "mixtral 4096 14336 2 2 4096 fp8" "dsv3 7168 2048 64 8 4096 bf16"; do set -- $row
        timeout 90 "${EPFUSE_TRACE_BIN:?set EPFUSE_TRACE_BIN}" bench --impl fused --torch off --dtype $7 --ranks 1 \
          --hidden $2 --intermediate $3 --experts $4 --topk $5 --tokens $6 --trace "/tmp/trace-$1-t$6-$7.json" 2>&1 | grep -E "^custom|rror"
        python3 "$repo/scripts/trace_report.py" "/tmp/trace-$1-t$6-$7.json.csv" > "$OUT/trace-$1-t$6-$7.txt" 2>&1
        grep -A2 "per-SM budget" "$OUT/trace-$1-t$6-$7.txt" | head -3
      done 2>&1 | tee "$OUT/prefill-trace.log" ;;
    bench-*) impls=${step#bench-}  # e.g. bench-unfused_fused (no "+": $OUT names allow only [A-Za-z0-9._-])
      # the FACTS configurations over EPFUSE_RANKS GPUs (default 4); EPFUSE_BENCH_ARGS adds flags (e.g.
      # "--dtype bf16,fp8"); EPFUSE_PEERS=DIR adds DeepGEMM and MegaMoE on as many GPUs (--peers)
      timeout 560 tools/epfuse bench --configs facts --impl "${impls//_/,}" --ranks "${EPFUSE_RANKS:-4}" ${EPFUSE_BENCH_ARGS:-} \
        ${EPFUSE_PEERS:+--peers "$EPFUSE_PEERS"} --json "$OUT/bench-$impls.json" 2>&1 | tee "$OUT/bench-$impls.log" | tail -30 ;;
    *) echo "unknown step $step" ;;
  esac
done
# EPFUSE_OUT_ARCHIVE (above): for a host that copies back only a few files of a run.
if [ "${EPFUSE_OUT_ARCHIVE:-0}" = 1 ]; then
  archive=$(mktemp --suffix .tgz)
  tar czf "$archive" -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv "$archive" "$OUT/out.tgz"
  echo "=== outputs in $OUT/out.tgz"
fi
