"""epfuse.torch on a GPU, world of one rank, against the float64 reference (tests/python/moe_ref.py):
random inputs, a CUDA graph replayed 1000 times with new inputs, two layers of different shapes taking
turns on one workspace, torch.compile, a failed workspace, and a 58-layer dsv3-shaped stack on one
workspace. Skipped without a CUDA device."""

from __future__ import annotations

import gc
from typing import Any
from collections.abc import Iterator

import pytest

import epfuse

torch = pytest.importorskip("torch", reason="torch is not installed")
pytestmark = pytest.mark.usefixtures("cuda")

from moe_ref import FROB_BOUND, ROW_BOUND, errors, random_inputs, random_weights, reference, within_bounds  # noqa: E402 - after the torch check

# A small shape of the README's example: every dimension a multiple of 128 (the kernels' tile).
H, I, E, K, MAX_T = 256, 256, 16, 4, 256


def assert_close_to_reference(y: Any, ref: Any, what: str) -> dict[str, float]:
    err = errors(y, ref)
    assert err["nan"] == 0, f"{what}: {err['nan']} NaN in y"
    assert err["worst_row_rel_err"] < ROW_BOUND, f"{what}: a row's relative error {err['worst_row_rel_err']:.3e}"
    assert err["frob_rel_err"] < FROB_BOUND, f"{what}: relative Frobenius error {err['frob_rel_err']:.3e}"
    return err


@pytest.fixture()
def ws() -> Iterator[Any]:
    import epfuse.torch as et

    with et.Workspace(hidden=H, intermediate=I, num_experts=E, topk=K, max_tokens=MAX_T) as w:
        yield w
    gc.collect()


def make_layer(ws: Any, seed: int = 0, h: int = H, i: int = I, e: int = E, k: int = K) -> tuple[Any, Any, Any]:
    import epfuse.torch as et

    w13, w2 = random_weights(e, h, i, device="cuda", seed=seed)
    return et.MoELayer(ws, w13, w2, topk=k), w13, w2


def test_padded_sizes_share_a_workspace_with_tiled_ones(record: Any) -> None:
    """H 320 / I 192 (multiples of 64, not of 128) run zero-padded (src/padding) on a workspace made for
    that size, beside a layer of tiled sizes on the same workspace; both against the float64 reference."""
    import epfuse.torch as et

    with et.Workspace(hidden=320, intermediate=192, num_experts=E, topk=K, max_tokens=MAX_T) as w:
        odd, w13, w2 = make_layer(w, seed=11, h=320, i=192)
        tiled, t13, t2 = make_layer(w, seed=12, h=256, i=128)
        for call, tokens in enumerate([7, 128, 1, MAX_T]):
            x, ids, wt = random_inputs(tokens, 320, E, K, device="cuda", seed=40 + call)
            err = assert_close_to_reference(odd(x, ids, wt), reference(x, ids, wt, w13, w2), f"padded T={tokens}")
            x2, ids2, wt2 = random_inputs(tokens, 256, E, K, device="cuda", seed=50 + call)
            assert_close_to_reference(tiled(x2, ids2, wt2), reference(x2, ids2, wt2, t13, t2), f"tiled T={tokens}")
        odd.check_errors()
        record(check="torch_padded_vs_float64", shape=[MAX_T, 320, 192, E, K], **err, verified=within_bounds(err))
    gc.collect()


def test_workspace_basics(ws: Any) -> None:
    assert (ws.rank, ws.world_size) == (0, 1)
    assert ws.comm_source == "unique_id (world of one)"
    mem = ws.memory()
    assert mem["symmetric_bytes"] > 0 and mem["total_bytes"] == mem["symmetric_bytes"] + mem["private_bytes"]
    assert "rank 0/1 on cuda:0" in repr(ws)


@pytest.mark.parametrize("tokens", [1, 7, 128, MAX_T])
@pytest.mark.parametrize("id_dtype", ["int32", "int64"])
def test_forward_matches_reference(ws: Any, record: Any, tokens: int, id_dtype: str) -> None:
    layer, w13, w2 = make_layer(ws)
    x, ids, w = random_inputs(tokens, H, E, K, device="cuda", seed=tokens, id_dtype=getattr(torch, id_dtype))
    y = layer(x, ids, w)
    layer.check_errors()
    assert y.shape == x.shape and y.dtype == torch.bfloat16 and y.device == x.device
    err = assert_close_to_reference(y, reference(x, ids, w, w13, w2), f"T={tokens}")
    record(
        check="torch_forward_vs_float64",
        model="random",
        shape=[tokens, H, I, E, K],
        ids=id_dtype,
        **err,
        verified=within_bounds(err),
    )


def test_forward_topk_weights_in_bf16_and_dropped_slots(ws: Any) -> None:
    layer, w13, w2 = make_layer(ws)
    x, ids, w = random_inputs(64, H, E, K, device="cuda", seed=3)
    ids[::5, 1] = -1  # dropped slots contribute nothing
    wb = w.to(torch.bfloat16)
    y = layer(x, ids, wb)
    layer.check_errors()
    assert_close_to_reference(y, reference(x, ids, wb.float(), w13, w2), "bf16 weights, dropped slots")


def test_zero_tokens(ws: Any) -> None:
    layer, _, _ = make_layer(ws)
    x, ids, w = random_inputs(0, H, E, K, device="cuda", seed=0)
    y = layer(x, ids, w)
    layer.check_errors()
    assert y.shape == (0, H)


def test_validation_on_the_device(ws: Any) -> None:
    layer, _, _ = make_layer(ws)
    x, ids, w = random_inputs(8, H, E, K, device="cuda", seed=0)
    with pytest.raises(epfuse.InvalidArgument, match="x must be on cuda:0"):
        layer(x.cpu(), ids, w)
    with pytest.raises(epfuse.InvalidArgument, match=f"more than max_tokens={MAX_T}"):
        big = random_inputs(MAX_T + 1, H, E, K, device="cuda", seed=0)
        layer(*big)
    with pytest.raises(epfuse.InvalidArgument, match="w13 is not the tensor MoELayer"):
        torch.ops.epfuse.moe_forward(x, ids, w, layer.w13.clone(), layer.w2, layer.layer_id)


def test_layer_too_big_for_the_workspace(ws: Any) -> None:
    import epfuse.torch as et

    w13, w2 = random_weights(E, 2 * H, I, device="cuda", seed=0)
    with pytest.raises(epfuse.InvalidConfig) as info:
        et.MoELayer(ws, w13, w2, topk=K)
    assert "hidden" in str(info.value)


def test_cuda_graph_replayed_1000_times(ws: Any, record: Any) -> None:
    layer, w13, w2 = make_layer(ws)
    tokens = 128
    x_s, ids_s, w_s = random_inputs(tokens, H, E, K, device="cuda", seed=100, id_dtype=torch.int64)
    # Warm up on a side stream, as torch.cuda.graphs' documentation asks, then capture one forward.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        layer(x_s, ids_s, w_s)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y_s = layer(x_s, ids_s, w_s)
    checked = []
    for replay in range(1, 1001):
        x, ids, w = random_inputs(tokens, H, E, K, device="cuda", seed=1000 + replay, id_dtype=torch.int64)
        x_s.copy_(x)
        ids_s.copy_(ids)
        w_s.copy_(w)
        graph.replay()
        if replay in (1, 2, 3, 500, 999, 1000):
            err = assert_close_to_reference(y_s, reference(x, ids, w, w13, w2), f"replay {replay}")
            checked.append({"replay": replay, **err})
    layer.check_errors()
    worst = max(checked, key=lambda c: c["frob_rel_err"])
    record(
        check="cuda_graph_replay",
        model="random",
        shape=[tokens, H, I, E, K],
        replays=1000,
        replays_checked=[c["replay"] for c in checked],
        max_abs_err=max(c["max_abs_err"] for c in checked),
        max_rel_err=max(c["max_rel_err"] for c in checked),
        frob_rel_err=worst["frob_rel_err"],
        worst_row_rel_err=max(c["worst_row_rel_err"] for c in checked),
        verified=True,
    )
    del graph


def test_two_layers_of_different_shapes_take_turns(record: Any) -> None:
    import epfuse.torch as et

    shapes = {"a": (256, 256, 16, 4), "b": (384, 128, 8, 2)}  # (H, I, E, k)
    with et.Workspace(hidden=384, intermediate=256, num_experts=16, topk=4, max_tokens=128) as ws:
        layers = {}
        for n, (h, i, e, k) in shapes.items():
            w13, w2 = random_weights(e, h, i, device="cuda", seed=ord(n))
            layers[n] = (et.MoELayer(ws, w13, w2, topk=k), w13, w2)
        assert [layer.layer_id for layer in ws.layers()] == [layers["a"][0].layer_id, layers["b"][0].layer_id]
        worst = 0.0
        for call in range(100):
            n = "ab"[call % 2]
            h, i, e, k = shapes[n]
            layer, w13, w2 = layers[n]
            x, ids, w = random_inputs(1 + (call * 37) % 128, h, e, k, device="cuda", seed=call)
            y = layer(x, ids, w)
            if call in (0, 1, 2, 3, 50, 51, 98, 99):
                layer.check_errors()
                err = assert_close_to_reference(y, reference(x, ids, w, w13, w2), f"call {call} (layer {n})")
                worst = max(worst, err["frob_rel_err"])
        layers["a"][0].check_errors()
    record(
        check="two_layers_alternating",
        model="random",
        shape=[shapes["a"], shapes["b"]],
        calls=100,
        frob_rel_err=worst,
        verified=True,
    )


def test_threads_share_a_workspace(ws: Any, record: Any) -> None:
    """Four Python threads call one layer at once, each on a CUDA stream of its own (README "Threads and
    streams"): the workspace's turn orders their kernels, and every call matches the reference."""
    import threading

    import torch

    layer, w13, w2 = make_layer(ws, seed=11)
    failures: list[str] = []
    worst: list[float] = []
    start = threading.Barrier(4)

    def work(t: int) -> None:
        try:
            with torch.cuda.stream(torch.cuda.Stream()):
                start.wait()
                for call in range(20):
                    T = 1 + (t * 53 + call * 29) % MAX_T
                    x, ids, w = random_inputs(T, H, E, K, device="cuda", seed=1000 * t + call)
                    y = layer(x, ids, w)
                    layer.check_errors()  # synchronises this thread's stream
                    err = assert_close_to_reference(y, reference(x, ids, w, w13, w2), f"thread {t} call {call}")
                    worst.append(err["frob_rel_err"])
        except Exception as e:  # reported below: an exception in a thread would not fail the test
            failures.append(f"thread {t}: {e!r}")

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    assert len(worst) == 80
    record(
        check="threads_share_a_workspace",
        model="random",
        shape=[H, I, E, K],
        calls=80,
        frob_rel_err=max(worst),
        verified=True,
    )


def test_torch_compile_fullgraph_matches_the_reference(ws: Any, record: Any) -> None:
    """A block (norm, the op, a residual) compiled with fullgraph=True and run eagerly: each against the
    float64 reference of the block (not only against each other, which a wrong op in both would pass)."""
    layer, w13, w2 = make_layer(ws)

    class Block(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.norm = torch.nn.RMSNorm(H, dtype=torch.bfloat16, device="cuda")

        def forward(self, x: Any, ids: Any, w: Any) -> Any:
            return x + layer(self.norm(x), ids, w)

    block = Block()
    compiled = torch.compile(block, fullgraph=True)
    worst: dict[str, float] = {}
    # Inference, as an engine runs it: the norm's weight requires grad, and the op has no backward.
    with torch.no_grad():
        for seed in range(3):
            x, ids, w = random_inputs(64, H, E, K, device="cuda", seed=seed)
            eager = block(x, ids, w)
            got = compiled(x, ids, w)
            layer.check_errors()
            # The reference of the block: x + the float64 layer of the (eager) norm's bf16 output.
            ref = x.double() + reference(block.norm(x), ids, w, w13, w2)
            assert_close_to_reference(eager, ref, f"eager, seed {seed}")
            err = assert_close_to_reference(got, ref, f"torch.compile, seed {seed}")
            torch.testing.assert_close(got, eager, rtol=2e-2, atol=2e-2)
            if not worst or err["frob_rel_err"] > worst["frob_rel_err"]:
                worst = err
    record(
        check="torch_compile_fullgraph_vs_float64",
        model="random",
        shape=[64, H, I, E, K],
        **worst,
        verified=within_bounds(worst),
    )


def test_backward_is_unsupported_with_a_clear_error(ws: Any) -> None:
    layer, _, _ = make_layer(ws)
    x, ids, w = random_inputs(8, H, E, K, device="cuda", seed=3)
    x.requires_grad_(True)
    y = layer(x, ids, w)  # the forward runs in grad mode; only the backward is refused
    layer.check_errors()
    with pytest.raises(epfuse.Unsupported, match="no backward"):
        y.float().sum().backward()


def test_failed_workspace_fails_every_later_forward() -> None:
    import epfuse.torch as et

    with et.Workspace(hidden=H, intermediate=I, num_experts=E, topk=K, max_tokens=64) as ws:
        layer, _, _ = make_layer(ws)
        x, ids, w = random_inputs(16, H, E, K, device="cuda", seed=0)
        bad = ids.clone()
        bad[3, 0] = E + 5  # out of range: the device records it
        with pytest.raises(epfuse.Error) as info:
            layer(x, bad, w)
            layer.check_errors()
        assert isinstance(info.value, epfuse.InvalidArgument), info.value
        with pytest.raises(epfuse.Error):
            layer(x, ids, w)
            layer.check_errors()


def test_close_order_and_registry() -> None:
    import epfuse.torch as et

    ws = et.Workspace(hidden=H, intermediate=I, num_experts=E, topk=K, max_tokens=64)
    layer, _, _ = make_layer(ws)
    layer_id = layer.layer_id
    ws.close()  # closes the layer first
    assert layer.closed and ws.closed and ws.handle == 0
    x, ids, w = random_inputs(4, H, E, K, device="cuda", seed=0)
    with pytest.raises(epfuse.InvalidArgument, match=f"no open MoELayer with layer_id {layer_id}"):
        layer(x, ids, w)
    ws.close()  # idempotent
    # Garbage collection of a world-of-one workspace with an open layer closes both.
    ws2 = et.Workspace(hidden=H, intermediate=I, num_experts=E, topk=K, max_tokens=64)
    make_layer(ws2)
    del ws2
    gc.collect()


def _rms_normalised(y: Any) -> Any:
    yf = y.float()
    return (yf * torch.rsqrt(yf.pow(2).mean(-1, keepdim=True) + 1e-12)).to(torch.bfloat16)


def test_dsv3_stack_of_58_layers_on_one_workspace(record: Any) -> None:
    """58 MoE layers of DeepSeek-V3's shape (H 7168, I 2048, 64 experts, top-8, world 1, 4096 tokens)
    on one workspace: its memory is paid once; each layer adds no device memory of its own."""
    import epfuse.torch as et

    h, inter, e, k, max_t, n_layers = 7168, 2048, 64, 8, 4096, 58
    free0, total = torch.cuda.mem_get_info()
    w13, w2 = random_weights(e, h, inter, device="cuda", seed=58)  # one weight pair for every layer
    torch.cuda.synchronize()
    free1, _ = torch.cuda.mem_get_info()
    ws = et.Workspace(hidden=h, intermediate=inter, num_experts=e, topk=k, max_tokens=max_t)
    mem = ws.memory()
    torch.cuda.synchronize()
    free2, _ = torch.cuda.mem_get_info()
    layers = [et.MoELayer(ws, w13, w2, topk=k) for _ in range(n_layers)]
    torch.cuda.synchronize()
    free3, _ = torch.cuda.mem_get_info()
    gib = 1024.0**3
    print(
        f"\n[dsv3 x{n_layers}] workspace: symmetric {mem['symmetric_bytes'] / gib:.3f} GiB + private "
        f"{mem['private_bytes'] / gib:.3f} GiB = {mem['total_bytes'] / gib:.3f} GiB; "
        f"device memory used by the weights {(free0 - free1) / gib:.3f} GiB, by the workspace "
        f"{(free1 - free2) / gib:.3f} GiB, by {n_layers} layers {(free2 - free3) / gib:.3f} GiB; "
        f"torch.cuda.memory_allocated {torch.cuda.memory_allocated() / gib:.3f} GiB (the weights); "
        f"{(total - free3) / gib:.3f} of {total / gib:.1f} GiB in use"
    )
    # Layers hold borrowed weights and a few scalars: far less than one more workspace.
    assert free2 - free3 < 0.05 * mem["total_bytes"] + 64 * 1024**2
    # Run the whole stack on a batch, like a model's forward, and check the first and last layer.
    tokens = 256
    x0, ids, w = random_inputs(tokens, h, e, k, device="cuda", seed=7)
    x = x0
    outs = []
    for layer in layers:
        y = layer(x, ids, w)
        outs.append(y)
        x = _rms_normalised(y)  # as a model's norm would: magnitudes stay O(1) through 58 layers
    layers[-1].check_errors()
    rows = torch.arange(0, tokens, 17, device="cuda")
    for idx in (0, n_layers - 1):
        xin = x0 if idx == 0 else _rms_normalised(outs[idx - 1])
        assert outs[idx][rows].float().abs().mean() > 1e-3, f"layer {idx}'s output is near zero: a vacuous check"
        ref = reference(xin[rows], ids[rows], w[rows], w13, w2)
        err = assert_close_to_reference(outs[idx][rows], ref, f"dsv3 layer {idx}")
        record(
            check="dsv3_stack_layer",
            model="dsv3",
            layer=idx,
            layers=n_layers,
            shape=[tokens, h, inter, e, k],
            rows_checked=len(rows),
            **err,
            verified=within_bounds(err),
        )
    record(
        check="dsv3_stack_memory",
        model="dsv3",
        layers=n_layers,
        max_tokens=max_t,
        workspace_symmetric_bytes=mem["symmetric_bytes"],
        workspace_private_bytes=mem["private_bytes"],
        device_bytes_workspace=free1 - free2,
        device_bytes_all_layers=free2 - free3,
        torch_memory_allocated=torch.cuda.memory_allocated(),
        verified=True,
    )
    ws.close()


def _readme_example() -> str:
    """The first python block of README.md's section "Using epfuse from PyTorch"."""
    from conftest import REPO_ROOT

    for path in (REPO_ROOT / "README.md",):
        if not path.exists():
            continue
        text = path.read_text()
        start = text.find("## Using epfuse from PyTorch")
        if start < 0:
            continue
        block = text[start:].split("```python\n", 1)[1].split("```", 1)[0]
        return block
    pytest.skip("no README section 'Using epfuse from PyTorch' in this checkout")


def test_readme_example(record: Any) -> None:
    code = _readme_example()
    scope: dict[str, Any] = {}
    exec(compile(code, "README example", "exec"), scope)
    y, x = scope["y"], scope["x"]
    ref = reference(x, scope["topk_ids"], scope["topk_weights"], scope["w13"], scope["w2"])
    err = assert_close_to_reference(y, ref, "README example")
    record(check="readme_example", model="qwen3-30b", shape=list(y.shape), **err, verified=within_bounds(err))
