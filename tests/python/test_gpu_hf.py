"""HF transformers MoE blocks (Qwen3-MoE, Mixtral, DeepSeek-V3) built from configs in code with random
bf16 weights: the block through epfuse (epfuse.hf.attach, the model's own router) against the same
block through transformers' own experts implementation, and both against the float64 reference.
World of one rank. Skipped without a CUDA device or transformers."""

from __future__ import annotations

from typing import Any, Callable

import pytest

import epfuse

torch = pytest.importorskip("torch", reason="torch is not installed")
transformers = pytest.importorskip("transformers", reason="transformers is not installed")
pytestmark = pytest.mark.usefixtures("cuda")

from moe_ref import FROB_BOUND, errors, reference  # noqa: E402 - after the torch check

TOKENS = 192  # batch 2 x sequence 96


def qwen3(hidden: int, inter: int, experts: int, topk: int) -> tuple[Any, Callable[[Any], Any]]:
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    cfg = transformers.Qwen3MoeConfig(
        hidden_size=hidden,
        moe_intermediate_size=inter,
        num_experts=experts,
        num_experts_per_tok=topk,
        norm_topk_prob=True,
    )
    block = Qwen3MoeSparseMoeBlock(cfg)
    return block, lambda x: block.gate(x.view(-1, hidden))


def mixtral(hidden: int, inter: int, experts: int, topk: int) -> tuple[Any, Callable[[Any], Any]]:
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    cfg = transformers.MixtralConfig(
        hidden_size=hidden, intermediate_size=inter, num_local_experts=experts, num_experts_per_tok=topk
    )
    block = MixtralSparseMoeBlock(cfg)
    return block, lambda x: block.gate(x.view(-1, hidden))


def deepseek_v3(hidden: int, inter: int, experts: int, topk: int) -> tuple[Any, Callable[[Any], Any]]:
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    cfg = transformers.DeepseekV3Config(
        hidden_size=hidden,
        moe_intermediate_size=inter,
        n_routed_experts=experts,
        num_experts_per_tok=topk,
        n_group=4,
        topk_group=2,
        n_shared_experts=1,
    )
    block = DeepseekV3MoE(cfg)
    return block, lambda x: block.gate(x.view(-1, hidden))


CASES = [
    ("qwen3_moe", qwen3, (256, 256, 16, 4)),
    ("qwen3_moe", qwen3, (512, 128, 8, 2)),
    ("mixtral", mixtral, (256, 256, 8, 2)),
    ("mixtral", mixtral, (384, 256, 16, 4)),
    ("deepseek_v3", deepseek_v3, (256, 256, 16, 4)),
]


def randomize(block: Any, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _name, p in block.named_parameters():
            fan_in = p.shape[-1]
            p.copy_((torch.randn(p.shape, generator=g) / fan_in**0.5).to(p.dtype))
        bias = getattr(getattr(block, "gate", None), "e_score_correction_bias", None)
        if bias is not None:
            bias.copy_(torch.randn(bias.shape, generator=g) * 0.01)


@pytest.mark.parametrize(("model", "make", "shape"), CASES, ids=[f"{c[0]}-{'x'.join(map(str, c[2]))}" for c in CASES])
@pytest.mark.parametrize("through", ["interface", "patch"])
def test_hf_block_through_epfuse(
    record: Any, model: str, make: Any, shape: tuple[int, int, int, int], through: str
) -> None:
    import epfuse.hf as ehf

    hidden, inter, experts, topk = shape
    block, route = make(*shape)
    randomize(block, seed=sum(shape))
    block = block.to("cuda", torch.bfloat16).eval()
    g = torch.Generator().manual_seed(11)
    x = torch.randn(2, TOKENS // 2, hidden, generator=g).to("cuda", torch.bfloat16)

    block.experts.config._experts_implementation = "eager"
    with torch.no_grad():
        y_hf = block(x)
        _, top_w, top_i = route(x)
        shared = block.shared_experts(x) if hasattr(block, "shared_experts") else 0
    ws = ehf.make_workspace(block, max_tokens=TOKENS)
    try:
        layers = ehf.attach(block, ws, use_interface=(through == "interface"))
        assert len(layers) == 1
        if through == "interface":
            assert block.experts.config._experts_implementation == ehf.IMPLEMENTATION
        with torch.no_grad():
            y_ep = block(x)
        layers[0].check_errors()
        ehf.detach(block)
        assert block.experts.config._experts_implementation == "eager"
        with torch.no_grad():
            y_again = block(x)  # transformers' own implementation again after detach
        torch.testing.assert_close(y_again, y_hf, rtol=0, atol=0)
    finally:
        ws.close()

    experts = block.experts
    ref = reference(x.view(-1, hidden), top_i, top_w.float(), experts.gate_up_proj, experts.down_proj)
    ref = ref.view(x.shape) + (shared.double() if isinstance(shared, torch.Tensor) else 0)
    vs_hf = errors(y_ep.view(-1, hidden), y_hf.view(-1, hidden).double())
    ep_vs_ref = errors(y_ep.view(-1, hidden), ref.view(-1, hidden))
    hf_vs_ref = errors(y_hf.view(-1, hidden), ref.view(-1, hidden))
    verified = vs_hf["nan"] == 0 and vs_hf["frob_rel_err"] < FROB_BOUND and ep_vs_ref["frob_rel_err"] < FROB_BOUND
    record(
        check="hf_block_vs_transformers",
        model=model,
        through=through,
        shape={
            "tokens": TOKENS,
            "hidden": hidden,
            "intermediate": inter,
            "experts": experts.gate_up_proj.shape[0],
            "topk": topk,
        },
        hf_implementation="eager",
        max_abs_err=vs_hf["max_abs_err"],
        max_rel_err=vs_hf["max_rel_err"],
        frob_rel_err=vs_hf["frob_rel_err"],
        epfuse_vs_float64_frob=ep_vs_ref["frob_rel_err"],
        transformers_vs_float64_frob=hf_vs_ref["frob_rel_err"],
        verified=verified,
    )
    assert vs_hf["nan"] == 0
    assert ep_vs_ref["frob_rel_err"] < FROB_BOUND, ep_vs_ref
    assert vs_hf["frob_rel_err"] < FROB_BOUND, vs_hf


def test_attach_twice_is_refused() -> None:
    import epfuse.hf as ehf

    block, _ = qwen3(256, 256, 8, 2)
    block = block.to("cuda", torch.bfloat16)
    ws = ehf.make_workspace(block, max_tokens=16)
    try:
        ehf.attach(block, ws)
        with pytest.raises(epfuse.InvalidArgument, match="attached already"):
            ehf.attach(block, ws)
    finally:
        ehf.detach(block)
        ws.close()


def test_fp32_model_is_refused() -> None:
    import epfuse.hf as ehf

    block, _ = qwen3(256, 256, 8, 2)
    block = block.to("cuda")
    with pytest.raises(epfuse.InvalidArgument, match="w13 must be torch.bfloat16"):
        ws = ehf.make_workspace(block, max_tokens=16)
        try:
            ehf.attach(block, ws)
        finally:
            ws.close()
