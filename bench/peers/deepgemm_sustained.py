"""DeepGEMM's two FP8 grouped GEMMs of one GPU's MoE experts (Linear1: N = 2I, K = H; Linear2: N = H,
K = I; `rows` rows per local expert, contiguous layout), back to back with no sync between them for about
--sustain-ms, the GPU's energy counter (NVML through ctypes) read before and after: ms and joules per
iteration and the mean power, as `epfuse bench --sustained` reports them for our layer (bench/README.md,
"Sustained"). The GEMM-alone peer of the power-capped rows, where 30-call bursts read faster than a model
would see (docs/performance.md#power-cap-and-energy).

--data randn is ../shared/peers/deepgemm_gemm_alone.py's recipe (torch.randn through DeepGEMM's 1x128 /
128x128 FP8 casts); --data uniform is our generator's distribution (src/ref/generator.h: uniform in
[-1, 1) times 2^-j, j in {0, 1, 2}, per 128-column group of an x row and per 128 x 128 weight block).
--block-n-multiple N restricts DeepGEMM's tile width to multiples of N (deep_gemm.set_block_size_multiple_of;
128 leaves it 128 x 128, where its heuristics pick 128 x 192 at mixtral's shapes), to ask how its tensor
pipe fares with our n128 spacing of drains. DG_PRINT_CONFIGS=1 prints the configs it picks.

Run with PYTHONPATH=<deepgemm tree> (../shared/peers/prepare_deepgemm.sh), e.g.
  python3 bench/peers/deepgemm_sustained.py --hidden 4096 --intermediate 14336 --experts 2 --rows 4096
The first call of a shape compiles DeepGEMM's kernels (JIT): run once with --sustain-ms 50 first.
"""
import argparse
import os
import sys

import torch
import deep_gemm

sys.path.insert(0, os.path.join(os.path.dirname(deep_gemm.__file__), "..", "tests"))
from generators import cast_fp8_fp4_with_major, grouped_cast_fp8_fp4_with_major, MajorTypeAB  # noqa: E402
from nvml_energy import back_to_back  # noqa: E402


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hidden", type=int, default=4096)
    p.add_argument("--intermediate", type=int, default=14336)
    p.add_argument("--experts", type=int, default=2, help="local experts")
    p.add_argument("--rows", type=int, default=4096, help="rows per local expert (a multiple of 128)")
    p.add_argument("--data", choices=("randn", "uniform"), default="randn")
    p.add_argument("--sustain-ms", type=float, default=1500.0)
    p.add_argument("--block-n-multiple", type=int, default=0, help="0: DeepGEMM's own choice")
    return p.parse_args()


def draw(shape, data, gen):
    if data == "randn":
        return torch.randn(*shape, device="cuda", dtype=torch.float32, generator=gen).bfloat16()
    u = torch.rand(*shape, device="cuda", dtype=torch.float32, generator=gen) * 2 - 1
    if len(shape) == 2:  # x rows: one magnitude per row and 128-column group
        j = torch.randint(0, 3, (shape[0], shape[1] // 128), device="cuda", generator=gen)
        mag = torch.exp2(-j.float()).repeat_interleave(128, dim=1)
    else:  # weights [E, N, K]: one magnitude per 128 x 128 block
        j = torch.randint(0, 3, (shape[0], shape[1] // 128, shape[2] // 128), device="cuda", generator=gen)
        mag = torch.exp2(-j.float()).repeat_interleave(128, dim=1).repeat_interleave(128, dim=2)
    return (u * mag).bfloat16()


def main():
    a = parse()
    if a.rows % 128:
        sys.exit("--rows: DeepGEMM's contiguous layout needs a multiple of 128")
    torch.cuda.set_device(0)
    if a.block_n_multiple:
        deep_gemm.set_block_size_multiple_of((1, a.block_n_multiple))
    gen = torch.Generator(device="cuda").manual_seed(1)
    H, I, EL, ROWS = a.hidden, a.intermediate, a.experts, a.rows
    ops = []
    for N, K in ((2 * I, H), (H, I)):
        x = draw((EL * ROWS, K), a.data, gen)
        w = draw((EL, N, K), a.data, gen)
        idx = torch.arange(EL, device="cuda", dtype=torch.int32).repeat_interleave(ROWS)
        x8 = cast_fp8_fp4_with_major(x, MajorTypeAB.KMajor, 128, False, False)
        w8 = grouped_cast_fp8_fp4_with_major(w, MajorTypeAB.KMajor, 128, False, False, use_block_cast_for_fp8=True)
        d = torch.empty(EL * ROWS, N, device="cuda", dtype=torch.bfloat16)
        ops.append((x8, w8, d, idx))
        del x, w
    torch.cuda.empty_cache()

    def step():
        for x8, w8, d, idx in ops:
            deep_gemm.m_grouped_fp8_gemm_nt_contiguous(x8, w8, d, idx)

    for _ in range(10):
        step()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    s.record()
    for _ in range(5):
        step()
    e.record()
    torch.cuda.synchronize()
    iters = max(10, int(a.sustain_ms / (s.elapsed_time(e) / 5)))
    ms, joules = back_to_back(step, iters)
    flops = 2 * EL * ROWS * (2 * I * H + H * I)
    print(f"deepgemm fp8 H={H} I={I} experts={EL} rows={ROWS} data={a.data} block_n_multiple={a.block_n_multiple or '-'}: "
          f"{ms:.3f} ms per iteration over {iters} back to back ({flops / ms / 1e9:.0f} TFLOP/s), "
          f"{joules:.3f} J per iteration, {joules / ms * 1e3:.0f} W", flush=True)


if __name__ == "__main__":
    main()
