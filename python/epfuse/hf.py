"""HF transformers MoE blocks through epfuse, with the model's own router.

transformers 5.x keeps the experts of an MoE block (Qwen3MoeExperts, MixtralExperts, DeepseekV3Experts,
...) as one module with gate_up_proj [E, 2I, H] (gate rows, then up rows: `chunk(2, dim=-1)` of
its output is (gate, up)) and down_proj [E, H, I], called as
`experts(hidden_states [T, H], top_k_index [T, k], top_k_weights [T, k])` by the block after its
router. Classes decorated with `@use_experts_implementation` (transformers/integrations/moe.py) look
up their forward in `ExpertsInterface` by `config._experts_implementation`; register() adds "epfuse"
there. That layout is epfuse's (w13 rows [0, I) gate, [I, 2I) up; w2 [E, H, I]), so the weights are
used as they are: no copy, this rank's experts are a view of the first dimension.

    ws = epfuse.hf.make_workspace(model, max_tokens=4096)      # collective
    epfuse.hf.attach(model, ws)                               # one MoELayer per experts module
    model(...)                                                # the blocks' experts now run in epfuse
    epfuse.hf.detach(model); ws.close()

FP8 checkpoints (a model loaded with transformers' fine-grained FP8 quantization, weight_block_size
[128, 128]): their experts modules (FP8Experts) hold gate_up_proj [E, 2I, H] and down_proj [E, H, I]
float8_e4m3fn with gate_up_proj_scale_inv [E, 2I/128, H/128] and down_proj_scale_inv [E, H/128, I/128]
(float32 or UE8M0), the layout of epfuse's FP8 layer; make_workspace then makes an FP8 workspace and
attach an FP8 MoELayer per module. Their implementations live in transformers' FP8ExpertsInterface,
where register() adds "epfuse" too.
"""

from __future__ import annotations

import types
from typing import Any
from collections.abc import Iterator

import torch

from .errors import InvalidArgument, Unsupported
from .torch import MoELayer, Workspace

__all__ = [
    "IMPLEMENTATION",
    "register",
    "experts_modules",
    "make_workspace",
    "attach",
    "patch_moe_blocks",
    "detach",
    "experts_forward",
]

# The name under which register() adds epfuse to transformers' ExpertsInterface.
IMPLEMENTATION = "epfuse"

_LAYER_ATTR = "_epfuse_layer"
_SAVED_FORWARD_ATTR = "_epfuse_saved_forward"


def _experts_interface() -> Any:
    try:
        from transformers.integrations.moe import ExpertsInterface
    except ImportError:
        return None
    return ExpertsInterface


def _fp8_experts() -> tuple[Any, Any]:
    """transformers' FP8Experts class and FP8ExpertsInterface, or (None, None) where it has none."""
    try:
        from transformers.integrations.finegrained_fp8 import FP8Experts, FP8ExpertsInterface
    except ImportError:
        return None, None
    return FP8Experts, FP8ExpertsInterface


def register() -> bool:
    """Adds "epfuse" to transformers' ExpertsInterface (transformers.integrations.moe), and to its
    FP8ExpertsInterface where it has one. Returns False where this transformers has no
    ExpertsInterface (then use patch_moe_blocks)."""
    interface = _experts_interface()
    if interface is None or not hasattr(interface, "register"):
        return False
    interface.register(IMPLEMENTATION, experts_forward)
    fp8_interface = _fp8_experts()[1]
    if fp8_interface is not None:
        fp8_interface.register(IMPLEMENTATION, experts_forward)
    return True


def experts_forward(
    self: torch.nn.Module, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor
) -> torch.Tensor:
    """The experts forward that ExpertsInterface (or a patched module) calls: the module's MoELayer
    on the router's output, as the router computed it (normalised or not, scaled or not)."""
    layer: MoELayer | None = getattr(self, _LAYER_ATTR, None)
    if layer is None:
        raise InvalidArgument(
            f"{type(self).__name__} has no epfuse layer: call epfuse.hf.attach(model, workspace) first "
            f"(config._experts_implementation is {IMPLEMENTATION!r})"
        )
    x = hidden_states
    if x.dtype != torch.bfloat16:
        raise InvalidArgument(f"hidden_states must be torch.bfloat16 for epfuse, got {x.dtype}: load the model in bf16")
    tokens = x.shape[0]
    if top_k_weights.shape != top_k_index.shape and top_k_weights.shape == (tokens, layer.num_experts):
        # Routers that return dense [T, E] scores (DeepseekV2 style): the weights of the chosen experts.
        top_k_weights = top_k_weights.gather(1, top_k_index)
    return layer.forward(x.contiguous(), top_k_index.contiguous(), top_k_weights.contiguous())


def _is_experts_module(module: torch.nn.Module) -> bool:
    w13 = getattr(module, "gate_up_proj", None)
    w2 = getattr(module, "down_proj", None)
    return isinstance(w13, torch.Tensor) and isinstance(w2, torch.Tensor) and w13.dim() == 3 and w2.dim() == 3


def experts_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """(name, module) of every experts module in `model` (or `model` itself if it is one): modules
    holding 3-D gate_up_proj and down_proj."""
    return [(name, m) for name, m in model.named_modules() if _is_experts_module(m)]


def _module_config(module: torch.nn.Module, model: torch.nn.Module) -> Any:
    config = getattr(module, "config", None)
    if config is None:
        config = getattr(model, "config", None)
        if config is not None and hasattr(config, "get_text_config"):
            config = config.get_text_config()
    return config


def _topk_of(module: torch.nn.Module, model: torch.nn.Module) -> int:
    config = _module_config(module, model)
    for attr in ("num_experts_per_tok", "moe_topk", "top_k"):
        value = getattr(config, attr, None)
        if isinstance(value, int) and value > 0:
            return value
    raise Unsupported(f"cannot tell the top-k of {type(module).__name__}: its config has no num_experts_per_tok")


def _is_fp8(module: torch.nn.Module) -> bool:
    return module.gate_up_proj.dtype == torch.float8_e4m3fn


def _check_fp8(what: str, module: torch.nn.Module) -> None:
    """An FP8 experts module epfuse computes: 128x128 weight blocks, activations quantised on the fly."""
    block = getattr(module, "block_size", None)
    if block is None or tuple(block) != (128, 128):
        raise Unsupported(f"{what} has FP8 weight blocks {block}; epfuse's FP8 layer takes 128x128 blocks")
    if getattr(module, "activation_scheme", "dynamic") != "dynamic":
        raise Unsupported(f"{what} uses static activation scales; epfuse quantises activations per 1x128 group")
    for attr in ("gate_up_proj_scale_inv", "down_proj_scale_inv"):
        if not isinstance(getattr(module, attr, None), torch.Tensor):
            raise Unsupported(f"{what} has FP8 weights but no {attr}")
    inter = module.gate_up_proj.shape[1] // 2
    if inter % 128 != 0:
        # transformers blocks gate_up_proj's 2I rows together, so one 128-row block (one scale) would
        # hold gate and up rows; epfuse's format blocks the halves apart (include/epfuse/config.h).
        raise Unsupported(
            f"{what} has intermediate size {inter}, not a multiple of 128: its gate_up_proj scale blocks "
            "straddle the gate and up halves, which epfuse's FP8 format blocks apart"
        )


def _plain_swiglu_gate(module: torch.nn.Module, apply_gate: Any) -> bool:
    """Whether the module's own _apply_gate computes silu(gate) * up: transformers' default, or
    FP8Experts' without the clamped GPT-OSS variant (swiglu_alpha) and without a limit."""
    try:
        from transformers.integrations.moe import _default_apply_gate
    except ImportError:
        _default_apply_gate = None
    if apply_gate is _default_apply_gate:
        return True
    fp8_class = _fp8_experts()[0]
    return (
        fp8_class is not None
        and apply_gate is getattr(fp8_class, "_apply_gate", None)
        and getattr(module, "swiglu_alpha", None) is None
        and getattr(module, "limit", None) is None
    )


def _check_supported(name: str, module: torch.nn.Module) -> None:
    """Refuses experts epfuse does not compute: another layout, biases, no gate, another activation."""
    what = f"{name or 'the model'} ({type(module).__name__})"
    if _is_fp8(module):
        _check_fp8(what, module)
    elif module.gate_up_proj.element_size() == 1:
        raise Unsupported(f"{what} holds {module.gate_up_proj.dtype} expert weights; epfuse takes bf16 or FP8 e4m3fn")
    if getattr(module, "has_bias", False) or getattr(module, "gate_up_proj_bias", None) is not None:
        raise Unsupported(f"{what} has expert biases; epfuse's experts have none")
    if getattr(module, "is_transposed", False):
        raise Unsupported(f"{what} stores transposed weights ([E, H, 2I]); epfuse needs gate_up_proj [E, 2I, H]")
    if not getattr(module, "is_concatenated", True):
        # Interleaved [gate0, up0, gate1, ...] rows would need a reordered copy of the weights.
        raise Unsupported(f"{what} interleaves gate and up rows; epfuse needs gate rows then up rows")
    if not getattr(module, "has_gate", True):
        raise Unsupported(f"{what} has no gate projection; epfuse computes SwiGLU experts")
    act = getattr(module, "act_fn", None)
    if act is not None and not _is_silu(act):
        raise Unsupported(f"{what} uses activation {type(act).__name__}; epfuse computes silu(gate) * up")
    apply_gate = getattr(type(module), "_apply_gate", None)
    if apply_gate is not None and not _plain_swiglu_gate(module, apply_gate):
        raise Unsupported(f"{what} has its own gating (_apply_gate); epfuse computes silu(gate) * up")


def _is_silu(act: Any) -> bool:
    # transformers has several SiLU classes (nn.SiLU, SiLUActivation, ...): compare what they compute.
    if isinstance(act, torch.nn.SiLU):
        return True
    probe = torch.linspace(-6.0, 6.0, 49)
    try:
        with torch.no_grad():
            return bool(torch.allclose(act(probe), torch.nn.functional.silu(probe), rtol=1e-5, atol=1e-6))
    except Exception:  # noqa: BLE001 - an activation that cannot run on a CPU vector is not SiLU to us
        return False


def _rank_slice(w: torch.Tensor, rank: int, world: int, what: str) -> torch.Tensor:
    experts = w.shape[0]
    if experts % world != 0:
        raise Unsupported(f"{what} has {experts} experts, not a multiple of the world size {world}")
    per_rank = experts // world
    # A slice of the first dimension of a contiguous tensor is contiguous: no copy.
    return w[rank * per_rank : (rank + 1) * per_rank]


def _shapes(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Module, int, int, int, int]]:
    for name, module in experts_modules(model):
        e, two_i, h = module.gate_up_proj.shape
        yield name, module, h, two_i // 2, e, _topk_of(module, model)


def make_workspace(
    model: torch.nn.Module, *, max_tokens: int, group: Any = None, num_sms: int = 0, device: Any = None, **kwargs: Any
) -> Workspace:
    """A Workspace sized for the largest experts module of `model` (collective); made for FP8 layers
    when the model has FP8 experts."""
    shapes = list(_shapes(model))
    if not shapes:
        raise InvalidArgument(f"{type(model).__name__} has no experts module (gate_up_proj and down_proj, 3-D)")
    if any(_is_fp8(s[1]) for s in shapes):
        kwargs.setdefault("weight_dtype", torch.float8_e4m3fn)
    return Workspace(
        group,
        hidden=max(s[2] for s in shapes),
        intermediate=max(s[3] for s in shapes),
        num_experts=max(s[4] for s in shapes),
        topk=max(s[5] for s in shapes),
        max_tokens=max_tokens,
        num_sms=num_sms,
        device=device,
        **kwargs,
    )


def _make_layers(model: torch.nn.Module, workspace: Workspace) -> list[tuple[str, torch.nn.Module, MoELayer]]:
    found = list(_shapes(model))
    if not found:
        raise InvalidArgument(f"{type(model).__name__} has no experts module (gate_up_proj and down_proj, 3-D)")
    for name, module, *_ in found:
        _check_supported(name, module)
        if getattr(module, _LAYER_ATTR, None) is not None:
            raise InvalidArgument(f"{name or 'the model'} is attached already: call epfuse.hf.detach(model) first")
    made: list[tuple[str, torch.nn.Module, MoELayer]] = []
    try:
        for name, module, _h, _i, experts, topk in found:
            declared = getattr(module, "num_experts", experts)
            if declared != experts:
                # HF's own expert parallelism already sharded the weights and remaps the router's ids.
                raise Unsupported(
                    f"{name} holds {experts} of {declared} experts: load the model without transformers' expert "
                    "parallelism; epfuse takes every rank's share from the full weights"
                )
            def share(attr: str) -> torch.Tensor:
                return _rank_slice(getattr(module, attr), workspace.rank, workspace.world_size, f"{name}.{attr}")

            w13, w2 = share("gate_up_proj"), share("down_proj")
            scales = (
                {"w13_scale": share("gate_up_proj_scale_inv"), "w2_scale": share("down_proj_scale_inv")}
                if _is_fp8(module)
                else {}
            )
            layer = MoELayer(workspace, w13, w2, topk=topk, **scales)
            made.append((name, module, layer))
    except BaseException:
        for _, _, layer in reversed(made):
            layer.close()
        raise
    for _, module, layer in made:
        # A plain attribute, not a submodule: state_dict and named_modules stay the model's.
        object.__setattr__(module, _LAYER_ATTR, layer)
    return made


def attach(model: torch.nn.Module, workspace: Workspace, *, use_interface: bool | None = None) -> list[MoELayer]:
    """Runs every experts module of `model` through epfuse on `workspace` (collective: one MoELayer per
    module, in module order). Through transformers' ExpertsInterface (config._experts_implementation =
    "epfuse") where the experts classes use it, else by patching each module's forward
    (patch_moe_blocks). use_interface=False forces the patch. Returns the layers; detach() undoes."""
    modules = [m for _, m in experts_modules(model)]
    if use_interface is None:
        use_interface = all(hasattr(m, "config") and hasattr(type(m), "_apply_gate") for m in modules) and bool(modules)
    if not use_interface:
        return patch_moe_blocks(model, workspace)
    if not register():
        raise Unsupported("this transformers has no ExpertsInterface: use epfuse.hf.patch_moe_blocks")
    made = _make_layers(model, workspace)
    # Modules may share a config: remember each config's implementation once, before any is switched.
    saved: dict[int, Any] = {}
    for _, module, _ in made:
        saved.setdefault(id(module.config), module.config._experts_implementation)
    for _, module, layer in made:
        # On the layer, not the config: a config's attributes end up in its config.json.
        layer._hf_restore = (module.config, saved[id(module.config)])  # type: ignore[attr-defined]
        module.config._experts_implementation = IMPLEMENTATION
    return [layer for _, _, layer in made]


def patch_moe_blocks(model: torch.nn.Module, workspace: Workspace) -> list[MoELayer]:
    """The fallback of attach(): replaces the forward of each experts module (on the instance) with
    epfuse's, for transformers versions or experts classes without the ExpertsInterface."""
    made = _make_layers(model, workspace)
    for _, module, _ in made:
        object.__setattr__(module, _SAVED_FORWARD_ATTR, module.__dict__.get("forward"))
        module.forward = types.MethodType(experts_forward, module)
    return [layer for _, _, layer in made]


def detach(model: torch.nn.Module) -> None:
    """Undoes attach() / patch_moe_blocks(): the experts run in transformers again, and their
    MoELayers are closed (collective)."""
    for _, module in reversed(experts_modules(model)):
        layer = module.__dict__.pop(_LAYER_ATTR, None)
        if _SAVED_FORWARD_ATTR in module.__dict__:
            saved = module.__dict__.pop(_SAVED_FORWARD_ATTR)
            module.__dict__.pop("forward", None)
            if saved is not None:
                module.forward = saved
        if layer is None:
            continue
        restore = getattr(layer, "_hf_restore", None)
        if restore is not None:
            config, implementation = restore
            config._experts_implementation = implementation
        layer.close()
