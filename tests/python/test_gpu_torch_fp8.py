"""FP8 experts through epfuse.torch on a GPU, world of one rank: e4m3fn codes with 128x128 block scales
(float32 and UE8M0) against the float64 FP8 reference of tests/python/moe_ref.py (x and h quantised
1x128 as the layer does), the format's own error against the bf16 weights reported, and an FP8 and a
bf16 layer taking turns on one workspace. Skipped without a CUDA device."""

from __future__ import annotations

import gc
from typing import Any
from collections.abc import Iterator

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
pytestmark = pytest.mark.usefixtures("cuda")

from moe_ref import (  # noqa: E402 - after the torch check
    dequantize_weights_fp8,
    errors,
    hf_fp8_experts,
    quantize_experts_fp8,
    quantize_x_fp8,
    quantize_rows_1x128,
    quantize_weights_fp8,
    random_inputs,
    random_weights,
    reference,
    within_bounds,
)

# The fused FP8 kernel's sizes: hidden % 256 == 0, intermediate % 128 == 0.
H, I, E, K, MAX_T = 512, 256, 16, 4, 256


@pytest.fixture()
def ws() -> Iterator[Any]:
    import epfuse.torch as et

    with et.Workspace(
        hidden=H, intermediate=I, num_experts=E, topk=K, max_tokens=MAX_T, weight_dtype=torch.float8_e4m3fn
    ) as w:
        yield w
    gc.collect()


def fp8_layer(ws: Any, ue8m0: bool, seed: int = 0) -> tuple[Any, Any, Any, Any, Any]:
    """An FP8 layer of random experts; returns it, the dequantised float64 weights and the bf16 ones."""
    import epfuse.torch as et

    w13, w2 = random_weights(E, H, I, device="cuda", seed=seed)
    c13, s13, c2, s2 = quantize_experts_fp8(w13, w2, ue8m0)
    layer = et.MoELayer(ws, c13, c2, topk=K, w13_scale=s13, w2_scale=s2)
    return layer, dequantize_weights_fp8(c13, s13), dequantize_weights_fp8(c2, s2), w13, w2


@pytest.mark.parametrize("ue8m0", [False, True])
def test_reference_quantisation_is_the_same_on_cuda_and_cpu(ue8m0: bool) -> None:
    """The reference's FP8 rounding (fp8.h's: IEEE float32 scale, reciprocal and product) must not depend
    on the device it runs on: torch's CUDA tensor / scalar is a product with the reciprocal, which moved
    a third of the scales by an ulp and the reference 1-2% away from the layer."""
    x, _, _ = random_inputs(64, H, E, K, device="cpu", seed=11)
    x = (x.float() * torch.logspace(-3, 3, 64).unsqueeze(1)).to(torch.bfloat16)  # scales over 6 decades
    assert torch.equal(quantize_rows_1x128(x.cuda(), ue8m0).cpu(), quantize_rows_1x128(x, ue8m0))
    w13, _ = random_weights(2, H, I, device="cpu", seed=12)
    c_gpu, s_gpu = quantize_weights_fp8(w13.cuda(), ue8m0)
    c_cpu, s_cpu = quantize_weights_fp8(w13, ue8m0)
    assert torch.equal(s_gpu.cpu(), s_cpu)
    assert torch.equal(c_gpu.view(torch.uint8).cpu(), c_cpu.view(torch.uint8))


@pytest.mark.parametrize("tokens", [1, 7, 128, MAX_T])
@pytest.mark.parametrize("scales", ["fp32", "ue8m0"])
def test_fp8_forward_matches_fp8_reference(ws: Any, record: Any, tokens: int, scales: str) -> None:
    ue8m0 = scales == "ue8m0"
    layer, d13, d2, w13, w2 = fp8_layer(ws, ue8m0)
    x, ids, w = random_inputs(tokens, H, E, K, device="cuda", seed=100 + tokens)
    y = layer(x, ids, w)
    layer.check_errors()
    assert y.shape == x.shape and y.dtype == torch.bfloat16
    err = errors(y, reference(x, ids, w, d13, d2, fp8_scales=scales))
    fmt = errors(y, reference(x, ids, w, w13, w2))  # the format's own error, for information
    record(
        check="torch_fp8_forward_vs_fp8_float64",
        shape=[tokens, H, I, E, K],
        scales=scales,
        **err,
        frob_rel_err_vs_bf16=fmt["frob_rel_err"],
        verified=within_bounds(err),
    )
    assert within_bounds(err), f"T={tokens} {scales}: {err}"


@pytest.mark.parametrize("scales", ["fp32", "ue8m0"])
def test_fp8_forward_of_x_quantised_by_the_caller(ws: Any, record: Any, scales: str) -> None:
    """x handed over as e4m3fn codes and 1x128 scales (MoELayer.forward x_scale) gives what the layer
    computes from bf16 x (the same quantisation), against the FP8 float64 reference; other scales give
    another y (the caller's scales are the ones used)."""
    layer, d13, d2, _, _ = fp8_layer(ws, scales == "ue8m0", seed=7)
    x, ids, w = random_inputs(96, H, E, K, device="cuda", seed=8)
    codes, scale = quantize_x_fp8(x, scales == "ue8m0")
    y = layer(codes, ids, w, x_scale=scale)
    err = errors(y, reference(x, ids, w, d13, d2, fp8_scales=scales))
    record(check="torch_fp8_x_fp8_vs_fp8_float64", scales=scales, shape=[96, H, I, E, K], **err,
           verified=within_bounds(err))
    assert within_bounds(err), err
    assert torch.equal(y, layer(x, ids, w)), "caller-quantised x and bf16 x give different y"
    assert not torch.equal(layer(codes, ids, w, x_scale=scale * 2), y), "x_scale is not the one used"


def test_fp8_and_bf16_layers_share_a_workspace(ws: Any, record: Any) -> None:
    import epfuse.torch as et

    fp8, d13, d2, _, _ = fp8_layer(ws, ue8m0=False, seed=1)
    b13, b2 = random_weights(E, H, I, device="cuda", seed=2)
    bf16 = et.MoELayer(ws, b13, b2, topk=K)
    for call in range(4):
        x, ids, w = random_inputs(64, H, E, K, device="cuda", seed=200 + call)
        if call % 2 == 0:
            err = errors(fp8(x, ids, w), reference(x, ids, w, d13, d2, fp8_scales="fp32"))
        else:
            err = errors(bf16(x, ids, w), reference(x, ids, w, b13, b2))
        fp8.check_errors()
        record(check="torch_fp8_and_bf16_alternate", call=call, **err, verified=within_bounds(err))
        assert within_bounds(err), f"call {call}: {err}"


def test_fp8_layer_refused_by_a_bf16_workspace() -> None:
    import epfuse
    import epfuse.torch as et

    with et.Workspace(hidden=H, intermediate=I, num_experts=E, topk=K, max_tokens=MAX_T) as bf16_ws:
        w13, w2 = random_weights(E, H, I, device="cuda", seed=3)
        c13, s13, c2, s2 = quantize_experts_fp8(w13, w2, False)
        with pytest.raises(epfuse.InvalidArgument, match="weight_dtype=torch.float8_e4m3fn"):
            et.MoELayer(bf16_ws, c13, c2, topk=K, w13_scale=s13, w2_scale=s2)


def test_bad_scale_values_are_named_by_the_library(ws: Any) -> None:
    import epfuse
    import epfuse.torch as et

    w13, w2 = random_weights(E, H, I, device="cuda", seed=4)
    c13, s13, c2, s2 = quantize_experts_fp8(w13, w2, False)
    s2 = s2.clone()
    s2[3, 1, 0] = float("nan")
    with pytest.raises(epfuse.InvalidArgument, match="scale"):
        et.MoELayer(ws, c13, c2, topk=K, w13_scale=s13, w2_scale=s2)


def test_hf_fp8_experts_module_matches_fp8_reference(record: Any) -> None:
    """transformers' FP8Experts (as its fine-grained FP8 quantizer installs it) through epfuse.hf:
    the module's own codes and float32 block scales, against the FP8 float64 reference."""
    import epfuse.hf as ehf

    module = hf_fp8_experts(H, I, E, K).to("cuda")
    w13, w2 = random_weights(E, H, I, device="cuda", seed=5)
    c13, s13, c2, s2 = quantize_experts_fp8(w13, w2, False)
    with torch.no_grad():
        module.gate_up_proj.copy_(c13)
        module.gate_up_proj_scale_inv.copy_(s13)
        module.down_proj.copy_(c2)
        module.down_proj_scale_inv.copy_(s2)
    ws = ehf.make_workspace(module, max_tokens=MAX_T)
    try:
        ehf.attach(module, ws)
        x, ids, w = random_inputs(128, H, E, K, device="cuda", seed=6)
        y = module(x, ids, w)
        err = errors(y, reference(x, ids, w, dequantize_weights_fp8(c13, s13), dequantize_weights_fp8(c2, s2),
                                  fp8_scales="fp32"))
        record(check="hf_fp8_experts_vs_fp8_float64", shape=[128, H, I, E, K], **err, verified=within_bounds(err))
        assert within_bounds(err), err
        ehf.detach(module)
    finally:
        ws.close()
