"""DeepGEMM's FP8 m-grouped GEMMs (contiguous layout, 1x128 / 128x128 scales) on the expert row counts a
routed batch gives, beside the same GEMMs on perfectly even counts, on the per-GPU shapes of the world-1
table (docs/performance.md#where-a-prefill-call-goes-at-world-1-2026-11-28-the-trace).

Each of the world's T*world tokens takes k distinct experts of E uniformly at random, as `epfuse bench
--routing uniform` draws them (src/ref/inputs.cpp; the same distribution, not the same draw), and one
rank's E/world experts get theirs: T*k/(E/world)/world rows each on average, an expert's last 128-row
block partly padding. DeepGEMM's contiguous layout pads each expert to
get_mk_alignment_for_contiguous_layout() rows as the fused layer pads to its m-blocks. The even case is
what ../shared/peers/deepgemm_gemm_alone.py measures. Linear1 (N = 2I, K = H) + Linear2 (N = H, K = I),
median of --reps launches each timed by CUDA events after a warm-up; TFLOP/s count real rows only. One
line per shape, "deepgemm-routed NAME H= I= E= k= T= world=: even X ms ... | routed Y ms ...", which
`epfuse bench --peers DIR --peer-steps ...,routed` reads (tools/bench/peers.h).

Run with PYTHONPATH=<deepgemm tree>, e.g.
  python3 bench/peers/deepgemm_routed.py --shapes "dsv3,7168,2048,64,8,4096"
"""
import argparse
import os
import statistics
import sys

import torch
import deep_gemm

sys.path.insert(0, os.path.join(os.path.dirname(deep_gemm.__file__), "..", "tests"))
from generators import cast_fp8_fp4_with_major, grouped_cast_fp8_fp4_with_major, MajorTypeAB  # noqa: E402

SHAPES = "dsv3,7168,2048,64,8,1024;dsv3,7168,2048,64,8,4096;qwen3,2048,768,32,8,4096;qwen3,2048,768,32,8,16384;" \
         "mixtral,4096,14336,2,2,4096"
p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
p.add_argument("--shapes", default=SHAPES, help="name,H,I,E,k,T;... (E the world's experts, T tokens a rank)")
p.add_argument("--world", type=int, default=1, help="ranks: one rank's E/world experts are measured")
p.add_argument("--reps", type=int, default=21)
p.add_argument("--seed", type=int, default=1)
a = p.parse_args()
dev = "cuda"


def bench(f):
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    ts = []
    for _ in range(a.reps):
        s, e = torch.cuda.Event(True), torch.cuda.Event(True)
        s.record()
        f()
        e.record()
        torch.cuda.synchronize()
        ts.append(s.elapsed_time(e))
    return statistics.median(ts)


def layout(counts, align):
    """Row index of each real row in the padded contiguous layout, and the per-row expert index (-1: padding)."""
    padded = [(c + align - 1) // align * align for c in counts]
    idx = torch.full((sum(padded),), -1, device=dev, dtype=torch.int32)
    rows = []
    start = 0
    for e, (c, pc) in enumerate(zip(counts, padded)):
        idx[start:start + c] = e
        rows.append(torch.arange(start, start + c, device=dev))
        start += pc
    return torch.cat(rows), idx, sum(padded)


def run(counts, H, I, E):
    align = deep_gemm.get_mk_alignment_for_contiguous_layout()
    real, idx, m = layout(counts, align)
    total, flops = 0.0, 0
    for N, K in ((2 * I, H), (H, I)):
        aa = torch.zeros(m, K, device=dev, dtype=torch.bfloat16)
        aa[real] = torch.randn(real.numel(), K, device=dev, dtype=torch.bfloat16)
        w = torch.randn(E, N, K, device=dev, dtype=torch.bfloat16)
        a8 = cast_fp8_fp4_with_major(aa, MajorTypeAB.KMajor, 128, False, False)
        w8 = grouped_cast_fp8_fp4_with_major(w, MajorTypeAB.KMajor, 128, False, False, use_block_cast_for_fp8=True)
        d8 = torch.empty(m, N, device=dev, dtype=torch.bfloat16)
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous(a8, w8, d8, idx)
        # A spot check against bf16 on the first expert's rows: the call computed something real.
        e0 = real[: counts[0]]
        ref = aa[e0].float() @ w[0].float().t()
        err = ((d8[e0].float() - ref).norm() / ref.norm()).item()
        if not err < 0.1:
            raise SystemExit(f"deepgemm-routed: relative error {err:.2e} on expert 0 (N={N}, K={K})")
        total += bench(lambda: deep_gemm.m_grouped_fp8_gemm_nt_contiguous(a8, w8, d8, idx))
        flops += 2 * real.numel() * N * K
        del aa, w, a8, w8, d8
        torch.cuda.empty_cache()
    return total, flops, m // 128


for item in a.shapes.split(";"):
    name, *v = item.split(",")
    H, I, E, k, T = map(int, v)
    if E % a.world != 0:
        raise SystemExit(f"deepgemm-routed: {E} experts do not split over {a.world} ranks")
    local = E // a.world
    gen = torch.Generator(device=dev).manual_seed(a.seed)
    picks = torch.rand(T * a.world, E, device=dev, generator=gen).topk(k, dim=1).indices.flatten()
    routed = torch.bincount(picks, minlength=E)[:local].tolist()
    even = [T * a.world * k // E] * local
    t_even, fl_even, b_even = run(even, H, I, local)
    t_routed, fl_routed, b_routed = run(routed, H, I, local)
    print(f"deepgemm-routed {name} H={H} I={I} E={E} k={k} T={T} world={a.world}: even {t_even:.3f} ms ({fl_even / t_even / 1e9:.0f} TF/s, "
          f"{b_even} blocks of 128) | routed {t_routed:.3f} ms ({fl_routed / t_routed / 1e9:.0f} TF/s, {b_routed} blocks; "
          f"rows per expert {min(routed)}-{max(routed)}) | routed / even {t_routed / t_even:.3f}", flush=True)
