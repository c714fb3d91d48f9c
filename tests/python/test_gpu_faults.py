"""EPFUSE_FAULT (src/common/fault.h) through the C ABI and epfuse.torch, world of one rank on one GPU, in
this process: rank 0's layer reads its expert ids with one out of range in its second forward
(kind=bad_ids), or throws before its launch (kind=throw). The failed forward itself returns normally
(the device finds the bad id) with its y NaN on every row, and the next forward raises, without a
check_errors in between, an error naming rank 0 and the id; every forward after it raises too, until the
workspace is made again, which then works. Through the C ABI: the same as return codes and
epfuse_last_error(). The multi-rank cases (a peer's skip, stall, throw or bad ids) are
test_gpu_multi.py's test_peer_fault_*. Skipped without a CUDA device."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

import epfuse
from epfuse import _lib
from epfuse.errors import ERR_INTERNAL, ERR_INVALID_ARGUMENT, OK

torch = pytest.importorskip("torch", reason="torch is not installed")
pytestmark = pytest.mark.usefixtures("cuda")

from moe_ref import errors, random_inputs, random_weights, reference, within_bounds  # noqa: E402 - after the torch check

H, I, E, K, MAX_T, T = 256, 256, 16, 4, 64, 40
BAD_ID = "rank 0: topk_idx[0][0] = 2139062143 is not a valid expert id"  # 0x7f7f7f7f (fault.h)


@pytest.fixture()
def fault(monkeypatch: pytest.MonkeyPatch) -> Any:
    """fault(text): EPFUSE_FAULT for the layers made afterwards (read at creation); unset after the test."""
    monkeypatch.setenv("EPFUSE_TIMEOUT_MS", "2000")

    def set_fault(text: str) -> None:
        monkeypatch.setenv("EPFUSE_FAULT", text)

    return set_fault


def _inputs() -> tuple[Any, ...]:
    w13, w2 = random_weights(E, H, I, device="cuda", seed=5)
    x, ids, w = random_inputs(T, H, E, K, device="cuda", seed=11)
    return w13, w2, x, ids, w, reference(x, ids, w, w13, w2)


def test_torch_bad_ids_poison_their_own_call_and_the_next_forward_raises(fault: Any) -> None:
    import epfuse.torch as et

    w13, w2, x, ids, w, ref = _inputs()
    fault("rank=0,kind=bad_ids,call=1")
    with et.Workspace(hidden=H, intermediate=I, num_experts=E, topk=K, max_tokens=MAX_T) as ws:
        layer = et.MoELayer(ws, w13, w2, topk=K)
        y0 = layer(x, ids, w)
        layer.check_errors()
        assert within_bounds(errors(y0, ref)), errors(y0, ref)
        ids_before = ids.clone()
        y1 = layer(x, ids, w)  # the fault: found on the device, nothing raised yet
        torch.cuda.synchronize()
        assert torch.isnan(y1).all(), f"{int((~torch.isnan(y1)).sum())} values of the failed call's y are not NaN"
        assert torch.equal(ids, ids_before), "the caller's topk_ids were written"
        with pytest.raises(epfuse.InvalidArgument) as info:
            layer(x, ids, w)  # no check_errors in between: the device told the host
        assert BAD_ID in info.value.message, info.value
        with pytest.raises(epfuse.InternalError, match="unusable after an earlier error"):
            layer(x, ids, w)
    # The variable stays set: a new layer's forward number 1 would misbehave again, call 0 does not.
    with et.Workspace(hidden=H, intermediate=I, num_experts=E, topk=K, max_tokens=MAX_T) as ws:
        layer = et.MoELayer(ws, w13, w2, topk=K)
        y = layer(x, ids, w)
        layer.check_errors()
        assert within_bounds(errors(y, ref)), errors(y, ref)


class _CLayer:
    """A world of one rank made through the C ABI alone (comm, workspace, layer), with its forward and
    check_errors returning the C functions' codes; `with` destroys it."""

    def __init__(self, w13: Any, w2: Any) -> None:
        self.lib = _lib.load()
        self.comm = _lib.comm_init_rank(_lib.nccl_unique_id(), 1, 0, torch.cuda.current_device())
        cfg = _lib.LayerConfig(H, I, E, K, MAX_T, 0.0, 0, _lib.WEIGHTS_BF16, _lib.SCALES_FP32)
        self.ws = self.layer = 0
        try:
            self.ws = _lib.workspace_create(self.comm, cfg)
            self.layer = _lib.layer_create(self.ws, cfg, w13.data_ptr(), w2.data_ptr())
        except BaseException:
            self.close()
            raise
        self.stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)

    def forward(self, x: Any, ids: Any, w: Any, y: Any) -> int:
        return int(
            self.lib.epfuse_layer_forward(
                ctypes.c_void_p(self.layer), ctypes.c_void_p(x.data_ptr()), ctypes.c_void_p(ids.data_ptr()),
                ctypes.c_void_p(w.data_ptr()), x.shape[0], ctypes.c_void_p(y.data_ptr()), self.stream,
            )
        )

    def check_errors(self) -> int:
        return int(self.lib.epfuse_layer_check_errors(ctypes.c_void_p(self.layer), self.stream))

    def __enter__(self) -> _CLayer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        for kind in ("layer", "ws", "comm"):
            handle = getattr(self, kind)
            if handle:
                _lib.destroy({"ws": "workspace"}.get(kind, kind), handle)
                setattr(self, kind, 0)


def test_c_abi_bad_ids_return_ok_with_nan_then_the_error_code(fault: Any) -> None:
    w13, w2, x, ids, w, ref = _inputs()
    fault("rank=0,kind=bad_ids,call=1")
    y = torch.empty_like(x)
    with _CLayer(w13, w2) as c:
        assert c.forward(x, ids, w, y) == OK and c.check_errors() == OK, _lib.last_error()
        assert within_bounds(errors(y, ref)), errors(y, ref)
        y.fill_(0.5)
        assert c.forward(x, ids, w, y) == OK, _lib.last_error()  # found on the device, later
        torch.cuda.synchronize()
        assert torch.isnan(y).all(), f"{int((~torch.isnan(y)).sum())} values of the failed call's y are not NaN"
        assert c.forward(x, ids, w, y) == ERR_INVALID_ARGUMENT
        assert BAD_ID in _lib.last_error(), _lib.last_error()
        assert c.forward(x, ids, w, y) == ERR_INTERNAL
        assert "unusable after an earlier error" in _lib.last_error(), _lib.last_error()


def test_c_abi_thrown_fault_is_internal_with_its_message(fault: Any) -> None:
    w13, w2, x, ids, w, _ = _inputs()
    fault("rank=0,kind=throw,call=0")
    with _CLayer(w13, w2) as c:
        assert c.forward(x, ids, w, torch.empty_like(x)) == ERR_INTERNAL
        assert _lib.last_error() == "rank 0: EPFUSE_FAULT: throw in forward call 0 (thrown before the launch)"
