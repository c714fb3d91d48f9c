"""epfuse.torch at world 2 and 4: one process per GPU (multi_rank_worker.py, started like torchrun)
on a torch.distributed NCCL group, with the group's communicator borrowed ("borrow": must take the
borrowed path, Workspace.comm_source says which it took), with epfuse's own from a broadcast
ncclUniqueId ("unique_id"), and "auto" (either: borrowed where torch exposes the communicator, else the
broadcast); each rank checks its tokens against the float64 reference, and an HF Qwen3-MoE block
against transformers; a rank killed with SIGKILL mid-run: every other rank raises an error naming
it and gives up (Workspace.abort() or .close()) in bounded time; and EPFUSE_FAULT on the last rank
(test_peer_fault_*): each failed call's y is NaN and the next forward raises naming that rank. Skipped
with fewer GPUs than ranks."""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
pytestmark = pytest.mark.usefixtures("cuda")

WORKER = Path(__file__).resolve().parent / "multi_rank_worker.py"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


BORROWED = "borrowed from the process group"
BROADCAST = "unique_id broadcast over the process group"


def _skip_unless_runnable(world: int, comm: str) -> None:
    gpus = torch.cuda.device_count()
    if gpus < world:
        pytest.skip(f"needs {world} GPUs, this machine has {gpus}")
    if comm == "borrow" and not hasattr(getattr(torch.distributed, "ProcessGroupNCCL", None), "_comm_ptr"):
        pytest.skip(f"torch {torch.__version__} does not expose ProcessGroupNCCL._comm_ptr(): nothing to borrow")


def _launch(
    tmp_path: Path, world: int, extra_env: dict[str, str], timeout_s: int
) -> tuple[list[subprocess.Popen[str]], list[str]]:
    """Starts one multi_rank_worker.py per rank as torchrun would (RANK, LOCAL_RANK, WORLD_SIZE,
    MASTER_ADDR, MASTER_PORT) with `extra_env`, and waits for them (each at most `timeout_s`, then
    killed): the processes and their outputs."""
    import epfuse

    env = dict(os.environ)
    env.update(
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        EPFUSE_BOOTSTRAP_SECRET=secrets.token_hex(32),  # what `epfuse launch` would give the ranks
        NCCL_NVLS_ENABLE="0",  # epfuse never uses NVLink multicast (README, Requirements)
        EPFUSE_LIB=epfuse.library_path(),
        PYTHONPATH=os.pathsep.join([str(Path(epfuse.__file__).resolve().parents[1]), env.get("PYTHONPATH", "")]),
        **extra_env,
    )
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), str(tmp_path)],
            env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(world)
    ]
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=timeout_s)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    return procs, logs


@pytest.mark.parametrize("comm", ["borrow", "auto", "unique_id"])
@pytest.mark.parametrize("world", [2, 4])
def test_multi_rank(record: Any, tmp_path: Path, world: int, comm: str) -> None:
    _skip_unless_runnable(world, comm)
    procs, logs = _launch(tmp_path, world, {"EPFUSE_TEST_COMM": comm}, timeout_s=600)
    results = []
    for r in range(world):
        path = tmp_path / f"rank{r}.json"
        assert path.exists(), f"rank {r} wrote no result; its output:\n{logs[r] if r < len(logs) else ''}"
        results.append(json.loads(path.read_text()))
    for res in results:
        assert res["error"] is None, f"rank {res['rank']}: {res['error']}"
        assert res["ok"], f"rank {res['rank']}: {json.dumps(res['checks'], indent=1)}"
    # Every rank reports the path it took; they must agree (borrowing is local, the broadcast collective).
    sources = {res["comm_source"] for res in results}
    if comm == "borrow":
        assert sources == {BORROWED}, sources
    elif comm == "unique_id":
        assert sources == {BROADCAST}, sources
    else:  # auto: the borrowed path where it exists (the "borrow" case requires it), else the fallback
        assert len(sources) == 1 and sources <= {BORROWED, BROADCAST}, sources
    for res in results:
        for c in res["checks"]:
            name = c.pop("check")
            record(
                check=f"world{world}_{name}",
                model="qwen3_moe" if name.startswith("hf") else "random",
                rank=res["rank"],
                comm=res.get("comm_source"),
                **c,
            )


# The peer-death test's bounds: the kernel's waits (EPFUSE_TIMEOUT_MS) and the host collectives'
# (EPFUSE_COLLECTIVE_TIMEOUT_MS), short so that the test is quick; each survivor must see its error,
# and give up, within these plus a margin for process and CUDA overheads.
KILL_DEVICE_TIMEOUT_MS = 3000
KILL_COLLECTIVE_TIMEOUT_MS = 10000
KILL_MARGIN_S = 20.0


# A borrowed communicator is given up with abort() only: close() would leave the destruction's barrier
# kernel waiting on the owner's communicator for the dead rank, which epfuse never aborts, and freeing
# the workspace's memory then waits for that kernel (README, "Waits epfuse does not bound").
@pytest.mark.parametrize(("comm", "give_up"), [("borrow", "abort"), ("unique_id", "abort"), ("unique_id", "close")])
@pytest.mark.parametrize("world", [2, 4])
def test_killed_rank_every_other_rank_errors_in_bounded_time(
    record: Any, tmp_path: Path, world: int, comm: str, give_up: str
) -> None:
    """One rank (the last) SIGKILLs itself after verified forwards; every other rank's next calls
    raise an epfuse error naming it within the kernel's timeout, and Workspace.abort() (local) or
    Workspace.close() (bounded by the collective timeout, raising epfuse.Timeout) lets it exit."""
    _skip_unless_runnable(world, comm)
    victim = world - 1
    extra = {
        "EPFUSE_TEST_COMM": comm,
        "EPFUSE_TEST_KILL": str(victim),
        "EPFUSE_TEST_GIVE_UP": give_up,
        "EPFUSE_TIMEOUT_MS": str(KILL_DEVICE_TIMEOUT_MS),
        "EPFUSE_COLLECTIVE_TIMEOUT_MS": str(KILL_COLLECTIVE_TIMEOUT_MS),
    }
    # Setup, the death and the give-up: far less than this unless a rank hangs.
    procs, logs = _launch(tmp_path, world, extra, timeout_s=300)
    assert procs[victim].returncode == -9, f"the victim exited with {procs[victim].returncode}:\n{logs[victim]}"
    for r in range(world):
        path = tmp_path / f"rank{r}.json"
        assert path.exists(), f"rank {r} wrote no result; its output:\n{logs[r] if r < len(logs) else ''}"
        res = json.loads(path.read_text())
        if r == victim:
            assert res.get("killed"), res
            continue
        assert procs[r].returncode == 0, f"rank {r} exited with {procs[r].returncode}:\n{logs[r]}"
        assert res["ok"], f"rank {r}: {json.dumps(res, indent=1)}\n{logs[r]}"
        assert f"rank {victim}" in res["error"], f"rank {r}'s error does not name rank {victim}: {res['error']}"
        assert res["seconds_to_error"] < KILL_DEVICE_TIMEOUT_MS / 1000 + KILL_MARGIN_S, res
        if give_up == "abort":
            assert "give_up_error" not in res, res  # aborted: every destruction is local
            assert res["seconds_to_give_up"] < KILL_MARGIN_S, res
        else:
            # The workspace's destruction waits for its peers in a barrier bounded by the collective
            # timeout, then aborts the communicator and says so.
            assert res.get("give_up_error_type") == "Timeout", res
            assert "never met the destruction's barrier" in res["give_up_error"], res
            assert res["seconds_to_give_up"] < KILL_COLLECTIVE_TIMEOUT_MS / 1000 + KILL_MARGIN_S, res
        record(
            check=f"world{world}_killed_rank_{give_up}",
            model="random",
            rank=r,
            comm=res.get("comm_source"),
            error=res["error_type"],
            seconds_to_error=res["seconds_to_error"],
            seconds_to_give_up=res["seconds_to_give_up"],
        )


# The fault tests' bounds: the kernel's waits (EPFUSE_TIMEOUT_MS), a stall past them, and a margin for
# process and CUDA overheads.
FAULT_DEVICE_TIMEOUT_MS = 2000
FAULT_STALL_MS = 3000
FAULT_MARGIN_S = 15.0


@pytest.mark.parametrize("kind", ["skip", "stall", "throw", "bad_ids"])
def test_peer_fault_poisons_the_failed_call_and_the_next_forward_raises(tmp_path: Path, kind: str) -> None:
    """World 2, one process per GPU (multi_rank_worker.py fault_main): rank 1 misbehaves in its forward
    call 1. Every rank whose call 1 ran and failed gets y NaN on every row from that call (no exception
    yet: the forward does not synchronise), and its next forward raises, naming rank 1 and what it
    waited for (epfuse.Timeout: rank 1's count message; bad_ids: epfuse.InvalidArgument); the faulty
    rank raises too within two more calls (its first runs alone and times out, NaN); nobody hangs."""
    world, victim = 2, 1
    _skip_unless_runnable(world, "unique_id")
    fault = f"rank={victim},kind={kind},call=1" + (f",ms={FAULT_STALL_MS}" if kind == "stall" else "")
    extra = {
        "EPFUSE_TEST_FAULT": kind,
        "EPFUSE_FAULT": fault,
        "EPFUSE_TIMEOUT_MS": str(FAULT_DEVICE_TIMEOUT_MS),
        "EPFUSE_COLLECTIVE_TIMEOUT_MS": "10000",
    }
    procs, logs = _launch(tmp_path, world, extra, timeout_s=300)
    bound_s = (FAULT_STALL_MS + 2 * FAULT_DEVICE_TIMEOUT_MS) / 1000 + FAULT_MARGIN_S
    for r in range(world):
        path = tmp_path / f"rank{r}.json"
        assert path.exists(), f"rank {r} wrote no result; its output:\n{logs[r] if r < len(logs) else ''}"
        res = json.loads(path.read_text())
        where = f"rank {r} ({kind}): {json.dumps(res, indent=1)}\n{logs[r]}"
        assert res["error"] is None and res["ok"], where
        calls = res["calls"]
        assert calls[0]["raised"] is None and calls[0]["verified"], where
        last = calls[-1]
        assert last["raised"], f"never raised: {where}"  # never silent
        assert sum(c["seconds"] for c in calls[1:]) < bound_s, where
        for c in calls[1:-1]:
            # Every forward that returned after the fault left NaN, but the faulty rank's own call 1 under
            # skip (it never ran) and a late stalled call that ran right.
            never_ran = r == victim and kind == "skip" and c["call"] == 1
            late_but_right = r == victim and kind == "stall" and c["call"] == 1 and c["verified"]
            assert never_ran or late_but_right or c["not_nan"] == 0, where
        if r != victim:
            assert [c["call"] for c in calls] == [0, 1, 2], where  # the first forward after the failure raises
            assert last["error"].startswith(f"[EPFUSE_ERR_") and f"] rank {r}: " in last["error"], where
            if kind == "bad_ids":
                assert last["raised"] == "InvalidArgument" and f"rank {victim} reported invalid input" in last["error"], where
            else:
                assert last["raised"] == "Timeout", where
                assert f"the count message of rank {victim}" in last["error"], where
        elif kind == "throw":
            assert [c["call"] for c in calls] == [0, 1], where
            assert last["raised"] == "InternalError", where
            assert "EPFUSE_FAULT: throw in forward call 1" in last["error"], where
        elif kind == "bad_ids":
            assert [c["call"] for c in calls] == [0, 1, 2], where
            assert last["raised"] == "InvalidArgument" and "topk_idx[0][0] = 2139062143" in last["error"], where
        else:
            assert last["raised"] == "Timeout" and len(calls) <= 4, where
