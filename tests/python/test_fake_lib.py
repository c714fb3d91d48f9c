"""epfuse.torch and epfuse.hf on CPU with the C library replaced by a recorder (no GPU, no
libepfuse_c.so): what each Python call hands to the C API (configs, pointers, token counts, converted
ids and weights, the stream), the order of destruction, the layer registry, garbage collection, and
the communicator paths over a torch.distributed group. The recorder reads the converted ids and
weights back through their pointers, and its "forward" copies x into y."""

from __future__ import annotations

import ctypes
import gc
import warnings
from typing import Any
from collections.abc import Iterator

import pytest

import epfuse
from epfuse import _lib

torch = pytest.importorskip("torch", reason="torch is not installed: epfuse.torch's wiring is not tested")
et = pytest.importorskip("epfuse.torch")

from moe_ref import hf_fp8_experts  # noqa: E402 - after the torch check


class FakeLib:
    """Stands in for the C API functions of epfuse._lib that epfuse.torch calls."""

    def __init__(self, world: int = 1, rank: int = 0) -> None:
        self.world, self.rank = world, rank
        self.calls: list[tuple[Any, ...]] = []
        self.live: dict[int, str] = {}
        self.aborted: set[int] = set()
        self._next = 0x1000

    def _new(self, kind: str) -> int:
        self._next += 0x10
        self.live[self._next] = kind
        return self._next

    def nccl_unique_id(self) -> bytes:
        self.calls.append(("unique_id",))
        return bytes(range(128))

    def comm_init_rank(self, uid: bytes, world: int, rank: int, device: Any) -> int:
        assert len(uid) == 128
        self.calls.append(("init_rank", world, rank))
        return self._new("comm")

    def comm_borrow_nccl(self, ptr: int) -> int:
        self.calls.append(("borrow", ptr))
        return self._new("comm")

    def comm_abort(self, comm: int, why: str) -> None:
        assert self.live[comm] == "comm"
        self.aborted.add(comm)
        self.calls.append(("abort", comm, why))

    def comm_aborted(self, comm: int) -> bool:
        return comm in self.aborted

    def comm_rank(self, comm: int) -> int:
        return self.rank

    def comm_world_size(self, comm: int) -> int:
        return self.world

    @staticmethod
    def _cfg(cfg: Any) -> dict[str, Any]:
        return {name: getattr(cfg, name) for name, _ in cfg._fields_}

    def workspace_create(self, comm: int, capacity: Any) -> int:
        assert self.live[comm] == "comm"
        self.calls.append(("workspace_create", self._cfg(capacity)))
        return self._new("workspace")

    def workspace_memory(self, ws: int) -> tuple[int, int]:
        return 3 << 20, 1 << 20

    def layer_create(self, ws: int, cfg: Any, w13: int, w2: int) -> int:
        assert self.live[ws] == "workspace"
        self.calls.append(("layer_create", self._cfg(cfg), w13, w2))
        return self._new("layer")

    def layer_create_fp8(
        self, ws: int, cfg: Any, w13: int, s13: int, n13: int, w2: int, s2: int, n2: int
    ) -> int:
        assert self.live[ws] == "workspace"
        self.calls.append(("layer_create_fp8", self._cfg(cfg), w13, s13, n13, w2, s2, n2))
        return self._new("layer")

    def layer_forward(self, layer: int, x: int, ids: int, w: int, tokens: int, y: int, stream: int) -> None:
        assert self.live[layer] == "layer"
        cfg = next(c[1] for c in self.calls if c[0] in ("layer_create", "layer_create_fp8"))
        k, h = cfg["topk"], cfg["hidden"]
        ids_read = list((ctypes.c_int32 * (tokens * k)).from_address(ids)) if tokens else []
        w_read = list((ctypes.c_float * (tokens * k)).from_address(w)) if tokens else []
        if tokens:
            ctypes.memmove(y, x, tokens * h * 2)
        self.calls.append(("forward", layer, tokens, stream, ids_read, w_read, x, y))

    def layer_forward_fp8(
        self, layer: int, x: int, scales: int, ids: int, w: int, tokens: int, y: int, stream: int
    ) -> None:
        assert self.live[layer] == "layer"
        h = next(c[1] for c in self.calls if c[0] == "layer_create_fp8")["hidden"]
        scales_read = list((ctypes.c_float * (tokens * -(-h // 128))).from_address(scales)) if tokens else []
        self.calls.append(("forward_fp8", layer, tokens, stream, x, scales_read, y))

    def layer_check_errors(self, layer: int, stream: int) -> None:
        self.calls.append(("check_errors", layer, stream))

    def destroy(self, kind: str, handle: int) -> None:
        assert self.live.pop(handle) == kind, f"destroying {kind} {handle:#x}"
        self.calls.append(("destroy", kind, handle))

    def kinds(self, name: str) -> list[tuple[Any, ...]]:
        return [c for c in self.calls if c[0] == name]


class _NoDevice:
    def __init__(self, device: Any) -> None:
        pass

    def __enter__(self) -> None:
        pass

    def __exit__(self, *exc: Any) -> None:
        pass


STREAM = 0xABC


@pytest.fixture()
def fake(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeLib]:
    lib = FakeLib()
    for name in (
        "nccl_unique_id",
        "comm_init_rank",
        "comm_borrow_nccl",
        "comm_abort",
        "comm_aborted",
        "comm_rank",
        "comm_world_size",
        "workspace_create",
        "workspace_memory",
        "layer_create",
        "layer_create_fp8",
        "layer_forward",
        "layer_forward_fp8",
        "layer_check_errors",
        "destroy",
    ):
        monkeypatch.setattr(_lib, name, getattr(lib, name))
    monkeypatch.setattr(et, "_cuda_device", lambda device=None: torch.device("cpu"))
    monkeypatch.setattr(et, "_OnDevice", _NoDevice)
    monkeypatch.setattr(et, "_stream_of", lambda device: STREAM)
    monkeypatch.setattr(_lib, "loaded_after_torch", lambda: True)
    yield lib
    gc.collect()


H, I, E, K = 256, 128, 8, 2


def weights(e: int = E, h: int = H, i: int = I) -> tuple[Any, Any]:
    g = torch.Generator().manual_seed(0)
    return (
        torch.randn(e, 2 * i, h, generator=g).to(torch.bfloat16),
        torch.randn(e, h, i, generator=g).to(torch.bfloat16),
    )


def make_ws(**kw: Any) -> Any:
    args: dict[str, Any] = {"hidden": H, "intermediate": I, "num_experts": E, "topk": K, "max_tokens": 64}
    args.update(kw)
    return et.Workspace(**args)


def test_workspace_and_layer_configs(fake: FakeLib) -> None:
    ws = make_ws(num_sms=32)
    assert fake.calls[:2] == [("unique_id",), ("init_rank", 1, 0)]
    assert fake.kinds("workspace_create")[0][1] == {
        "hidden": H,
        "intermediate": I,
        "num_experts": E,
        "topk": K,
        "max_tokens_per_rank": 64,
        "swiglu_clamp": 0.0,
        "num_sms": 32,
        "weight_format": 0,
        "scale_format": 0,
    }
    assert ws.memory() == {"symmetric_bytes": 3 << 20, "private_bytes": 1 << 20, "total_bytes": 4 << 20}
    w13, w2 = weights()
    layer = et.MoELayer(ws, w13, w2, topk=K, swiglu_clamp=7.0, max_tokens=32)
    _, cfg, p13, p2 = fake.kinds("layer_create")[0]
    assert cfg == {
        "hidden": H,
        "intermediate": I,
        "num_experts": E,
        "topk": K,
        "max_tokens_per_rank": 32,
        "swiglu_clamp": 7.0,
        "num_sms": 32,
        "weight_format": 0,
        "scale_format": 0,
    }
    assert (p13, p2) == (w13.data_ptr(), w2.data_ptr())  # borrowed, not copied
    ws.close()
    assert layer.closed


def fp8_weights(scale_dtype: Any) -> tuple[Any, Any, Any, Any]:
    g = torch.Generator().manual_seed(1)
    w13 = torch.randn(E, 2 * I, H, generator=g).to(torch.float8_e4m3fn)
    w2 = torch.randn(E, H, I, generator=g).to(torch.float8_e4m3fn)
    bh, bi = H // 128, I // 128
    return w13, w2, torch.ones(E, 2 * bi, bh, dtype=scale_dtype), torch.ones(E, bh, bi, dtype=scale_dtype)


@pytest.mark.parametrize(("scale_dtype", "scale_format"), [(torch.float32, 0), (torch.float8_e8m0fnu, 1)])
def test_fp8_layer_hands_codes_scales_and_formats_to_c(fake: FakeLib, scale_dtype: Any, scale_format: int) -> None:
    ws = make_ws(weight_dtype=torch.float8_e4m3fn)
    assert fake.kinds("workspace_create")[0][1]["weight_format"] == 1
    w13, w2, s13, s2 = fp8_weights(scale_dtype)
    layer = et.MoELayer(ws, w13, w2, topk=K, w13_scale=s13, w2_scale=s2)
    assert fake.kinds("layer_create") == []
    _, cfg, p13, ps13, n13, p2, ps2, n2 = fake.kinds("layer_create_fp8")[0]
    assert (cfg["weight_format"], cfg["scale_format"], cfg["hidden"], cfg["intermediate"]) == (1, scale_format, H, I)
    assert (p13, p2) == (w13.data_ptr(), w2.data_ptr())  # the codes borrowed
    assert (ps13, n13, ps2, n2) == (s13.data_ptr(), s13.numel(), s2.data_ptr(), s2.numel())
    assert layer.weight_dtype == torch.float8_e4m3fn
    x = torch.randn(3, H).to(torch.bfloat16)
    y = layer(x, torch.zeros(3, K, dtype=torch.int32), torch.ones(3, K))
    assert y.dtype == torch.bfloat16 and fake.kinds("forward")[0][2] == 3
    # A bf16 layer shares the FP8 workspace.
    et.MoELayer(ws, *weights(), topk=K)
    assert fake.kinds("layer_create")[0][1]["weight_format"] == 0
    ws.close()


def test_fp8_layer_takes_x_quantised_by_the_caller(fake: FakeLib) -> None:
    ws = make_ws(weight_dtype=torch.float8_e4m3fn)
    w13, w2, s13, s2 = fp8_weights(torch.float32)
    layer = et.MoELayer(ws, w13, w2, topk=K, w13_scale=s13, w2_scale=s2)
    x = torch.randn(3, H).to(torch.float8_e4m3fn)
    scale = torch.arange(1, 3 * (H // 128) + 1, dtype=torch.float32).reshape(3, H // 128)
    ids, w = torch.zeros(3, K, dtype=torch.int32), torch.ones(3, K)
    y = layer(x, ids, w, x_scale=scale)
    assert y.dtype == torch.bfloat16 and y.shape == (3, H)
    (_, _, tokens, _, px, scales_read, py), = fake.kinds("forward_fp8")
    assert (tokens, px, py) == (3, x.data_ptr(), y.data_ptr())
    assert scales_read == scale.flatten().tolist() and fake.kinds("forward") == []
    with pytest.raises(epfuse.InvalidArgument, match="pass its per-token 1x128 scales as x_scale"):
        layer(x, ids, w)
    with pytest.raises(epfuse.InvalidArgument, match=r"x_scale must be \[tokens, ceil\(hidden/128\)\] = \[3, 2\]"):
        layer(x, ids, w, x_scale=scale[:, :1].contiguous())
    with pytest.raises(epfuse.InvalidArgument, match="with x_scale, x must be torch.float8_e4m3fn"):
        layer(x.to(torch.bfloat16), ids, w, x_scale=scale)
    bf16 = et.MoELayer(ws, *weights(), topk=K)
    with pytest.raises(epfuse.InvalidArgument, match="x_scale \\(quantised x\\) needs FP8 experts"):
        bf16(x, ids, w, x_scale=scale)
    ws.close()


def test_fp8_layer_needs_an_fp8_workspace(fake: FakeLib) -> None:
    ws = make_ws()
    w13, w2, s13, s2 = fp8_weights(torch.float32)
    with pytest.raises(epfuse.InvalidArgument, match=r"FP8 experts need a workspace made with weight_dtype=torch.float8_e4m3fn"):
        et.MoELayer(ws, w13, w2, topk=K, w13_scale=s13, w2_scale=s2)
    b13, b2 = weights()
    with pytest.raises(epfuse.InvalidArgument, match="w13_scale and w2_scale are for FP8 experts"):
        et.MoELayer(ws, b13, b2, topk=K, w2_scale=torch.ones(1))
    with pytest.raises(epfuse.InvalidArgument, match="weight_dtype must be torch.bfloat16 or torch.float8_e4m3fn"):
        make_ws(weight_dtype=torch.float16)
    assert fake.kinds("layer_create_fp8") == [] and fake.kinds("layer_create") == []
    ws.close()


def test_forward_hands_converted_inputs_to_c(fake: FakeLib) -> None:
    ws = make_ws()
    layer = et.MoELayer(ws, *weights(), topk=K)
    x = torch.randn(5, H).to(torch.bfloat16)
    ids = torch.tensor([[0, 7], [1, -1], [2, 3], [4, 5], [6, 0]], dtype=torch.int64)
    w = torch.tensor([[0.5, 0.5], [1.0, 0.0], [0.25, 0.75], [0.125, 0.875], [0.375, 0.625]], dtype=torch.bfloat16)
    y = layer(x, ids, w)
    _, handle, tokens, stream, ids_read, w_read, xp, yp = fake.kinds("forward")[0]
    assert (tokens, stream, xp, yp) == (5, STREAM, x.data_ptr(), y.data_ptr())
    assert ids_read == ids.flatten().tolist()  # int64 -> int32
    assert w_read == w.float().flatten().tolist()  # bf16 -> fp32
    assert torch.equal(y, x) and y.data_ptr() != x.data_ptr()  # y is a new tensor
    layer.check_errors()
    assert fake.kinds("check_errors") == [("check_errors", handle, STREAM)]
    # Zero tokens still reach C (the forward is collective: every rank calls it).
    y0 = layer(x[:0], ids[:0], w[:0])
    assert y0.shape == (0, H) and fake.kinds("forward")[-1][2] == 0
    ws.close()


def test_forward_checks_values_before_calling_c(fake: FakeLib, monkeypatch: pytest.MonkeyPatch) -> None:
    # Out-of-range int64 ids, bad caller scales and a y aliasing x never reach C.
    ws = make_ws(weight_dtype=torch.float8_e4m3fn)
    layer = et.MoELayer(ws, *weights(), topk=K)
    x = torch.randn(3, H).to(torch.bfloat16)
    w = torch.ones(3, K)
    ids = torch.tensor([[0, 1], [2, 2**32 + 3], [-1, 4]], dtype=torch.int64)  # 2**32 + 3 narrows to 3
    with pytest.raises(ValueError, match=r"topk_ids\[1\]\[1\] = 4294967299 is not a valid expert id \(-1 or \[0, 8\)\)"):
        layer(x, ids, w)
    ids[1, 1] = E
    with pytest.raises(epfuse.InvalidArgument, match=r"topk_ids\[1\]\[1\] = 8 is not a valid expert id"):
        layer(x, ids, w)
    assert fake.kinds("forward") == []
    ids[1, 1] = 7
    layer(x, ids, w)
    assert fake.kinds("forward")[0][4] == [0, 1, 2, 7, -1, 4]
    # y aliasing x: torch.empty never returns x's memory, so the allocation is replaced to show the check.
    with monkeypatch.context() as patch:
        patch.setattr(et, "_new_output", lambda x: x)
        with pytest.raises(epfuse.InvalidArgument, match="y overlaps x: the output must not alias an input"):
            layer(x, ids, w)
    assert len(fake.kinds("forward")) == 1
    # FP8 x quantised by the caller: every scale finite and > 0.
    w13, w2, s13, s2 = fp8_weights(torch.float32)
    fp8 = et.MoELayer(ws, w13, w2, topk=K, w13_scale=s13, w2_scale=s2)
    xq = torch.randn(3, H).to(torch.float8_e4m3fn)
    for bad in (0.0, -2.0, float("nan"), float("inf")):
        scale = torch.ones(3, H // 128)
        scale[1, 0] = bad
        with pytest.raises(ValueError, match=r"x_scale\[1\]\[0\] = .*must be finite and > 0"):
            fp8(xq, ids, w, x_scale=scale)
    assert fake.kinds("forward_fp8") == []
    ws.close()


def test_close_order_newest_layer_first(fake: FakeLib) -> None:
    ws = make_ws()
    layers = [et.MoELayer(ws, *weights(), topk=K) for _ in range(3)]
    handles = [c for c in fake.live if fake.live[c] == "layer"]
    ws_handle, comm_handle = ws.handle, next(h for h, k in fake.live.items() if k == "comm")
    layers[1].close()
    assert ws.layers() == [layers[0], layers[2]]
    ws.close()
    destroyed = [(c[1], c[2]) for c in fake.kinds("destroy")]
    assert destroyed == [
        ("layer", handles[1]),
        ("layer", handles[2]),
        ("layer", handles[0]),
        ("workspace", ws_handle),
        ("comm", comm_handle),
    ]
    assert fake.live == {}
    ws.close()  # idempotent
    with pytest.raises(epfuse.InvalidArgument, match="the workspace is closed"):
        et.MoELayer(ws, *weights(), topk=K)


def test_abort_aborts_the_communicator_then_closes_everything(fake: FakeLib) -> None:
    fake.world = 2
    ws = make_ws()
    layers = [et.MoELayer(ws, *weights(e=E // 2), topk=K) for _ in range(2)]
    handles = [c for c in fake.live if fake.live[c] == "layer"]
    ws_handle, comm_handle = ws.handle, next(h for h, k in fake.live.items() if k == "comm")
    assert not ws.aborted
    ws.abort("rank 1 died")
    # The abort comes first, so that every destruction after it is local (no barrier, no finalize).
    assert fake.calls[-5:] == [
        ("abort", comm_handle, "rank 1 died"),
        ("destroy", "layer", handles[1]),
        ("destroy", "layer", handles[0]),
        ("destroy", "workspace", ws_handle),
        ("destroy", "comm", comm_handle),
    ]
    assert fake.live == {} and ws.closed and all(layer.closed for layer in layers)
    assert not ws.aborted  # closed: no communicator left to ask
    ws.abort("again")  # idempotent
    ws.close()
    assert fake.kinds("abort") == [("abort", comm_handle, "rank 1 died")]
    with pytest.raises(epfuse.InvalidArgument, match="the workspace is closed"):
        et.MoELayer(ws, *weights(e=E // 2), topk=K)


def test_close_raises_the_destroy_error_after_freeing_everything(
    fake: FakeLib, monkeypatch: pytest.MonkeyPatch
) -> None:
    ws = make_ws()
    et.MoELayer(ws, *weights(), topk=K)
    real_destroy = fake.destroy

    def destroy(kind: str, handle: int) -> None:
        real_destroy(kind, handle)
        if kind == "workspace":  # as epfuse_workspace_destroy when the peers never met its barrier
            raise epfuse.Timeout("epfuse_workspace_destroy: rank 0: the peers never met the destruction's barrier")

    monkeypatch.setattr(_lib, "destroy", destroy)
    with pytest.raises(epfuse.Timeout, match="never met the destruction's barrier"):
        ws.close()
    assert fake.live == {} and ws.closed  # the communicator is destroyed all the same


def test_registry_and_garbage_collection(fake: FakeLib) -> None:
    ws = make_ws()
    layer = et.MoELayer(ws, *weights(), topk=K)
    layer_id = layer.layer_id
    assert et._layer_by_id(layer_id) is layer
    del layer
    gc.collect()
    assert fake.kinds("destroy")[-1][1] == "layer"  # a world-of-one layer is destroyed when collected
    x = torch.zeros(1, H, dtype=torch.bfloat16)
    w13, w2 = weights()
    with pytest.raises(epfuse.InvalidArgument, match=f"no open MoELayer with layer_id {layer_id}"):
        torch.ops.epfuse.moe_forward(x, torch.zeros(1, K, dtype=torch.int32), torch.zeros(1, K), w13, w2, layer_id)
    del ws
    gc.collect()
    assert fake.live == {}


def test_world_above_one_is_not_destroyed_by_gc(fake: FakeLib) -> None:
    fake.world = 2
    ws = make_ws()
    layer = et.MoELayer(ws, *weights(e=E // 2), topk=K)
    assert layer.num_experts == E
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del layer, ws
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) and "collective" in str(w.message) for w in caught)
    assert not fake.kinds("destroy")  # leaked, not destroyed out of step with the other ranks


def test_foreign_weights_rejected_by_the_op(fake: FakeLib) -> None:
    ws = make_ws()
    layer = et.MoELayer(ws, *weights(), topk=K)
    x = torch.zeros(2, H, dtype=torch.bfloat16)
    ids, w = torch.zeros(2, K, dtype=torch.int32), torch.zeros(2, K)
    with pytest.raises(
        epfuse.InvalidArgument, match=f"w2 is not the tensor MoELayer {layer.layer_id} was created with"
    ):
        torch.ops.epfuse.moe_forward(x, ids, w, layer.w13, layer.w2.clone(), layer.layer_id)
    ws.close()


@pytest.fixture()
def gloo_group() -> Iterator[Any]:
    import torch.distributed as dist

    if not dist.is_available():
        pytest.skip("this torch has no torch.distributed")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


def test_group_must_be_nccl(fake: FakeLib, gloo_group: Any) -> None:
    with pytest.raises(epfuse.Unsupported, match="the process group's backend is 'gloo': epfuse needs an NCCL group"):
        make_ws()


def test_group_comm_borrowed_or_broadcast(fake: FakeLib, gloo_group: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch.distributed as dist

    # A gloo group made to look like an NCCL one: the broadcast of the unique id runs over gloo.
    monkeypatch.setattr(dist, "get_backend", lambda group=None: "nccl")
    monkeypatch.setattr(et, "_torch_nccl_comm", lambda group, device: 0xBEEF)
    ws = make_ws()
    assert ws.comm_source == "borrowed from the process group" and fake.calls[0] == ("borrow", 0xBEEF)
    ws.close()
    fake.calls.clear()
    ws = make_ws(comm="unique_id")
    assert ws.comm_source == "unique_id broadcast over the process group"
    assert fake.calls[:2] == [("unique_id",), ("init_rank", 1, 0)]
    ws.close()
    monkeypatch.setattr(et, "_torch_nccl_comm", lambda group, device: None)
    with pytest.raises(epfuse.Unsupported, match="cannot borrow the group's NCCL communicator on every rank"):
        make_ws(comm="borrow")
    fake.calls.clear()
    ws = make_ws()  # auto: falls back to the broadcast
    assert ws.comm_source == "unique_id broadcast over the process group"
    ws.close()
    with pytest.raises(epfuse.InvalidArgument, match="comm must be 'auto', 'borrow' or 'unique_id'"):
        make_ws(comm="mpi")


# --- epfuse.hf through the recorder ---


def qwen3_block(experts: int = E) -> Any:
    transformers = pytest.importorskip("transformers", reason="transformers is not installed")
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    cfg = transformers.Qwen3MoeConfig(
        hidden_size=H, moe_intermediate_size=I, num_experts=experts, num_experts_per_tok=K, norm_topk_prob=True
    )
    block = Qwen3MoeSparseMoeBlock(cfg)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape) * 0.05)
    block.experts.config._experts_implementation = "eager"
    return block.to(torch.bfloat16)


@pytest.mark.parametrize("use_interface", [True, False])
def test_hf_attach_runs_the_experts_through_epfuse(fake: FakeLib, use_interface: bool) -> None:
    import epfuse.hf as ehf

    block = qwen3_block()
    ws = ehf.make_workspace(block, max_tokens=64)
    assert fake.kinds("workspace_create")[0][1]["num_experts"] == E
    layers = ehf.attach(block, ws, use_interface=use_interface)
    _, cfg, p13, p2 = fake.kinds("layer_create")[0]
    assert (p13, p2) == (block.experts.gate_up_proj.data_ptr(), block.experts.down_proj.data_ptr())
    assert cfg["topk"] == K and cfg["num_experts"] == E
    impl = block.experts.config._experts_implementation
    assert impl == ("epfuse" if use_interface else "eager")
    x = torch.randn(2, 6, H).to(torch.bfloat16)
    with torch.no_grad():
        y = block(x)
        _, top_w, top_i = block.gate(x.view(-1, H))
    assert torch.equal(y, x)  # the recorder's forward copies x
    _, _, tokens, _, ids_read, w_read, _, _ = fake.kinds("forward")[-1]
    assert tokens == 12 and ids_read == top_i.flatten().tolist()
    assert w_read == top_w.float().flatten().tolist()  # the router's weights as transformers computed them
    ehf.detach(block)
    assert layers[0].closed and block.experts.config._experts_implementation == "eager"
    assert "forward" not in block.experts.__dict__
    with torch.no_grad():
        assert not torch.equal(block(x), x)  # transformers' experts again
    ws.close()


def test_hf_router_ids_out_of_range_are_refused_before_narrowing(fake: FakeLib) -> None:
    # transformers' routers give int64 ids; one past int32 must not wrap into a valid expert.
    import epfuse.hf as ehf

    block = qwen3_block()
    ws = ehf.make_workspace(block, max_tokens=64)
    ehf.attach(block, ws)
    x = torch.randn(4, H).to(torch.bfloat16)
    ids = torch.tensor([[0, 1], [2, 3], [4, 2**32 + 5], [6, 7]], dtype=torch.int64)
    w = torch.full((4, K), 0.5)
    with pytest.raises(ValueError, match=r"topk_ids\[2\]\[1\] = 4294967301 is not a valid expert id \(-1 or \[0, 8\)\)"):
        ehf.experts_forward(block.experts, x, ids, w)
    assert fake.kinds("forward") == []
    ids[2, 1] = 5
    ehf.experts_forward(block.experts, x, ids, w)
    assert fake.kinds("forward")[0][4] == ids.flatten().tolist()
    ehf.detach(block)
    ws.close()


def test_hf_rank_takes_its_share_of_the_experts(fake: FakeLib) -> None:
    import epfuse.hf as ehf

    fake.world, fake.rank = 2, 1
    block = qwen3_block()
    ws = ehf.make_workspace(block, max_tokens=64)
    ehf.attach(block, ws)
    _, cfg, p13, p2 = fake.kinds("layer_create")[0]
    half = E // 2
    assert p13 == block.experts.gate_up_proj[half:].data_ptr() and p2 == block.experts.down_proj[half:].data_ptr()
    assert cfg["num_experts"] == E
    ehf.detach(block)
    ws.close()
    fake.world, fake.rank = 3, 0
    ws = ehf.make_workspace(block, max_tokens=64)
    with pytest.raises(epfuse.Unsupported, match="has 8 experts, not a multiple of the world size 3"):
        ehf.attach(block, ws)
    ws.close()


def fp8_experts(experts: int = E, block: tuple[int, int] = (128, 128), intermediate: int = I, **config: Any) -> Any:
    """transformers' FP8Experts as its fine-grained FP8 quantizer installs it (dispatching through
    FP8ExpertsInterface), with random codes and scales in float32."""
    module = hf_fp8_experts(H, intermediate, experts, K, block, **config)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name in ("gate_up_proj", "down_proj"):
            getattr(module, name).copy_(torch.randn(getattr(module, name).shape, generator=g).to(torch.float8_e4m3fn))
            getattr(module, name + "_scale_inv").fill_(0.01)
    return module


def test_hf_fp8_experts_run_through_an_fp8_layer(fake: FakeLib) -> None:
    import epfuse.hf as ehf

    experts = fp8_experts()
    ws = ehf.make_workspace(experts, max_tokens=64)
    assert ws.weight_dtype == torch.float8_e4m3fn and fake.kinds("workspace_create")[0][1]["weight_format"] == 1
    layers = ehf.attach(experts, ws)
    _, cfg, p13, ps13, n13, p2, ps2, n2 = fake.kinds("layer_create_fp8")[0]
    assert (p13, p2) == (experts.gate_up_proj.data_ptr(), experts.down_proj.data_ptr())
    assert (ps13, ps2) == (experts.gate_up_proj_scale_inv.data_ptr(), experts.down_proj_scale_inv.data_ptr())
    assert (n13, n2) == (experts.gate_up_proj_scale_inv.numel(), experts.down_proj_scale_inv.numel())
    assert (cfg["weight_format"], cfg["scale_format"], cfg["topk"]) == (1, 0, K)
    assert experts.config._experts_implementation == "epfuse"
    x = torch.randn(5, H).to(torch.bfloat16)
    ids = torch.tensor([[0, 1], [2, 3], [4, 5], [6, 7], [1, 0]])
    y = experts(x, ids, torch.full((5, K), 0.5))  # through FP8ExpertsInterface
    assert torch.equal(y, x) and fake.kinds("forward")[-1][2] == 5
    ehf.detach(experts)
    assert layers[0].closed and experts.config._experts_implementation == "eager"
    ws.close()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"block": (128, 64)}, r"FP8 weight blocks \(128, 64\); epfuse's FP8 layer takes 128x128 blocks"),
        ({"swiglu_limit": 7.0}, r"has its own gating \(_apply_gate\)"),
        ({"intermediate": 192}, r"intermediate size 192, not a multiple of 128: its gate_up_proj scale blocks straddle"),
    ],
)
def test_hf_fp8_experts_epfuse_does_not_compute(fake: FakeLib, change: dict[str, Any], message: str) -> None:
    import epfuse.hf as ehf

    experts = fp8_experts(**change)
    ws = ehf.make_workspace(experts, max_tokens=64)
    with pytest.raises(epfuse.Unsupported, match=message):
        ehf.attach(experts, ws)
    assert fake.kinds("layer_create_fp8") == []
    ws.close()
