"""Session 22, call 2: DeepGEMM's FP8 grouped GEMMs alone on mixtral's per-GPU shapes (2 local experts,
4096 rows each; Linear1 N=2I K=H, then Linear2 N=H K=I), back to back with no sync for about SUSTAIN_MS,
with the GPU's energy counter (NVML, through ctypes) read before and after: ms and joules per
iteration and the mean power, as `epfuse bench --sustained` reports them for our layer. DATA=randn is
../shared/peers/deepgemm_gemm_alone.py's recipe (torch.randn, 1x128 / 128x128 FP8 casts); DATA=uniform
is our generator's distribution (src/ref/generator.h: uniform in [-1, 1) times 2^-j, j in {0, 1, 2},
per 128-column group of a row and per 128 x 128 weight block), through the same casts.
Run with PYTHONPATH=<deepgemm tree>, after a short run that compiles the kernels."""
import ctypes
import os
import sys

import torch
import deep_gemm

sys.path.insert(0, os.path.join(os.path.dirname(deep_gemm.__file__), "..", "tests"))
from generators import cast_fp8_fp4_with_major, grouped_cast_fp8_fp4_with_major, MajorTypeAB  # noqa: E402

torch.cuda.set_device(0)
H, I, EL, ROWS = 4096, 14336, 2, 4096
data = os.environ.get("DATA", "randn")
sustain_ms = float(os.environ.get("SUSTAIN_MS", "1500"))
gen = torch.Generator(device="cuda").manual_seed(1)


def draw(*shape):
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


ops = []
for N, K in ((2 * I, H), (H, I)):
    a = draw(EL * ROWS, K)
    w = draw(EL, N, K)
    idx = torch.arange(EL, device="cuda", dtype=torch.int32).repeat_interleave(ROWS)
    a8 = cast_fp8_fp4_with_major(a, MajorTypeAB.KMajor, 128, False, False)
    w8 = grouped_cast_fp8_fp4_with_major(w, MajorTypeAB.KMajor, 128, False, False, use_block_cast_for_fp8=True)
    d = torch.empty(EL * ROWS, N, device="cuda", dtype=torch.bfloat16)
    ops.append((a8, w8, d, idx))
    del a, w
torch.cuda.empty_cache()


def step():
    for a8, w8, d, idx in ops:
        deep_gemm.m_grouped_fp8_gemm_nt_contiguous(a8, w8, d, idx)


class Energy:
    """NVML's total energy counter of CUDA device 0 (mJ since the driver loaded); None without one."""

    def __init__(self):
        try:
            self.lib = ctypes.CDLL("libnvidia-ml.so.1")
            assert self.lib.nvmlInit_v2() == 0
            self.dev = ctypes.c_void_p()
            assert self.lib.nvmlDeviceGetHandleByIndex_v2(0, ctypes.byref(self.dev)) == 0  # the one GPU lent
        except Exception as e:  # noqa: BLE001
            print(f"no energy counter: {e}", flush=True)
            self.lib = None

    def joules(self):
        if self.lib is None:
            return float("nan")
        mj = ctypes.c_ulonglong()
        assert self.lib.nvmlDeviceGetTotalEnergyConsumption(self.dev, ctypes.byref(mj)) == 0
        return mj.value * 1e-3


for _ in range(10):
    step()
torch.cuda.synchronize()
s, e = torch.cuda.Event(True), torch.cuda.Event(True)
s.record()
for _ in range(5):
    step()
e.record()
torch.cuda.synchronize()
iters = max(10, int(sustain_ms / (s.elapsed_time(e) / 5)))
meter = Energy()
j0 = meter.joules()
s.record()
for _ in range(iters):
    step()
e.record()
torch.cuda.synchronize()
j1 = meter.joules()
ms = s.elapsed_time(e) / iters
flops = 2 * EL * ROWS * (2 * I * H + H * I)
joules = (j1 - j0) / iters
print(f"deepgemm fp8 mixtral L1+L2 data={data}: {ms:.3f} ms per iteration over {iters} back to back "
      f"({flops / ms / 1e9:.0f} TFLOP/s), {joules:.3f} J per iteration, {joules / ms * 1e3:.0f} W", flush=True)
