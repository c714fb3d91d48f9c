"""DeepGEMM's FP8 m-grouped GEMM (contiguous layout, 1x128 / 128x128 scales) on the shape of the FP8 tile's
own benchmarks (tests/gpu/gemm/test_fp8_tma_tile.cu, its "bench" lines: SMs / 4 experts; and
tests/gpu/gemm/bench_fp8_tile_shapes.cu, the layer's GEMM shapes: --experts E): E experts of --rows rows,
N = --n, K = --k, so that the tile alone and DeepGEMM's GEMM alone are measured on one GPU in one job.
Median of --reps launches timed one by one with CUDA events after a warm-up; prints ms and TFLOP/s.
--sustain-ms MS: then launches back to back for about MS with the GPU's energy counter read before and
after (nvml_energy.py): ms and joules a launch and the mean power, as bench_fp8_tile_shapes --sustain
prints them for our tile (at the 700 W cap a launch's joules, not its burst time, compare the two).
--data normal (the default, DeepGEMM's own tests: torch.randn) or uniform (values uniform in [-1, 1), as the
layer's x and weights): DeepGEMM's casts scale each 1x128 group and 128x128 block to an amax of 448 either
way (bench_fp8_tile_shapes --sustain SHAPE MS uniform|normal makes the same codes for our tile).
Our tile gathers its A rows from a pool of 300 tokens (L2-resident); DeepGEMM reads contiguous rows.

Run with PYTHONPATH=<deepgemm tree> (../shared/peers/prepare_deepgemm.sh), e.g.
  python3 bench/peers/deepgemm_tile_shape.py --rows 1024 --n 1024 --k 7168
"""
import argparse
import os
import statistics
import sys

import torch
import deep_gemm

sys.path.insert(0, os.path.join(os.path.dirname(deep_gemm.__file__), "..", "tests"))
from generators import cast_fp8_fp4_with_major, grouped_cast_fp8_fp4_with_major, MajorTypeAB  # noqa: E402
from nvml_energy import back_to_back  # noqa: E402

p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--experts", type=int, default=0, help="0: SMs / 4, as the tile's benchmark")
p.add_argument("--rows", type=int, default=1024)
p.add_argument("--n", type=int, default=1024)
p.add_argument("--k", type=int, default=7168)
p.add_argument("--reps", type=int, default=21)
p.add_argument("--data", choices=("normal", "uniform"), default="normal", help="the values before the FP8 casts")
p.add_argument("--sustain-ms", type=float, default=0, help="> 0: also launches back to back for this long, with joules a launch")
a = p.parse_args()
experts = a.experts or torch.cuda.get_device_properties(0).multi_processor_count // 4
m = experts * a.rows
if a.data == "normal":
    x = torch.randn(m, a.k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(experts, a.n, a.k, device="cuda", dtype=torch.bfloat16)
else:
    x = (torch.rand(m, a.k, device="cuda") * 2 - 1).to(torch.bfloat16)
    w = (torch.rand(experts, a.n, a.k, device="cuda") * 2 - 1).to(torch.bfloat16)
x8 = cast_fp8_fp4_with_major(x, MajorTypeAB.KMajor, 128, False, False)
w8 = grouped_cast_fp8_fp4_with_major(w, MajorTypeAB.KMajor, 128, False, False, use_block_cast_for_fp8=True)
idx = torch.arange(experts, device="cuda", dtype=torch.int32).repeat_interleave(a.rows)
d = torch.empty(m, a.n, device="cuda", dtype=torch.bfloat16)
run = lambda: deep_gemm.m_grouped_fp8_gemm_nt_contiguous(x8, w8, d, idx)
run()
ref = torch.cat([x[e * a.rows:(e + 1) * a.rows].float() @ w[e].float().t() for e in range(experts)])
err = ((d.float() - ref).norm() / ref.norm()).item()
for _ in range(3):
    run()
times = []
for _ in range(a.reps):
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    s.record(); run(); e.record(); torch.cuda.synchronize(); times.append(s.elapsed_time(e))
ms = statistics.median(times)
flops = 2.0 * m * a.n * a.k
print(f"deepgemm-fp8 tile shape: {experts} experts x {a.rows} rows, N={a.n} K={a.k}: {ms:.3f} ms (median of {a.reps}), "
      f"{flops / ms / 1e9:.0f} TFLOP/s, rel err {err:.1e}", flush=True)
if a.sustain_ms > 0:
    n = max(10, int(a.sustain_ms / ms))
    ms_each, joules = back_to_back(run, n)
    print(f"deepgemm-fp8 tile shape sustained ({a.data} data): {n} launches back to back, {ms_each:.4f} ms a launch, "
          f"{flops / ms_each / 1e9:.0f} TFLOP/s, {joules:.4f} J a launch, {joules / ms_each * 1e3:.0f} W", flush=True)
