"""One rank of test_gpu_multi.py: started once per GPU with RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT
(as torchrun would), EPFUSE_TEST_COMM (the Workspace's comm= argument). Writes rank<R>.json into the
directory given as argv[1]: {"rank", "comm_source", "checks": [...], "ok", "error"}.

With EPFUSE_TEST_KILL=<victim> it runs the peer-death scenario instead (kill_main): every rank makes a
workspace and a layer and runs verified forwards; then the victim SIGKILLs itself and the others go
on calling the layer until epfuse raises, then give up as EPFUSE_TEST_GIVE_UP says ("abort":
Workspace.abort(); "close": Workspace.close(), which must come back within the collective timeout),
and write {"rank", "error", "error_type", "seconds_to_error", "seconds_to_give_up", "give_up_error",
"ok"} (the victim writes {"rank", "killed": true} just before it dies).

With EPFUSE_TEST_FAULT=<kind> it runs a fault scenario instead (fault_main): EPFUSE_FAULT (set by the
parent for every rank) makes the last rank misbehave in its forward call 1; every rank checks call 0
against the reference, then calls the layer (a barrier after call 1) until epfuse raises, at most 4
calls, and writes {"rank", "calls": [{"call", "raised", "error", "not_nan", "values", "verified",
"seconds"}], "ok", "error"}, then gives up with Workspace.abort()."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent))
from moe_ref import errors, random_inputs, random_weights, reference, within_bounds  # noqa: E402

H, I, E, K, MAX_T = 256, 256, 16, 4, 128


def layer_checks(ws: Any, rank: int, world: int) -> list[dict[str, Any]]:
    import epfuse.torch as et

    w13, w2 = random_weights(E, H, I, device="cuda", seed=5)  # every expert, the same on every rank
    per = E // world
    layer = et.MoELayer(ws, w13[rank * per : (rank + 1) * per], w2[rank * per : (rank + 1) * per], topk=K)
    out = []
    for call in range(20):
        # Token counts differ per rank and per call, 0 included.
        tokens = (call * 29 + rank * 53) % (MAX_T + 1)
        x, ids, w = random_inputs(tokens, H, E, K, device="cuda", seed=1000 * call + rank)
        y = layer(x, ids, w)
        if call in (0, 1, 10, 19):
            layer.check_errors()
            err = (
                errors(y, reference(x, ids, w, w13, w2))
                if tokens
                else {"nan": 0, "frob_rel_err": 0.0, "worst_row_rel_err": 0.0}
            )
            out.append({"check": "layer", "call": call, "tokens": tokens, **err, "verified": within_bounds(err)})
    layer.close()
    return out


def hf_checks(ws_kwargs: dict[str, Any], rank: int) -> list[dict[str, Any]]:
    import transformers
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    import epfuse.hf as ehf

    cfg = transformers.Qwen3MoeConfig(
        hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=K, norm_topk_prob=True
    )
    torch.manual_seed(0)  # the same block on every rank
    block = Qwen3MoeSparseMoeBlock(cfg)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape) / p.shape[-1] ** 0.5)
    block = block.to("cuda", torch.bfloat16).eval()
    block.experts.config._experts_implementation = "eager"
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own tokens
    x = torch.randn(1, 64 + 16 * rank, H, generator=g).to("cuda", torch.bfloat16)
    with torch.no_grad():
        y_hf = block(x)
    ws = ehf.make_workspace(block, max_tokens=MAX_T, **ws_kwargs)
    try:
        layers = ehf.attach(block, ws)
        with torch.no_grad():
            y_ep = block(x)
        layers[0].check_errors()
        ehf.detach(block)
    finally:
        ws.close()
    err = errors(y_ep.view(-1, H), y_hf.view(-1, H).double())
    return [
        {
            "check": "hf_qwen3_moe_vs_transformers",
            "tokens": x.shape[1],
            **err,
            "verified": err["nan"] == 0 and err["frob_rel_err"] < 2e-2,
        }
    ]


def kill_main(out_dir: Path, rank: int, world: int, victim: int, comm: str) -> int:
    """The peer-death scenario (module docstring). Leaves with os._exit: the process group's own
    teardown would wait for the dead rank."""
    give_up = os.environ.get("EPFUSE_TEST_GIVE_UP", "abort")
    result: dict[str, Any] = {"rank": rank, "world": world, "victim": victim, "give_up": give_up, "ok": False, "error": None}
    try:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
        import epfuse
        import epfuse.torch as et

        ws = et.Workspace(hidden=H, intermediate=I, num_experts=E, topk=K, max_tokens=MAX_T, comm=comm)
        result["comm_source"] = ws.comm_source
        w13, w2 = random_weights(E, H, I, device="cuda", seed=5)
        per = E // world
        layer = et.MoELayer(ws, w13[rank * per : (rank + 1) * per], w2[rank * per : (rank + 1) * per], topk=K)
        x, ids, w = random_inputs(32, H, E, K, device="cuda", seed=rank)
        for _ in range(3):  # the world works before the death
            layer(x, ids, w)
        layer.check_errors()
        torch.cuda.synchronize()
        dist.barrier()
        if rank == victim:
            (out_dir / f"rank{rank}.json").write_text(json.dumps({"rank": rank, "killed": True}))
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(0.5)  # the victim is gone before the survivors call again
        start = time.monotonic()
        try:
            while time.monotonic() - start < 120:  # the test's bound is far below; never loop forever
                layer(x, ids, w)
                layer.check_errors()
            result["error"] = "no error within 120 s of the victim's death"
        except epfuse.Error as e:
            result["seconds_to_error"] = time.monotonic() - start
            result["error"], result["error_type"] = str(e), type(e).__name__
        start = time.monotonic()
        try:
            if give_up == "abort":
                ws.abort(f"rank {victim} died")
            else:
                ws.close()
        except epfuse.Error as e:
            result["give_up_error"], result["give_up_error_type"] = str(e), type(e).__name__
        result["seconds_to_give_up"] = time.monotonic() - start
        result["closed"] = ws.closed
        result["ok"] = result["error"] is not None and "error_type" in result and ws.closed
    except BaseException as e:  # noqa: BLE001 - reported to the parent test
        result["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result, indent=2))
    sys.stdout.flush()
    os._exit(0)


def fault_main(out_dir: Path, rank: int, world: int, kind: str) -> int:
    """The fault scenario (module docstring). Leaves with os._exit, like kill_main: the world is
    aborted, and the process group's teardown must not wait on it."""
    result: dict[str, Any] = {"rank": rank, "world": world, "kind": kind, "calls": [], "ok": False, "error": None}
    try:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
        import epfuse
        import epfuse.torch as et

        ws = et.Workspace(hidden=H, intermediate=I, num_experts=E, topk=K, max_tokens=MAX_T, comm="unique_id")
        w13, w2 = random_weights(E, H, I, device="cuda", seed=5)
        per = E // world
        layer = et.MoELayer(ws, w13[rank * per : (rank + 1) * per], w2[rank * per : (rank + 1) * per], topk=K)
        x, ids, w = random_inputs(32, H, E, K, device="cuda", seed=rank)
        ref = reference(x, ids, w, w13, w2)
        for call in range(4):
            entry: dict[str, Any] = {"call": call, "raised": None}
            start = time.monotonic()
            try:
                y = layer(x, ids, w)
                torch.cuda.synchronize()
                err = errors(y, ref)
                entry.update(not_nan=y.numel() - err["nan"], values=y.numel(), verified=within_bounds(err))
            except epfuse.Error as e:
                entry.update(raised=type(e).__name__, error=str(e))
            entry["seconds"] = time.monotonic() - start
            result["calls"].append(entry)
            if call == 1:
                # Every rank's call 1 is over before any calls again: a faulty rank that called at once
                # would be in step with its peers again, and its fault unseen.
                dist.barrier()
            if entry["raised"]:
                break
        ws.abort(f"the {kind} fault test is over")
        result["ok"] = ws.closed
    except BaseException as e:  # noqa: BLE001 - reported to the parent test
        result["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result, indent=2))
    sys.stdout.flush()
    os._exit(0)


def main() -> int:
    out_dir = Path(sys.argv[1])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    comm = os.environ.get("EPFUSE_TEST_COMM", "auto")
    if os.environ.get("EPFUSE_TEST_KILL"):
        return kill_main(out_dir, rank, world, int(os.environ["EPFUSE_TEST_KILL"]), comm)
    if os.environ.get("EPFUSE_TEST_FAULT"):
        return fault_main(out_dir, rank, world, os.environ["EPFUSE_TEST_FAULT"])
    result: dict[str, Any] = {"rank": rank, "world": world, "comm": comm, "checks": [], "ok": False, "error": None}
    try:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", device_id=torch.device("cuda", rank))
        import epfuse.torch as et

        with et.Workspace(hidden=H, intermediate=I, num_experts=E, topk=K, max_tokens=MAX_T, comm=comm) as ws:
            result["comm_source"] = ws.comm_source
            assert (ws.rank, ws.world_size) == (rank, world), (ws.rank, ws.world_size)
            result["checks"] += layer_checks(ws, rank, world)
        try:
            import transformers  # noqa: F401
        except ImportError:
            result["hf"] = "transformers not installed"
        else:
            result["checks"] += hf_checks({"comm": comm}, rank)
        dist.barrier()
        result["ok"] = all(c["verified"] for c in result["checks"])
    except BaseException as e:  # noqa: BLE001 - reported to the parent test
        result["error"] = f"{type(e).__name__}: {e}\n{traceback.format_exc()}"
    finally:
        (out_dir / f"rank{rank}.json").write_text(json.dumps(result, indent=2))
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
