"""epfuse.hf without a GPU: which transformers experts modules it takes, and the layout assumption
(gate rows, then up rows) checked against transformers' own experts forward on CPU in float32.
Skipped when torch or transformers is not installed."""

from __future__ import annotations

from typing import Any

import pytest

import epfuse

torch = pytest.importorskip("torch", reason="torch is not installed: epfuse.hf is not tested")
transformers = pytest.importorskip("transformers", reason="transformers is not installed: epfuse.hf is not tested")
hf = pytest.importorskip("epfuse.hf")

from moe_ref import random_inputs, reference  # noqa: E402

H, I, E, K = 64, 32, 8, 2


def qwen3_block() -> Any:
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    cfg = transformers.Qwen3MoeConfig(
        hidden_size=H, moe_intermediate_size=I, num_experts=E, num_experts_per_tok=K, norm_topk_prob=True
    )
    return Qwen3MoeSparseMoeBlock(cfg)


def mixtral_block() -> Any:
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    cfg = transformers.MixtralConfig(hidden_size=H, intermediate_size=I, num_local_experts=E, num_experts_per_tok=K)
    return MixtralSparseMoeBlock(cfg)


def dsv3_block() -> Any:
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3MoE

    cfg = transformers.DeepseekV3Config(
        hidden_size=H,
        moe_intermediate_size=I,
        n_routed_experts=E,
        num_experts_per_tok=K,
        n_group=2,
        topk_group=1,
        n_shared_experts=1,
    )
    return DeepseekV3MoE(cfg)


BLOCKS = {"qwen3_moe": qwen3_block, "mixtral": mixtral_block, "deepseek_v3": dsv3_block}


def test_register_adds_epfuse_to_the_experts_interface() -> None:
    from transformers.integrations.moe import ALL_EXPERTS_FUNCTIONS

    assert hf.register() is True
    assert hf.IMPLEMENTATION in ALL_EXPERTS_FUNCTIONS
    assert ALL_EXPERTS_FUNCTIONS[hf.IMPLEMENTATION] is hf.experts_forward


@pytest.mark.parametrize("model", sorted(BLOCKS))
def test_experts_modules_found_and_supported(model: str) -> None:
    block = BLOCKS[model]()
    found = hf.experts_modules(block)
    assert [name for name, _ in found] == ["experts"]
    module = found[0][1]
    assert tuple(module.gate_up_proj.shape) == (E, 2 * I, H)
    assert tuple(module.down_proj.shape) == (E, H, I)
    hf._check_supported("experts", module)  # raises if epfuse cannot compute it
    assert hf._topk_of(module, block) == K
    # Decorated with @use_experts_implementation: attach() goes through the ExpertsInterface.
    assert hasattr(module, "config") and hasattr(type(module), "_apply_gate")


@pytest.mark.parametrize("model", sorted(BLOCKS))
def test_hf_layout_is_gate_then_up(model: str) -> None:
    """transformers' eager experts forward equals the reference that reads w13 rows [0, I) as gate and
    [I, 2I) as up: the weights go to epfuse as they are."""
    block = BLOCKS[model]().float()
    experts = block.experts
    experts.config._experts_implementation = "eager"
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        experts.gate_up_proj.copy_(torch.randn(E, 2 * I, H, generator=g) / H**0.5)
        experts.down_proj.copy_(torch.randn(E, H, I, generator=g) / I**0.5)
    x, ids, w = random_inputs(16, H, E, K, device="cpu", seed=2, id_dtype=torch.int64)
    with torch.no_grad():
        y = experts(x.float(), ids, w)
    ref = reference(x.float(), ids, w, experts.gate_up_proj.detach(), experts.down_proj.detach())
    torch.testing.assert_close(y.double(), ref, rtol=1e-4, atol=1e-5)
    # The swapped reading (up rows first) is far off: the check can tell the two apart.
    swapped = torch.cat([experts.gate_up_proj[:, I:], experts.gate_up_proj[:, :I]], dim=1).detach()
    assert (reference(x.float(), ids, w, swapped, experts.down_proj.detach()) - ref).abs().max() > 1e-2


def test_unsupported_experts_are_refused() -> None:
    block = qwen3_block()
    experts = block.experts
    experts.is_transposed = True
    with pytest.raises(epfuse.Unsupported, match=r"stores transposed weights"):
        hf._check_supported("experts", experts)
    experts.is_transposed = False
    experts.is_concatenated = False
    with pytest.raises(epfuse.Unsupported, match="interleaves gate and up rows"):
        hf._check_supported("experts", experts)
    experts.is_concatenated = True
    experts.act_fn = torch.nn.GELU()
    with pytest.raises(epfuse.Unsupported, match="uses activation GELU"):
        hf._check_supported("experts", experts)


def test_gpt_oss_experts_are_refused() -> None:
    try:
        from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts
    except ImportError:
        pytest.skip("this transformers has no gpt_oss")
    cfg = transformers.GptOssConfig(hidden_size=H, intermediate_size=I, num_local_experts=E, num_experts_per_tok=K)
    with pytest.raises(epfuse.Unsupported):
        hf._check_supported("experts", GptOssExperts(cfg))


def test_experts_forward_without_attach_is_a_clear_error() -> None:
    block = qwen3_block().to(torch.bfloat16)
    hf.register()
    block.experts.config._experts_implementation = hf.IMPLEMENTATION
    x = torch.zeros(2, 3, H, dtype=torch.bfloat16)
    with pytest.raises(epfuse.InvalidArgument, match=r"has no epfuse layer: call epfuse.hf.attach\(model, workspace\)"):
        block(x)


def test_make_workspace_without_experts() -> None:
    with pytest.raises(epfuse.InvalidArgument, match="Linear has no experts module"):
        hf.make_workspace(torch.nn.Linear(4, 4), max_tokens=16)
