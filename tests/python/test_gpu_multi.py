"""epfuse.torch at world 2 and 4: one process per GPU (multi_rank_worker.py, started like torchrun)
on a torch.distributed NCCL group, with the group's communicator borrowed ("borrow": must take the
borrowed path, Workspace.comm_source says which it took), with epfuse's own from a broadcast
ncclUniqueId ("unique_id"), and "auto" (either: borrowed where torch exposes the communicator, else the
broadcast); each rank checks its tokens against the float64 reference, and an HF Qwen3-MoE block
against transformers. Skipped with fewer GPUs than ranks."""

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


@pytest.mark.parametrize("comm", ["borrow", "auto", "unique_id"])
@pytest.mark.parametrize("world", [2, 4])
def test_multi_rank(record: Any, tmp_path: Path, world: int, comm: str) -> None:
    gpus = torch.cuda.device_count()
    if gpus < world:
        pytest.skip(f"needs {world} GPUs, this machine has {gpus}")
    import epfuse

    if comm == "borrow" and not hasattr(getattr(torch.distributed, "ProcessGroupNCCL", None), "_comm_ptr"):
        pytest.skip(f"torch {torch.__version__} does not expose ProcessGroupNCCL._comm_ptr(): nothing to borrow")
    env = dict(os.environ)
    env.update(
        WORLD_SIZE=str(world),
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(_free_port()),
        EPFUSE_BOOTSTRAP_SECRET=secrets.token_hex(32),  # what `epfuse launch` would give the ranks
        EPFUSE_TEST_COMM=comm,
        NCCL_NVLS_ENABLE="0",  # epfuse never uses NVLink multicast (README, Requirements)
        EPFUSE_LIB=epfuse.library_path(),
        PYTHONPATH=os.pathsep.join([str(Path(epfuse.__file__).resolve().parents[1]), env.get("PYTHONPATH", "")]),
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
            logs.append(p.communicate(timeout=600)[0])
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
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
