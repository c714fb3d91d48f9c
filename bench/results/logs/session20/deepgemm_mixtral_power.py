"""Session 20, call 7: DeepGEMM's FP8 grouped GEMMs alone on mixtral's per-GPU shapes (2 local experts,
4096 rows each; Linear1 N=2I K=H, then Linear2 N=H K=I), back to back for ITERS iterations with no sync
between them, while nvidia-smi samples the clock and power (call7.sh). The same data recipe as
../shared/peers/deepgemm_gemm_alone.py (torch.randn, 1x128 / 128x128 FP8 casts). Prints ms per
iteration (Linear1 + Linear2) from CUDA events. Run with PYTHONPATH=<deepgemm tree>."""
import os
import sys

import torch
import deep_gemm

sys.path.insert(0, os.path.join(os.path.dirname(deep_gemm.__file__), "..", "tests"))
from generators import cast_fp8_fp4_with_major, grouped_cast_fp8_fp4_with_major, MajorTypeAB  # noqa: E402

torch.cuda.set_device(0)
H, I, EL, ROWS = 4096, 14336, 2, 4096
iters = int(os.environ.get("ITERS", "1000"))
ops = []
for N, K in ((2 * I, H), (H, I)):
    a = torch.randn(EL * ROWS, K, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(EL, N, K, device="cuda", dtype=torch.bfloat16)
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


for _ in range(20):
    step()
torch.cuda.synchronize()
s, e = torch.cuda.Event(True), torch.cuda.Event(True)
s.record()
for _ in range(iters):
    step()
e.record()
torch.cuda.synchronize()
flops = 2 * EL * ROWS * (2 * I * H + H * I)
ms = s.elapsed_time(e) / iters
print(f"deepgemm fp8 mixtral L1+L2: {ms:.3f} ms per iteration over {iters} back to back ({flops / ms / 1e9:.0f} TFLOP/s)", flush=True)
