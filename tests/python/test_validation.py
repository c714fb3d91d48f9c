"""Argument validation of epfuse.torch on CPU tensors (no GPU, no library): every message names the
tensor and says what is accepted. Skipped when torch is not installed."""

from __future__ import annotations

from typing import Any

import pytest

import epfuse

torch = pytest.importorskip("torch", reason="torch is not installed: epfuse.torch's validation is not tested")
et = pytest.importorskip("epfuse.torch")

H, I, E_LOCAL, K, T = 256, 128, 4, 2, 8
CUDA0 = torch.device("cuda", 0)


def inputs(t: int = T, h: int = H, k: int = K) -> tuple[Any, Any, Any]:
    x = torch.zeros(t, h, dtype=torch.bfloat16)
    ids = torch.zeros(t, k, dtype=torch.int64)
    w = torch.zeros(t, k, dtype=torch.float32)
    return x, ids, w


def check(x: Any, ids: Any, w: Any, **kw: Any) -> int:
    args: dict[str, Any] = {"hidden": H, "topk": K, "max_tokens": 64}
    args.update(kw)
    return et.check_forward_args(x, ids, w, **args)


def test_valid_inputs_pass() -> None:
    assert check(*inputs()) == T
    x, ids, w = inputs()
    assert check(x, ids.to(torch.int32), w.to(torch.bfloat16)) == T
    assert check(*inputs(t=0)) == 0  # a rank may have no tokens
    assert check(*inputs(t=64)) == 64


@pytest.mark.parametrize(
    ("which", "dtype", "message"),
    [
        ("x", torch.float32, "x must be torch.bfloat16, got torch.float32"),
        ("x", torch.float16, "x must be torch.bfloat16, got torch.float16"),
        ("ids", torch.int16, "topk_ids must be torch.int32 or torch.int64 (converted to int32), got torch.int16"),
        ("ids", torch.float32, "topk_ids must be torch.int32 or torch.int64"),
        (
            "w",
            torch.float64,
            "topk_weights must be torch.float32 (torch.bfloat16 and torch.float16 are accepted and converted), "
            "got torch.float64",
        ),
    ],
)
def test_dtype_messages(which: str, dtype: Any, message: str) -> None:
    x, ids, w = inputs()
    x, ids, w = {"x": (x.to(dtype), ids, w), "ids": (x, ids.to(dtype), w), "w": (x, ids, w.to(dtype))}[which]
    with pytest.raises(epfuse.InvalidArgument) as info:
        check(x, ids, w)
    assert message in str(info.value)
    assert info.value.code == 2


@pytest.mark.parametrize("which", ["x", "topk_ids", "topk_weights"])
def test_device_message(which: str) -> None:
    # One CPU tensor against a layer on cuda:0; the others are fake tensors that say they are on
    # cuda:0 (FakeTensorMode needs no GPU), so the message is about the CPU one.
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, ids, w = inputs()
    with FakeTensorMode(allow_non_fake_inputs=True):
        if which != "x":
            x = torch.empty(T, H, dtype=torch.bfloat16, device=CUDA0)
        if which != "topk_ids":
            ids = torch.empty(T, K, dtype=torch.int64, device=CUDA0)
        if which != "topk_weights":
            w = torch.empty(T, K, dtype=torch.float32, device=CUDA0)
    with pytest.raises(epfuse.InvalidArgument) as info:
        check(x, ids, w, device=CUDA0)
    msg = str(info.value)
    assert f"{which} must be on cuda:0 (the workspace's device), got a tensor on" in msg
    assert "move it with .to('cuda:0')" in msg


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("x_3d", "x must be 2-D [tokens, hidden=256], got shape (2, 4, 256): flatten leading dims with .view(-1, 256)"),
        ("x_hidden", "x must be [tokens, hidden=256], got shape (8, 128)"),
        ("ids_tokens", "topk_ids must be [tokens=8, topk=2] (tokens from x), got shape (7, 2)"),
        ("ids_k", "topk_ids must be [tokens=8, topk=2] (tokens from x), got shape (8, 3)"),
        ("w_shape", "topk_weights must be [tokens=8, topk=2] (tokens from x), got shape (8,)"),
    ],
)
def test_shape_messages(case: str, message: str) -> None:
    x, ids, w = inputs()
    if case == "x_3d":
        x = torch.zeros(2, 4, H, dtype=torch.bfloat16)
    elif case == "x_hidden":
        x = torch.zeros(T, 128, dtype=torch.bfloat16)
    elif case == "ids_tokens":
        ids = torch.zeros(T - 1, K, dtype=torch.int64)
    elif case == "ids_k":
        ids = torch.zeros(T, K + 1, dtype=torch.int64)
    elif case == "w_shape":
        w = torch.zeros(T, dtype=torch.float32)
    with pytest.raises(epfuse.InvalidArgument) as info:
        check(x, ids, w)
    assert message in str(info.value)


@pytest.mark.parametrize("which", ["x", "topk_ids", "topk_weights"])
def test_contiguity_message(which: str) -> None:
    x, ids, w = inputs()
    if which == "x":
        x = torch.zeros(H, T, dtype=torch.bfloat16).t()
    elif which == "topk_ids":
        ids = torch.zeros(K, T, dtype=torch.int64).t()
    else:
        w = torch.zeros(K, T, dtype=torch.float32).t()
    with pytest.raises(epfuse.InvalidArgument) as info:
        check(x, ids, w)
    msg = str(info.value)
    assert msg.startswith(f"[EPFUSE_ERR_INVALID_ARGUMENT] {which} must be row-major contiguous, got strides")
    assert msg.endswith("call .contiguous()")


def test_alignment_messages() -> None:
    x, ids, w = inputs()
    # A contiguous view 2 bytes into a bf16 buffer: contiguous, not 16-byte aligned.
    base = torch.zeros(T * H + 8, dtype=torch.bfloat16)
    x_off = base[1 : 1 + T * H].view(T, H)
    assert x_off.is_contiguous() and x_off.data_ptr() % 16 == 2
    with pytest.raises(epfuse.InvalidArgument, match=r"x must start at a 16-byte aligned address.*call \.clone\(\)"):
        check(x_off, ids, w)
    ids32 = torch.zeros(T * K + 4, dtype=torch.int32)[1 : 1 + T * K].view(T, K)
    with pytest.raises(epfuse.InvalidArgument, match="topk_ids must start at a 16-byte aligned address"):
        check(x, ids32, w)
    wf = torch.zeros(T * K + 4, dtype=torch.float32)[1 : 1 + T * K].view(T, K)
    with pytest.raises(epfuse.InvalidArgument, match="topk_weights must start at a 16-byte aligned address"):
        check(x, ids, wf)
    # int64 ids and bf16 weights are converted into fresh (aligned) tensors: no complaint.
    ids64 = torch.zeros(T * K + 4, dtype=torch.int64)[1 : 1 + T * K].view(T, K)
    assert check(x, ids64, wf.to(torch.bfloat16)) == T


def test_max_tokens_message() -> None:
    with pytest.raises(epfuse.InvalidArgument) as info:
        check(*inputs(t=65))
    assert "x has 65 tokens, more than max_tokens=64 the layer was created with" in str(info.value)


def test_not_a_tensor() -> None:
    x, ids, w = inputs()
    with pytest.raises(epfuse.InvalidArgument, match="topk_ids must be a torch.Tensor, got list"):
        check(x, [[0, 1]] * T, w)


def weights(e: int = E_LOCAL, h: int = H, i: int = I, dtype: Any = torch.bfloat16) -> tuple[Any, Any]:
    return torch.zeros(e, 2 * i, h, dtype=dtype), torch.zeros(e, h, i, dtype=dtype)


def test_weights_valid() -> None:
    assert et.check_weights(*weights()) == (E_LOCAL, H, I)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("dtype", "w13 must be torch.bfloat16, got torch.float32: convert the weights once with .to(torch.bfloat16)"),
        ("w13_2d", "w13 must be 3-D [experts_per_rank, 2*intermediate, hidden], got shape (256, 256)"),
        ("w2_2d", "w2 must be 3-D [experts_per_rank, hidden, intermediate], got shape (256, 128)"),
        ("odd", "w13 must be [experts_per_rank, 2*intermediate, hidden]: its dim 1 (255) is odd"),
        (
            "w2_shape",
            "w2 must be [experts_per_rank=4, hidden=256, intermediate=128] to match w13 (4, 256, 256), got (4, 128, 256)",
        ),
        (
            "experts",
            "w2 must be [experts_per_rank=4, hidden=256, intermediate=128] to match w13 (4, 256, 256), got (3, 256, 128)",
        ),
        ("contig", "w2 must be row-major contiguous"),
        ("device", "w13 must be on cuda:0 (the workspace's device), got a tensor on cpu"),
    ],
)
def test_weight_messages(case: str, message: str) -> None:
    w13, w2 = weights()
    device = None
    if case == "dtype":
        w13 = w13.float()
    elif case == "w13_2d":
        w13 = w13[0]
    elif case == "w2_2d":
        w2 = w2[0]
    elif case == "odd":
        w13 = torch.zeros(E_LOCAL, 255, H, dtype=torch.bfloat16)
    elif case == "w2_shape":
        w2 = w2.transpose(1, 2).contiguous()
    elif case == "experts":
        w2 = w2[:3]
    elif case == "contig":
        w2 = torch.zeros(E_LOCAL, I, H, dtype=torch.bfloat16).transpose(1, 2)
    elif case == "device":
        device = CUDA0
    with pytest.raises(epfuse.InvalidArgument) as info:
        et.check_weights(w13, w2, device=device)
    assert message in str(info.value)


# FP8 experts with their block scales, H = 384 and I = 192 so that both end in a partial block of 128.
H8, I8 = 384, 192


def fp8_weights(scale_dtype: Any = torch.float32) -> tuple[Any, Any, Any, Any]:
    w13 = torch.zeros(E_LOCAL, 2 * I8, H8, dtype=torch.float8_e4m3fn)
    w2 = torch.zeros(E_LOCAL, H8, I8, dtype=torch.float8_e4m3fn)
    return w13, w2, torch.ones(E_LOCAL, 4, 3, dtype=scale_dtype), torch.ones(E_LOCAL, 3, 2, dtype=scale_dtype)


@pytest.mark.parametrize(
    ("scale_dtype", "scale_format"),
    [(torch.float32, 0), (torch.uint8, 1), (torch.float8_e8m0fnu, 1)],
)
def test_fp8_weights_valid(scale_dtype: Any, scale_format: int) -> None:
    assert et.check_fp8_weights(*fp8_weights(scale_dtype)) == (E_LOCAL, H8, I8, scale_format)


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("codes_bf16", "w13 must be torch.float8_e4m3fn, got torch.bfloat16: FP8 experts are e4m3fn codes with block scales"),
        ("codes_e5m2", "w2 must be torch.float8_e4m3fn, got torch.float8_e5m2"),
        ("scale_none", "w13_scale must be a torch.Tensor, got NoneType"),
        ("scale_bf16", "w2_scale must be torch.float32, torch.float8_e8m0fnu or torch.uint8 (UE8M0 exponents), got torch.bfloat16"),
        ("scale_mixed", "w13_scale and w2_scale must have one dtype, got torch.float32 and torch.uint8"),
        (
            "w13_scale_shape",
            "w13_scale must be [4, 4, 3] (one scale per 128x128 block of hidden=384, intermediate=192, gate and up "
            "blocked apart), got [4, 2, 3]",
        ),
        ("w2_scale_transposed", "w2_scale must be [4, 3, 2]"),
        ("scale_contig", "w13_scale must be row-major contiguous"),
        ("device", "w13 must be on cuda:0"),
    ],
)
def test_fp8_weight_messages(case: str, message: str) -> None:
    w13, w2, s13, s2 = fp8_weights()
    device = None
    if case == "codes_bf16":
        w13 = torch.zeros(E_LOCAL, 2 * I8, H8, dtype=torch.bfloat16)
    elif case == "codes_e5m2":
        w2 = w2.to(torch.float8_e5m2)
    elif case == "scale_none":
        s13 = None
    elif case == "scale_bf16":
        s2 = s2.to(torch.bfloat16)
    elif case == "scale_mixed":
        s2 = s2.to(torch.uint8)
    elif case == "w13_scale_shape":
        s13 = torch.ones(E_LOCAL, 2, 3)  # one block row per half: the gate and up halves not blocked apart
    elif case == "w2_scale_transposed":
        s2 = torch.ones(E_LOCAL, 2, 3)
    elif case == "scale_contig":
        s13 = torch.ones(E_LOCAL, 3, 4).transpose(1, 2)
    elif case == "device":
        device = CUDA0
    with pytest.raises(epfuse.InvalidArgument) as info:
        et.check_fp8_weights(w13, w2, s13, s2, device=device)
    assert message in str(info.value)


class _OpenWorkspace(et.Workspace):
    """Passes MoELayer's workspace checks (an open epfuse.torch.Workspace) without a GPU or the library;
    anything the layer would read from it after its argument checks is missing (AttributeError)."""

    def __init__(self) -> None:
        self._closed = False

    def __del__(self) -> None:
        pass


@pytest.mark.parametrize("which", ["w13_scale", "w2_scale"])
def test_scales_only_with_fp8_experts(which: str) -> None:
    # bf16 experts with a scale: refused by the scales check, past the workspace's (a valid one here).
    w13, w2 = weights()
    with pytest.raises(epfuse.InvalidArgument) as info:
        et.MoELayer(_OpenWorkspace(), w13, w2, topk=K, **{which: torch.ones(1)})
    assert "w13_scale and w2_scale are for FP8 experts (torch.float8_e4m3fn); these are not" in str(info.value)


def test_workspace_without_cuda_is_a_clear_error() -> None:
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(epfuse.CudaError, match=r"needs a CUDA device: torch.cuda.is_available\(\) is False"):
        et.Workspace(hidden=H, intermediate=I, num_experts=8, topk=K, max_tokens=16)


def test_layer_needs_a_workspace() -> None:
    w13, w2 = weights()
    with pytest.raises(epfuse.InvalidArgument, match="workspace must be an epfuse.torch.Workspace, got str"):
        et.MoELayer("ws", w13, w2, topk=K)


def test_op_with_unknown_layer_id() -> None:
    x, ids, w = inputs()
    w13, w2 = weights()
    with pytest.raises(epfuse.InvalidArgument, match="no open MoELayer with layer_id 987654"):
        torch.ops.epfuse.moe_forward(x, ids, w, w13, w2, 987654)


def test_op_fake_traces_without_a_gpu() -> None:
    # The fake implementation is what torch.compile traces with: a graph with the op and y like x.
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x: Any, ids: Any, w: Any, w13: Any, w2: Any) -> Any:
        return torch.ops.epfuse.moe_forward(x * 2, ids, w, w13, w2, 5) + 1

    w13, w2 = weights()
    gm = make_fx(f, tracing_mode="fake")(*inputs(), w13, w2)
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert torch.ops.epfuse.moe_forward.default in targets
    meta = torch.ops.epfuse.moe_forward(*(t.to("meta") for t in inputs()), w13.to("meta"), w2.to("meta"), 5)
    assert meta.shape == (T, H) and meta.dtype == torch.bfloat16 and meta.is_contiguous()


def test_op_schema() -> None:
    schema = str(torch.ops.epfuse.moe_forward.default._schema)
    assert schema.startswith(
        "epfuse::moe_forward(Tensor x, Tensor topk_ids, Tensor topk_weights, Tensor w13, Tensor w2, SymInt layer_id, "
        "Tensor? x_scale=None) -> Tensor"
    )


# --- values checked before the call (int64 ids before narrowing, caller's x scales, y aliasing) ---


def test_int64_ids_in_range_are_narrowed() -> None:
    ids = torch.tensor([[0, 7], [-1, 3]], dtype=torch.int64)
    out = et.narrow_topk_ids(ids, 8)
    assert out.dtype == torch.int32 and out.tolist() == ids.tolist()
    ids32 = ids.to(torch.int32)
    assert et.narrow_topk_ids(ids32, 8) is ids32  # int32: as given (the device checks them)
    assert et.narrow_topk_ids(torch.zeros(0, K, dtype=torch.int64), 8).dtype == torch.int32


@pytest.mark.parametrize(
    ("value", "where"),
    [(8, "[1][0]"), (-2, "[1][0]"), (2**32 + 3, "[1][0]"), (-(2**32) + 1, "[1][0]")],
)
def test_int64_ids_out_of_range_are_refused_before_narrowing(value: int, where: str) -> None:
    # 2**32 + 3 would narrow to 3, a valid expert: the check must come before the cast.
    ids = torch.tensor([[0, 7], [value, 3], [9, 9]], dtype=torch.int64)
    with pytest.raises(ValueError) as info:
        et.narrow_topk_ids(ids, 8)
    assert isinstance(info.value, epfuse.InvalidArgument)
    assert (
        f"topk_ids{where} = {value} is not a valid expert id (-1 or [0, 8)): checked before narrowing "
        "torch.int64 to torch.int32" in str(info.value)
    )


def test_x_scale_values() -> None:
    et.check_x_scale_values(torch.full((3, 2), 0.5))
    et.check_x_scale_values(torch.zeros(0, 2))
    for bad, shown in ((0.0, "0.0"), (-1.0, "-1.0"), (float("nan"), "nan"), (float("inf"), "inf")):
        s = torch.ones(3, 2)
        s[2, 1] = bad
        with pytest.raises(ValueError) as info:
            et.check_x_scale_values(s)
        assert isinstance(info.value, epfuse.InvalidArgument)
        assert (
            f"x_scale[2][1] = {shown}: every scale of x quantised by the caller must be finite and > 0 (1 of 6 are not)"
            in str(info.value)
        )


def test_y_aliasing_an_input_is_refused() -> None:
    x, ids, w = inputs()
    ids = ids.to(torch.int32)
    y = torch.empty_like(x)
    et.check_not_aliased(y, {"x": x, "topk_ids": ids, "topk_weights": w, "x_scale": None})
    for name, y_alias in (("x", x), ("x", x[2:].view(-1, H)), ("topk_ids", ids.view(torch.bfloat16))):
        with pytest.raises(epfuse.InvalidArgument, match=f"y overlaps {name}: the output must not alias an input"):
            et.check_not_aliased(y_alias, {"x": x, "topk_ids": ids, "topk_weights": w})
    # Adjacent, not overlapping: the second half of one buffer after the first.
    buf = torch.zeros(2 * T * H, dtype=torch.bfloat16)
    et.check_not_aliased(buf[T * H :].view(T, H), {"x": buf[: T * H].view(T, H)})
