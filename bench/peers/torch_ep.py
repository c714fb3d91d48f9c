"""The PyTorch peer of `epfuse bench`: what a PyTorch user writes for an expert-parallel MoE layer
(NCCL all_to_all_single dispatch, torch._grouped_mm experts with SwiGLU, all_to_all_single combine,
weighted top-k sum), adapted from shared/peers/torch_ep_baseline.py to run under the same protocol
as the epfuse harness and to print machine-readable rows.

Run (the harness does this itself when torch imports):
  NCCL_NVLS_ENABLE=0 python3 -m torch.distributed.run --nproc_per_node=N bench/peers/torch_ep.py \
      --shapes "dsv3,7168,2048,256,8,128;mixtral,4096,14336,8,2,4096" --warmup 5 --iters 50 --sets 4

Protocol (same as the harness): `sets` input sets, each with fresh tokens and fresh uniform routing
(k distinct experts per token), rotated over the iterations so caches do not flatter; ranks
synchronised before every timed call (outside the timing); the layer time of an iteration is the
max over ranks; median / p10 / p90 over iterations. Every shape is verified once against a float64
reference of sampled rows (expert weights are a function of (seed, expert), so any rank can rebuild
the experts a row needs).

Output on rank 0, one JSON object per line (JSON Lines, as tools/bench/record.h reads them):
  {"record": "EPFUSE_PROGRESS", "done": <i>, "total": <n>, "label": <text>}
  {"record": "EPFUSE_ROW", "config": ..., "hidden": ..., "impl": "torch", "median_ms": ..., ...} (see run_shape)
"""
import argparse
import json
import math
import os
import statistics
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

# A GPU sleep ahead of each timed call, ~200 us at the H100/H200 boost clock, as the C++ bench's
# (tools/bench/gpu_delay.h kLaunchLeadUs): the start event fires when the GPU reaches the call.
LAUNCH_LEAD_CYCLES = 400_000


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", required=True, help='"name,H,I,E,k,T;..." one entry per row')
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--sets", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--verify-rows", type=int, default=8, help="sampled rows per rank checked in float64")
    p.add_argument("--tolerance", type=float, default=2e-2)
    return p.parse_args()


def record(tag, **fields):
    """One machine-readable line: a JSON object, its kind under "record"; non-finite numbers as
    "nan" / "inf" / "-inf" (JSON has none)."""
    finite = lambda v: str(v) if isinstance(v, float) and not math.isfinite(v) else v
    return json.dumps({"record": tag, **{k: finite(v) for k, v in fields.items()}})


def percentile(sorted_v, q):
    """Linear interpolation between order statistics, as the harness (tools/bench/stats.cpp)."""
    pos = q * (len(sorted_v) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(sorted_v) - 1)
    return sorted_v[lo] + (pos - lo) * (sorted_v[hi] - sorted_v[lo])


class Peer:
    def __init__(self, args):
        self.args = args
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.local_rank = int(os.environ.get("LOCAL_RANK", self.rank))
        torch.cuda.set_device(self.local_rank)
        self.dev = torch.device("cuda", self.local_rank)

    # ---- deterministic inputs: any rank can rebuild any expert or any rank's tokens ----
    def gen(self, *key):
        g = torch.Generator(device=self.dev)
        h = self.args.seed
        for k in key:
            h = (h * 1000003 + k) % (2**62)
        g.manual_seed(h)
        return g

    def expert(self, e, H, I):
        g = self.gen(1, e)
        w13 = torch.randn(2 * I, H, device=self.dev, dtype=torch.bfloat16, generator=g) * (H ** -0.5)
        w2 = torch.randn(H, I, device=self.dev, dtype=torch.bfloat16, generator=g) * (I ** -0.5)
        return w13, w2

    def tokens(self, shape_id, s, H, E, K, T):
        g = self.gen(2, shape_id, s, self.rank)
        x = torch.randn(T, H, device=self.dev, dtype=torch.bfloat16, generator=g)
        scores = torch.rand(T, E, device=self.dev, generator=g)  # uniform: k distinct experts
        topw, topi = scores.topk(K, dim=1)
        return x, topi, (topw / topw.sum(1, keepdim=True)).float()

    # ---- the layer, as in torch_ep_baseline.py ----
    def grouped(self, x, w, counts):
        """x: (M, K) rows sorted by expert; w: (E, N, K); counts: rows per expert (python list)."""
        offs = torch.tensor(counts, device=self.dev, dtype=torch.int32).cumsum(0, dtype=torch.int32)
        return torch._grouped_mm(x, w.transpose(-2, -1), offs=offs)

    def layer(self, x, topi, topw, w13, w2, I, El, events=None):
        T, K = topi.shape
        if events:
            events[0].record()
        flat = topi.reshape(-1)
        order = torch.argsort(flat, stable=True)  # by expert => by destination rank
        send_counts = torch.bincount(flat // El, minlength=self.world)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)
        sc, rc = send_counts.tolist(), recv_counts.tolist()
        send_x = x[order // K]
        send_e = (flat[order] % El).to(torch.int32)
        recv_x = torch.empty(sum(rc), x.shape[1], device=self.dev, dtype=x.dtype)
        recv_e = torch.empty(sum(rc), device=self.dev, dtype=torch.int32)
        dist.all_to_all_single(recv_x, send_x, rc, sc)
        dist.all_to_all_single(recv_e, send_e, rc, sc)
        if events:
            events[1].record()
        lorder = torch.argsort(recv_e, stable=True)
        counts = torch.bincount(recv_e, minlength=El).tolist()
        h = self.grouped(recv_x[lorder], w13, counts)
        h = (F.silu(h[:, :I].float()) * h[:, I:].float()).to(torch.bfloat16)
        y = self.grouped(h, w2, counts)
        out_rows = torch.empty_like(y)
        out_rows[lorder] = y
        if events:
            events[2].record()
        back = torch.empty(T * K, x.shape[1], device=self.dev, dtype=x.dtype)
        dist.all_to_all_single(back, out_rows, sc, rc)
        contrib = torch.empty_like(back)
        contrib[order] = back
        out = (contrib.view(T, K, -1).float() * topw.unsqueeze(-1)).sum(1).to(torch.bfloat16)
        if events:
            events[3].record()
        return out

    def reference_rows(self, x, topi, topw, rows, H, I):
        """float64 y of the given rows, rebuilding each needed expert once."""
        ref = torch.zeros(len(rows), H, dtype=torch.float64, device=self.dev)
        idx, wts = topi[rows].tolist(), topw[rows].tolist()
        for e in sorted({e for r in idx for e in r}):
            w13, w2 = (w.double() for w in self.expert(e, H, I))
            for n, t in enumerate(rows):
                for j, ej in enumerate(idx[n]):
                    if ej == e:
                        hgu = w13 @ x[t].double()
                        ref[n] += wts[n][j] * (w2 @ (F.silu(hgu[:I]) * hgu[I:]))
        return ref

    def verify(self, out, x, topi, topw, H, I):
        T = x.shape[0]
        n = min(self.args.verify_rows, T)
        rows = sorted({round(i * (T - 1) / max(n - 1, 1)) for i in range(n)}) if T else []
        bad = float(torch.isnan(out.float()).sum().item())
        num = den = 0.0
        if rows:
            ref = self.reference_rows(x, topi, topw, rows, H, I)
            num = float(((out[rows].double() - ref) ** 2).sum().item())
            den = float((ref ** 2).sum().item())
        v = torch.tensor([num, den, bad], device=self.dev, dtype=torch.float64)
        dist.all_reduce(v)
        rel = (v[0] / v[1]).sqrt().item() if v[1] > 0 else float("nan")
        return rel, int(v[2].item()) == 0 and rel <= self.args.tolerance

    def run_shape(self, shape_id, name, H, I, E, K, T):
        a = self.args
        El = E // self.world
        w = [self.expert(e, H, I) for e in range(self.rank * El, (self.rank + 1) * El)]
        w13 = torch.stack([p[0] for p in w])
        w2 = torch.stack([p[1] for p in w])
        del w
        sets = [self.tokens(shape_id, s, H, E, K, T) for s in range(a.sets)]

        rel, ok = self.verify(self.layer(*sets[0], w13, w2, I, El), *sets[0], H, I)

        for i in range(a.warmup):
            self.layer(*sets[i % a.sets], w13, w2, I, El)
        flag = torch.zeros(1, device=self.dev)
        ev = [[torch.cuda.Event(enable_timing=True) for _ in range(4)] for _ in range(a.iters)]
        for i in range(a.iters):
            dist.all_reduce(flag)  # ranks start each timed call together; outside the events
            torch.cuda.synchronize()
            # As the C++ bench (tools/bench/gpu_delay.h): the GPU is busy while the host starts the call.
            torch.cuda._sleep(LAUNCH_LEAD_CYCLES)
            self.layer(*sets[i % a.sets], w13, w2, I, El, ev[i])
        torch.cuda.synchronize()
        # [iters, 4]: layer, dispatch, experts, combine ms of this rank
        mine = torch.tensor([[e[0].elapsed_time(e[3]), e[0].elapsed_time(e[1]), e[1].elapsed_time(e[2]),
                              e[2].elapsed_time(e[3])] for e in ev], device=self.dev, dtype=torch.float64)
        every = [torch.empty_like(mine) for _ in range(self.world)]
        dist.all_gather(every, mine)
        slowest = torch.stack(every).amax(0)  # per iteration, the slowest rank
        del w13, w2, sets
        torch.cuda.empty_cache()
        if self.rank != 0:
            return
        layer_ms = sorted(slowest[:, 0].tolist())
        med = lambda col: statistics.median(slowest[:, col].tolist())
        fields = dict(config=name, hidden=H, intermediate=I, experts=E, topk=K, tokens_per_rank=T,
                      routing="uniform", impl="torch", median_ms=percentile(layer_ms, 0.5),
                      p10_ms=percentile(layer_ms, 0.1), p90_ms=percentile(layer_ms, 0.9),
                      dispatch_ms=med(1), experts_ms=med(2), combine_ms=med(3),
                      verified="yes" if ok else "no", rel_err=rel, iters=a.iters, sets=a.sets)
        print(record("EPFUSE_ROW", **fields), flush=True)


def main():
    args = parse_args()
    shapes = []
    for s in filter(None, args.shapes.split(";")):
        name, *dims = s.split(",")
        shapes.append((name, *map(int, dims)))
    dist.init_process_group("nccl")
    peer = Peer(args)
    for i, (name, H, I, E, K, T) in enumerate(shapes):
        if peer.rank == 0:
            print(record("EPFUSE_PROGRESS", done=i, total=len(shapes), label=f"torch {name} T={T}"), flush=True)
        peer.run_shape(i, name, H, I, E, K, T)
    if peer.rank == 0:
        print(record("EPFUSE_PROGRESS", done=len(shapes), total=len(shapes), label="torch done"), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    try:
        main()
    except Exception as ex:  # one line the harness can show; the traceback goes to stderr
        print(f"torch_ep: {type(ex).__name__}: {ex}", file=sys.stderr, flush=True)
        raise
