"""epfuse in PyTorch: a Workspace on a torch.distributed NCCL group, MoELayers on it, and the layer as
the custom op `torch.ops.epfuse.moe_forward` (traceable by torch.compile, capturable in CUDA graphs).

    ws = Workspace(hidden=H, intermediate=I, num_experts=E, topk=k, max_tokens=T_max)
    layer = MoELayer(ws, w13, w2, topk=k)      # w13 [E/R, 2I, H], w2 [E/R, H, I] bf16, this rank's experts
    y = layer(x, topk_ids, topk_weights)       # x [T, H] bf16, ids [T, k] int32/int64, weights [T, k]
    layer.check_errors()                       # what the device recorded (bad ids, a peer timing out)

Creating, closing and calling workspaces and layers is collective: every rank of the group does it, in
the same order. Layers run one after another on one stream; see README "Using epfuse from PyTorch".
"""

from __future__ import annotations

import itertools
import threading
import warnings
import weakref
from typing import Any, NoReturn, Optional

import torch

from . import _lib
from .errors import CudaError, Error, InvalidArgument, Unsupported

__all__ = [
    "Workspace",
    "MoELayer",
    "check_forward_args",
    "check_not_aliased",
    "check_weights",
    "check_x_scale_values",
    "narrow_topk_ids",
]

# Every pointer the C API takes must be 16-byte aligned (include/epfuse/c_api.h).
_ALIGNMENT = 16
_TOPK_ID_DTYPES = (torch.int32, torch.int64)
_TOPK_WEIGHT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _fail(message: str) -> NoReturn:
    raise InvalidArgument(message)


def _shape(t: torch.Tensor) -> tuple[int, ...]:
    return tuple(t.shape)


def _check_tensor(name: str, t: Any) -> None:
    if not isinstance(t, torch.Tensor):
        _fail(f"{name} must be a torch.Tensor, got {type(t).__name__}")


def _check_device(name: str, t: torch.Tensor, device: torch.device | None) -> None:
    if device is not None and t.device != device:
        _fail(
            f"{name} must be on {device} (the workspace's device), got a tensor on {t.device}: move it with .to('{device}')"
        )


def _check_contiguous(name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        _fail(
            f"{name} must be row-major contiguous, got strides {tuple(t.stride())} for shape {_shape(t)}: "
            "call .contiguous()"
        )


def _check_aligned(name: str, t: torch.Tensor) -> None:
    # An empty tensor may have a null data pointer; no byte of it is read.
    if t.numel() > 0 and t.data_ptr() % _ALIGNMENT != 0:
        _fail(
            f"{name} must start at a {_ALIGNMENT}-byte aligned address, its data_ptr {t.data_ptr():#x} is not "
            "(a view at an offset into another tensor): call .clone()"
        )


def _check_expert_weights(w13: Any, w2: Any, dtype: torch.dtype, convert: str, device: torch.device | None) -> tuple[int, int, int]:
    """w13 [E_local, 2I, H] and w2 [E_local, H, I] of `dtype`, contiguous, 16-byte aligned, on `device`."""
    _check_tensor("w13", w13)
    _check_tensor("w2", w2)
    for name, w in (("w13", w13), ("w2", w2)):
        if w.dtype != dtype:
            _fail(f"{name} must be {dtype}, got {w.dtype}: {convert}")
    _check_device("w13", w13, device)
    _check_device("w2", w2, device)
    if w13.dim() != 3:
        _fail(f"w13 must be 3-D [experts_per_rank, 2*intermediate, hidden], got shape {_shape(w13)}")
    if w2.dim() != 3:
        _fail(f"w2 must be 3-D [experts_per_rank, hidden, intermediate], got shape {_shape(w2)}")
    e_local, two_i, hidden = _shape(w13)
    if two_i % 2 != 0:
        _fail(f"w13 must be [experts_per_rank, 2*intermediate, hidden]: its dim 1 ({two_i}) is odd")
    inter = two_i // 2
    if _shape(w2) != (e_local, hidden, inter):
        _fail(
            f"w2 must be [experts_per_rank={e_local}, hidden={hidden}, intermediate={inter}] to match w13 "
            f"{_shape(w13)}, got {_shape(w2)}"
        )
    if e_local == 0:
        _fail("w13 and w2 hold no experts (dim 0 is 0)")
    _check_contiguous("w13", w13)
    _check_contiguous("w2", w2)
    _check_aligned("w13", w13)
    _check_aligned("w2", w2)
    return e_local, hidden, inter


def check_weights(w13: Any, w2: Any, *, device: torch.device | None = None) -> tuple[int, int, int]:
    """Checks a layer's expert weights, w13 [E_local, 2I, H] (gate rows, then up rows) and
    w2 [E_local, H, I], bf16, contiguous, 16-byte aligned, on `device` when given. Returns
    (E_local, H, I). Raises epfuse.InvalidArgument naming the tensor. Calls nothing in C."""
    return _check_expert_weights(
        w13, w2, torch.bfloat16, "convert the weights once with .to(torch.bfloat16)", device
    )


# Block scale dtypes -> the C API's scale format: fp32 scales, or UE8M0 exponent bytes (2^(e - 127)).
_SCALE_FORMATS = {
    dtype: fmt
    for dtype, fmt in (
        (torch.float32, _lib.SCALES_FP32),
        (getattr(torch, "float8_e8m0fnu", None), _lib.SCALES_UE8M0),  # torch >= 2.7
        (torch.uint8, _lib.SCALES_UE8M0),
    )
    if dtype is not None
}
# The expert dtypes a workspace can be made for, and the C API's weight format of each.
_WEIGHT_FORMATS = {torch.bfloat16: _lib.WEIGHTS_BF16, torch.float8_e4m3fn: _lib.WEIGHTS_FP8_BLOCK128}
FP8_BLOCK = 128  # one scale per 128 x 128 weight block


def check_fp8_weights(
    w13: Any, w2: Any, w13_scale: Any, w2_scale: Any, *, device: torch.device | None = None
) -> tuple[int, int, int, int]:
    """Checks FP8 expert weights as DeepSeek-V3 checkpoints hold them: w13 [E_local, 2I, H] and
    w2 [E_local, H, I] torch.float8_e4m3fn (as check_weights), with one scale per 128 x 128 block
    (weight = code * scale), w13_scale [E_local, 2*ceil(I/128), ceil(H/128)] and w2_scale [E_local,
    ceil(H/128), ceil(I/128)] (the gate and up halves of w13 blocked apart), both float32 or both UE8M0
    (torch.float8_e8m0fnu, or uint8 exponent bytes), contiguous, on `device`. Returns (E_local, H, I,
    scale format). The scales' values (finite, > 0) are checked by the library. Calls nothing in C."""
    e_local, hidden, inter = _check_expert_weights(
        w13, w2, torch.float8_e4m3fn, "FP8 experts are e4m3fn codes with block scales", device
    )
    _check_tensor("w13_scale", w13_scale)
    _check_tensor("w2_scale", w2_scale)
    for name, s in (("w13_scale", w13_scale), ("w2_scale", w2_scale)):
        if s.dtype not in _SCALE_FORMATS:
            _fail(f"{name} must be torch.float32, torch.float8_e8m0fnu or torch.uint8 (UE8M0 exponents), got {s.dtype}")
    if w13_scale.dtype != w2_scale.dtype:
        _fail(f"w13_scale and w2_scale must have one dtype, got {w13_scale.dtype} and {w2_scale.dtype}")
    blocks_h, blocks_i = -(-hidden // FP8_BLOCK), -(-inter // FP8_BLOCK)
    for name, s, want in (
        ("w13_scale", w13_scale, (e_local, 2 * blocks_i, blocks_h)),
        ("w2_scale", w2_scale, (e_local, blocks_h, blocks_i)),
    ):
        if _shape(s) != want:
            _fail(
                f"{name} must be {list(want)} (one scale per {FP8_BLOCK}x{FP8_BLOCK} block of hidden={hidden}, "
                f"intermediate={inter}, gate and up blocked apart), got {list(_shape(s))}"
            )
        _check_device(name, s, device)
        _check_contiguous(name, s)
    return e_local, hidden, inter, _SCALE_FORMATS[w13_scale.dtype]


def check_forward_args(
    x: Any,
    topk_ids: Any,
    topk_weights: Any,
    *,
    hidden: int,
    topk: int,
    max_tokens: int,
    device: torch.device | None = None,
    x_scale: Any = None,
) -> int:
    """Checks one forward's inputs against a layer of `hidden`, `topk`, `max_tokens` (and `device`
    when given): x [T, H] bf16, topk_ids [T, k] int32 or int64, topk_weights [T, k] float32 (bfloat16
    and float16 accepted and converted), all row-major contiguous, 16-byte aligned, T <= max_tokens.
    With x_scale, x is already quantised (FP8 layers): x [T, H] torch.float8_e4m3fn and x_scale
    [T, ceil(H/128)] float32, one scale per token per 128 channels (x = code * scale).
    Returns T. Raises epfuse.InvalidArgument naming the tensor. Calls nothing in C."""
    _check_tensor("x", x)
    _check_tensor("topk_ids", topk_ids)
    _check_tensor("topk_weights", topk_weights)
    if x_scale is not None:
        _check_tensor("x_scale", x_scale)
        if x.dtype != torch.float8_e4m3fn:
            _fail(f"with x_scale, x must be torch.float8_e4m3fn (quantised x), got {x.dtype}")
        if x_scale.dtype != torch.float32:
            _fail(f"x_scale must be torch.float32, got {x_scale.dtype}")
        _check_device("x_scale", x_scale, device)
        want = (x.shape[0] if x.dim() == 2 else -1, -(-hidden // FP8_BLOCK))
        if _shape(x_scale) != want:
            _fail(f"x_scale must be [tokens, ceil(hidden/{FP8_BLOCK})] = {list(want)}, got shape {_shape(x_scale)}")
        _check_contiguous("x_scale", x_scale)
    elif x.dtype == torch.float8_e4m3fn:
        _fail("x is torch.float8_e4m3fn: pass its per-token 1x128 scales as x_scale")
    elif x.dtype != torch.bfloat16:
        _fail(f"x must be torch.bfloat16, got {x.dtype}")
    if topk_ids.dtype not in _TOPK_ID_DTYPES:
        _fail(f"topk_ids must be torch.int32 or torch.int64 (converted to int32), got {topk_ids.dtype}")
    if topk_weights.dtype not in _TOPK_WEIGHT_DTYPES:
        _fail(
            "topk_weights must be torch.float32 (torch.bfloat16 and torch.float16 are accepted and converted), "
            f"got {topk_weights.dtype}"
        )
    _check_device("x", x, device)
    _check_device("topk_ids", topk_ids, device)
    _check_device("topk_weights", topk_weights, device)
    if x.dim() != 2:
        _fail(
            f"x must be 2-D [tokens, hidden={hidden}], got shape {_shape(x)}: flatten leading dims with .view(-1, {hidden})"
        )
    tokens = x.shape[0]
    if x.shape[1] != hidden:
        _fail(f"x must be [tokens, hidden={hidden}], got shape {_shape(x)}")
    for name, t in (("topk_ids", topk_ids), ("topk_weights", topk_weights)):
        if _shape(t) != (tokens, topk):
            _fail(f"{name} must be [tokens={tokens}, topk={topk}] (tokens from x), got shape {_shape(t)}")
    _check_contiguous("x", x)
    _check_contiguous("topk_ids", topk_ids)
    _check_contiguous("topk_weights", topk_weights)
    _check_aligned("x", x)
    # Tensors converted to another dtype are fresh (aligned) copies; the others are passed as they are.
    if topk_ids.dtype == torch.int32:
        _check_aligned("topk_ids", topk_ids)
    if topk_weights.dtype == torch.float32:
        _check_aligned("topk_weights", topk_weights)
    if tokens > max_tokens:
        _fail(f"x has {tokens} tokens, more than max_tokens={max_tokens} the layer was created with")
    return tokens


def _capturing(t: torch.Tensor) -> bool:
    """Whether `t`'s CUDA stream is being captured into a graph (no host synchronisation allowed)."""
    return t.is_cuda and torch.cuda.is_current_stream_capturing()


def check_x_scale_values(x_scale: torch.Tensor) -> None:
    """Every per-token scale of x quantised by the caller must be finite and > 0 (the C++ API and the
    kernel do not check them: include/epfuse/types.h). One host synchronisation; skipped while the
    stream is captured into a CUDA graph (the values are not known then). Raises epfuse.InvalidArgument
    (a ValueError) naming the first bad scale."""
    if x_scale.numel() == 0 or _capturing(x_scale):
        return
    bad = ~(torch.isfinite(x_scale) & (x_scale > 0))
    if not bool(bad.any()):
        return
    first = bad.nonzero()[0].tolist()
    value = x_scale[tuple(first)].item()
    where = "][".join(str(i) for i in first)
    _fail(
        f"x_scale[{where}] = {value!r}: every scale of x quantised by the caller must be finite and > 0 "
        f"({int(bad.sum().item())} of {x_scale.numel()} are not)"
    )


def narrow_topk_ids(topk_ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """topk_ids as int32, the C API's type. int64 ids are checked to lie in [-1, num_experts) before
    narrowing (one host synchronisation; pass int32 ids to avoid it: the device checks those), so that
    an id such as 2**32 + 3 cannot wrap into a valid expert. While the stream is captured into a CUDA
    graph the values are not known: ids outside the range become num_experts instead, which the device
    reports (check_errors). Raises epfuse.InvalidArgument (a ValueError) naming the first bad id."""
    if topk_ids.dtype == torch.int32:
        return topk_ids
    if topk_ids.numel():
        bad = (topk_ids < -1) | (topk_ids >= num_experts)
        if _capturing(topk_ids):
            topk_ids = topk_ids.masked_fill(bad, num_experts)
        elif bool(bad.any()):
            token, slot = bad.nonzero()[0].tolist()
            _fail(
                f"topk_ids[{token}][{slot}] = {int(topk_ids[token, slot].item())} is not a valid expert id "
                f"(-1 or [0, {num_experts})): checked before narrowing {topk_ids.dtype} to torch.int32"
            )
    return topk_ids.to(torch.int32)


def check_not_aliased(y: torch.Tensor, inputs: dict[str, Optional[torch.Tensor]]) -> None:
    """y must not share a byte with any input (the layer writes y while it still reads them; the C++
    front door refuses it too). Raises epfuse.InvalidArgument naming the input."""
    if y.numel() == 0:
        return
    y0 = y.data_ptr()
    y1 = y0 + y.numel() * y.element_size()
    for name, t in inputs.items():
        if t is None or t.numel() == 0 or t.device != y.device:
            continue
        t0 = t.data_ptr()
        t1 = t0 + t.numel() * t.element_size()
        if t0 < y1 and y0 < t1:
            _fail(f"y overlaps {name}: the output must not alias an input")


def _new_output(x: torch.Tensor) -> torch.Tensor:
    """y for a forward of x: a new bf16 tensor of x's shape."""
    return torch.empty(x.shape, dtype=torch.bfloat16, device=x.device)


def _cuda_device(device: Any) -> torch.device:
    if not torch.cuda.is_available():
        raise CudaError("epfuse.torch needs a CUDA device: torch.cuda.is_available() is False")
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    device = torch.device(device)
    if device.type != "cuda":
        _fail(f"device must be a CUDA device, got {device}")
    return torch.device("cuda", torch.cuda.current_device() if device.index is None else device.index)



def _close_when_collected(obj: object, world_size: int, what: str, how: str) -> None:
    """Garbage collection closes a world-1 object; a larger world's is leaked with a warning, since
    destroying it is collective and the other ranks may not be collecting theirs now."""
    if getattr(obj, "_closed", True):
        return
    if world_size > 1:
        warnings.warn(
            f"{what} of world > 1 collected without close(): leaked, since destroying it is collective; "
            f"call {how} on every rank",
            ResourceWarning,
            stacklevel=3,
        )
        return
    try:
        obj.close()  # type: ignore[attr-defined]
    except Exception:
        pass

class _OnDevice:
    """Makes `device` current around a C call (the C side works on the current device); free when it
    already is."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.prev: int | None = None

    def __enter__(self) -> None:
        cur = torch.cuda.current_device()
        if cur != self.device.index:
            self.prev = cur
            torch.cuda.set_device(self.device)

    def __exit__(self, *exc: Any) -> None:
        if self.prev is not None:
            torch.cuda.set_device(self.prev)
            self.prev = None


def _stream_of(device: torch.device) -> int:
    """The cudaStream_t of torch's current stream on `device` (the capture stream inside a graph capture)."""
    return int(torch.cuda.current_stream(device).cuda_stream)


def _torch_nccl_comm(group: Any, device: torch.device) -> int | None:
    """The ncclComm_t of `group`'s NCCL backend on `device`, or None where this torch does not expose it
    (ProcessGroupNCCL._comm_ptr())."""
    import torch.distributed as dist

    try:
        backend = group._get_backend(torch.device("cuda", device.index))
    except (AttributeError, RuntimeError, ValueError):
        return None
    get = getattr(backend, "_comm_ptr", None)
    if get is None:
        return None
    # torch makes the communicator lazily, at the group's first collective; _comm_ptr() looks it up
    # by the current device (the caller makes `device` current) and gives 0 when there is none.
    t = torch.zeros(1, device=device)
    dist.all_reduce(t, group=group)
    torch.cuda.synchronize(device)
    try:
        ptr = int(get())
    except RuntimeError:
        return None
    return ptr or None


class Workspace:
    """The buffers every MoELayer of a model shares (one per communicator), sized for the largest
    layer that will run on it: `hidden`, `intermediate`, `num_experts` (over all ranks), `topk`,
    `max_tokens` per rank. weight_dtype torch.float8_e4m3fn makes it hold FP8 layers as well as bf16
    ones (it then also keeps this rank's tokens quantised); torch.bfloat16 (the default), bf16 layers only.

    group: a torch.distributed NCCL process group (None: the default group, or, when torch.distributed
    is not initialised, a world of one rank). Its NCCL communicator is borrowed
    (`group._get_backend(cuda)._comm_ptr()`); where torch does not expose it, or comm="unique_id",
    epfuse makes its own communicator from an ncclUniqueId that rank 0 broadcasts over the group.

    Collective. close() (or `with`) destroys its layers, then the workspace, then the communicator;
    with more than one rank call it explicitly: garbage collection happens at different times on each
    rank, so a workspace of world > 1 that is collected unclosed is leaked with a ResourceWarning.
    After a peer failed (epfuse.Timeout or epfuse.Aborted from a call) or died, call abort() instead:
    it closes everything without waiting for any peer. On a communicator epfuse made, a close() whose
    peers never come waits at most the collective timeout (EPFUSE_COLLECTIVE_TIMEOUT_MS, default
    300000) and raises epfuse.Timeout; on a borrowed one it can wait until the group is aborted.
    """

    def __init__(
        self,
        group: Any = None,
        *,
        hidden: int,
        intermediate: int,
        num_experts: int,
        topk: int,
        max_tokens: int,
        num_sms: int = 0,
        device: Any = None,
        comm: str = "auto",
        weight_dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        self._closed = True  # until fully made; __del__ and close() look at it
        self._handle = 0
        self._comm = 0
        self._layers: dict[int, weakref.ref[MoELayer]] = {}
        if comm not in ("auto", "borrow", "unique_id"):
            _fail(f"comm must be 'auto', 'borrow' or 'unique_id', got {comm!r}")
        if weight_dtype not in _WEIGHT_FORMATS:
            _fail(f"weight_dtype must be torch.bfloat16 or torch.float8_e4m3fn, got {weight_dtype}")
        self.weight_dtype = weight_dtype
        self.device = _cuda_device(device)
        self.hidden = int(hidden)
        self.intermediate = int(intermediate)
        self.num_experts = int(num_experts)
        self.topk = int(topk)
        self.max_tokens = int(max_tokens)
        self.num_sms = int(num_sms)
        self.group = group
        self.comm_source = ""
        with _OnDevice(self.device):
            self._comm = self._make_comm(group, comm)
            try:
                self.rank = _lib.comm_rank(self._comm)
                self.world_size = _lib.comm_world_size(self._comm)
                capacity = _lib.LayerConfig(
                    hidden=self.hidden,
                    intermediate=self.intermediate,
                    num_experts=self.num_experts,
                    topk=self.topk,
                    max_tokens_per_rank=self.max_tokens,
                    swiglu_clamp=0.0,
                    num_sms=self.num_sms,
                    weight_format=_WEIGHT_FORMATS[weight_dtype],
                    scale_format=_lib.SCALES_FP32,
                )
                self._handle = _lib.workspace_create(self._comm, capacity)
            except BaseException:
                _lib.destroy("comm", self._comm)
                self._comm = 0
                raise
        self._closed = False

    def _make_comm(self, group: Any, how: str) -> int:
        import torch.distributed as dist

        initialised = dist.is_available() and dist.is_initialized()
        if group is None and not initialised:
            # One rank, no process group: a communicator of one.
            self.comm_source = "unique_id (world of one)"
            return _lib.comm_init_rank(_lib.nccl_unique_id(), 1, 0, self.device.index)
        if not initialised:
            _fail(
                "group was given but torch.distributed is not initialised: call dist.init_process_group('nccl') first"
            )
        if group is None:
            group = dist.group.WORLD
        self.group = group
        backend = str(dist.get_backend(group))
        if "nccl" not in backend:
            raise Unsupported(f"the process group's backend is {backend!r}: epfuse needs an NCCL group")
        rank, world = dist.get_rank(group), dist.get_world_size(group)
        if how in ("auto", "borrow"):
            # A library loaded before torch has its own NCCL: torch's communicator is not for it.
            ptr = _torch_nccl_comm(group, self.device) if _lib.loaded_after_torch() else None
            # Every rank must take the same path (borrowing is local, the broadcast collective).
            everyone = torch.tensor([1 if ptr else 0], dtype=torch.int32, device=self.device)
            dist.all_reduce(everyone, op=dist.ReduceOp.MIN, group=group)
            if ptr is not None and int(everyone.item()) == 1:
                self.comm_source = "borrowed from the process group"
                return _lib.comm_borrow_nccl(ptr)
            if how == "borrow":
                raise Unsupported(
                    "cannot borrow the group's NCCL communicator on every rank: this torch does not expose it "
                    "(_comm_ptr()), or libepfuse_c.so was loaded before torch (it then has an NCCL of its own)"
                )
        ids: list[bytes | None] = [_lib.nccl_unique_id() if rank == 0 else None]
        dist.broadcast_object_list(ids, src=dist.get_global_rank(group, 0), group=group, device=self.device)
        uid = ids[0]
        assert isinstance(uid, bytes)
        self.comm_source = "unique_id broadcast over the process group"
        return _lib.comm_init_rank(uid, world, rank, self.device.index)

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def aborted(self) -> bool:
        """Whether the communicator was aborted (by abort(), or by a collective that timed out)."""
        return bool(self._comm) and _lib.comm_aborted(self._comm)

    def abort(self, reason: str = "epfuse.torch.Workspace.abort()") -> None:
        """Gives up on the world, for when a peer failed or may be dead (an epfuse.Timeout or
        epfuse.Aborted from a forward or check_errors, or a rank known to have died): aborts the
        communicator, then closes the layers, the workspace and the communicator, each locally, so it
        returns without waiting for any peer. A communicator epfuse made (comm_source "unique_id ...")
        is ended with ncclCommAbort; one borrowed from the process group is never aborted by epfuse,
        only marked unusable for it: abort the group yourself (e.g. dist.destroy_process_group() or
        ProcessGroupNCCL.abort()). Not collective; idempotent; nothing to do once closed."""
        if self._closed:
            return
        if self._comm:
            with _OnDevice(self.device):
                _lib.comm_abort(self._comm, reason)
        self.close()

    @property
    def handle(self) -> int:
        """The epfuse_workspace* (0 once closed)."""
        return self._handle

    def memory(self) -> dict[str, int]:
        """Device bytes the workspace holds: the symmetric window and the private buffers."""
        self._check_open()
        sym, priv = _lib.workspace_memory(self._handle)
        return {"symmetric_bytes": sym, "private_bytes": priv, "total_bytes": sym + priv}

    def layers(self) -> list[MoELayer]:
        """The open layers on this workspace, in creation order."""
        return [layer for ref in self._layers.values() if (layer := ref()) is not None and not layer.closed]

    def _check_open(self) -> None:
        if self._closed:
            raise InvalidArgument("the workspace is closed")

    def _add_layer(self, layer: MoELayer) -> None:
        self._layers[layer.layer_id] = weakref.ref(layer)

    def _forget_layer(self, layer_id: int) -> None:
        self._layers.pop(layer_id, None)

    def close(self) -> None:
        """Destroys the layers still open (newest first, the same order on every rank), the workspace,
        then the communicator (a borrowed one stays the process group's). Collective; idempotent."""
        if self._closed:
            return
        self._closed = True
        first_error: Error | None = None
        with _OnDevice(self.device):
            for ref in reversed(list(self._layers.values())):
                layer = ref()
                if layer is not None:
                    try:
                        layer.close()
                    except Error as e:
                        first_error = first_error or e
            self._layers.clear()
            for kind, attr in (("workspace", "_handle"), ("comm", "_comm")):
                handle = getattr(self, attr)
                setattr(self, attr, 0)
                if handle:
                    try:
                        _lib.destroy(kind, handle)
                    except Error as e:
                        first_error = first_error or e
        self.group = None
        if first_error is not None:
            raise first_error

    def __enter__(self) -> Workspace:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        _close_when_collected(self, getattr(self, "world_size", 1), "epfuse.torch.Workspace", "close()")

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"rank {self.rank}/{self.world_size} on {self.device}"
        return (
            f"Workspace(hidden={self.hidden}, intermediate={self.intermediate}, num_experts={self.num_experts}, "
            f"topk={self.topk}, max_tokens={self.max_tokens}, {state})"
        )


# layer_id -> layer, for the custom op (which takes plain ints and tensors). Weak: a layer nobody
# holds is collected as usual.
_REGISTRY: weakref.WeakValueDictionary[int, MoELayer] = weakref.WeakValueDictionary()
_REGISTRY_LOCK = threading.Lock()
_NEXT_ID = itertools.count(1)


def _layer_by_id(layer_id: int) -> MoELayer:
    layer = _REGISTRY.get(layer_id)
    if layer is None or layer.closed:
        _fail(f"epfuse::moe_forward: no open MoELayer with layer_id {layer_id} (closed, or collected)")
    return layer


class MoELayer:
    """One MoE layer on a Workspace, with this rank's experts w13 [E_local, 2I, H] (gate rows, then up
    rows) and w2 [E_local, H, I], bf16 CUDA contiguous. The weights are borrowed: the layer keeps
    references to them, and they must not be modified in place while it runs. num_experts =
    E_local * world size; rank r owns experts [r*E_local, (r+1)*E_local).

    FP8 experts (on a workspace made with weight_dtype=torch.float8_e4m3fn): w13 and w2
    torch.float8_e4m3fn with their 128 x 128 block scales w13_scale and w2_scale as DeepSeek-V3
    checkpoints hold them (check_fp8_weights); the layer copies the scales at creation. Tokens and the
    SwiGLU output are quantised 1x128 inside the layer; x and y stay bf16.

    max_tokens (default the workspace's) and num_sms (default the workspace's) may be smaller than the
    workspace's. Collective, like the workspace.
    """

    def __init__(
        self,
        workspace: Workspace,
        w13: torch.Tensor,
        w2: torch.Tensor,
        *,
        topk: int,
        swiglu_clamp: float = 0.0,
        max_tokens: int | None = None,
        num_sms: int | None = None,
        w13_scale: torch.Tensor | None = None,
        w2_scale: torch.Tensor | None = None,
    ) -> None:
        self._closed = True
        self._handle = 0
        if not isinstance(workspace, Workspace):
            _fail(f"workspace must be an epfuse.torch.Workspace, got {type(workspace).__name__}")
        workspace._check_open()
        fp8 = isinstance(w13, torch.Tensor) and w13.dtype == torch.float8_e4m3fn
        if fp8:
            e_local, hidden, inter, scale_format = check_fp8_weights(
                w13, w2, w13_scale, w2_scale, device=workspace.device
            )
            if workspace.weight_dtype != torch.float8_e4m3fn:
                _fail("FP8 experts need a workspace made with weight_dtype=torch.float8_e4m3fn")
        else:
            if w13_scale is not None or w2_scale is not None:
                _fail("w13_scale and w2_scale are for FP8 experts (torch.float8_e4m3fn); these are not")
            e_local, hidden, inter = check_weights(w13, w2, device=workspace.device)
            scale_format = _lib.SCALES_FP32
        self.workspace = workspace
        self.device = workspace.device
        # Detached: the op takes no gradient, and the C side reads the storage these point to.
        self.w13 = w13.detach()
        self.w2 = w2.detach()
        self.hidden = hidden
        self.intermediate = inter
        self.experts_per_rank = e_local
        self.num_experts = e_local * workspace.world_size
        self.topk = int(topk)
        self.max_tokens = workspace.max_tokens if max_tokens is None else int(max_tokens)
        self.swiglu_clamp = float(swiglu_clamp)
        self.num_sms = workspace.num_sms if num_sms is None else int(num_sms)
        self.weight_dtype = self.w13.dtype
        config = _lib.LayerConfig(
            hidden=hidden,
            intermediate=inter,
            num_experts=self.num_experts,
            topk=self.topk,
            max_tokens_per_rank=self.max_tokens,
            swiglu_clamp=self.swiglu_clamp,
            num_sms=self.num_sms,
            weight_format=_WEIGHT_FORMATS[self.weight_dtype],
            scale_format=scale_format,
        )
        with _OnDevice(self.device):
            if fp8:
                assert w13_scale is not None and w2_scale is not None  # check_fp8_weights
                self._handle = _lib.layer_create_fp8(
                    workspace.handle,
                    config,
                    self.w13.data_ptr(),
                    w13_scale.data_ptr(),
                    w13_scale.numel(),
                    self.w2.data_ptr(),
                    w2_scale.data_ptr(),
                    w2_scale.numel(),
                )
            else:
                self._handle = _lib.layer_create(workspace.handle, config, self.w13.data_ptr(), self.w2.data_ptr())
        with _REGISTRY_LOCK:
            self.layer_id = next(_NEXT_ID)
            _REGISTRY[self.layer_id] = self
        workspace._add_layer(self)
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def forward(
        self,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        x_scale: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """y [T, H] bf16 = the MoE layer of x [T, H] bf16, topk_ids [T, k] (global expert ids, -1 =
        dropped), topk_weights [T, k], on the current stream. Collective. FP8 layers also take x already
        quantised: x [T, H] torch.float8_e4m3fn with x_scale [T, ceil(H/128)] float32 (one scale per
        token per 128 channels, x = code * scale), sent as it is (every rank passes the same kind).

        Checked on the host before the call (epfuse.InvalidArgument, a ValueError): int64 topk_ids lie
        in [-1, num_experts) before they are narrowed to int32 (narrow_topk_ids), x_scale is finite and
        > 0 (check_x_scale_values); each costs one host synchronisation, and neither runs inside a
        CUDA graph capture. int32 ids are checked on the device (check_errors)."""
        return torch.ops.epfuse.moe_forward(x, topk_ids, topk_weights, self.w13, self.w2, self.layer_id, x_scale)

    __call__ = forward

    def check_errors(self) -> None:
        """Synchronises the current stream and raises what the device recorded (epfuse.InvalidArgument
        for bad expert ids, epfuse.Timeout for a peer that did not arrive, ...). After a device error
        the workspace stays failed: every later forward fails until it is re-created."""
        if self._closed:
            raise InvalidArgument(f"MoELayer {self.layer_id} is closed")
        with _OnDevice(self.device):
            _lib.layer_check_errors(self._handle, _stream_of(self.device))

    def _run(
        self,
        x: torch.Tensor,
        topk_ids: torch.Tensor,
        topk_weights: torch.Tensor,
        w13: torch.Tensor,
        w2: torch.Tensor,
        x_scale: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        for name, given, own in (("w13", w13, self.w13), ("w2", w2, self.w2)):
            if not isinstance(given, torch.Tensor) or given.data_ptr() != own.data_ptr() or given.shape != own.shape:
                _fail(f"{name} is not the tensor MoELayer {self.layer_id} was created with")
        tokens = check_forward_args(
            x,
            topk_ids,
            topk_weights,
            hidden=self.hidden,
            topk=self.topk,
            max_tokens=self.max_tokens,
            device=self.device,
            x_scale=x_scale,
        )
        if x_scale is not None and self.weight_dtype != torch.float8_e4m3fn:
            _fail(f"x_scale (quantised x) needs FP8 experts; MoELayer {self.layer_id} holds {self.weight_dtype}")
        if x_scale is not None:
            check_x_scale_values(x_scale)
        topk_ids = narrow_topk_ids(topk_ids, self.num_experts)
        if topk_weights.dtype != torch.float32:
            topk_weights = topk_weights.to(torch.float32)
        y = _new_output(x)
        _check_aligned("y", y)
        check_not_aliased(y, {"x": x, "x_scale": x_scale, "topk_ids": topk_ids, "topk_weights": topk_weights})
        with _OnDevice(self.device):
            stream = _stream_of(self.device)
            if x_scale is None:
                _lib.layer_forward(
                    self._handle, x.data_ptr(), topk_ids.data_ptr(), topk_weights.data_ptr(), tokens, y.data_ptr(),
                    stream
                )
            else:
                _lib.layer_forward_fp8(
                    self._handle, x.data_ptr(), x_scale.data_ptr(), topk_ids.data_ptr(), topk_weights.data_ptr(),
                    tokens, y.data_ptr(), stream
                )
        return y

    def close(self) -> None:
        """Destroys the layer (collective; idempotent). A CUDA graph that captured its forward must not
        be replayed afterwards."""
        if self._closed:
            return
        self._closed = True
        with _REGISTRY_LOCK:
            _REGISTRY.pop(self.layer_id, None)
        self.workspace._forget_layer(self.layer_id)
        handle, self._handle = self._handle, 0
        if handle:
            with _OnDevice(self.device):
                _lib.destroy("layer", handle)

    def __del__(self) -> None:
        ws = getattr(self, "workspace", None)
        world = getattr(ws, "world_size", 1) if ws is not None else 1
        _close_when_collected(self, world, f"epfuse.torch.MoELayer {getattr(self, 'layer_id', '?')}",
                              "close() (or the workspace's)")

    def __repr__(self) -> str:
        return (
            f"MoELayer(id={getattr(self, 'layer_id', None)}, hidden={getattr(self, 'hidden', None)}, "
            f"intermediate={getattr(self, 'intermediate', None)}, num_experts={getattr(self, 'num_experts', None)}, "
            f"topk={getattr(self, 'topk', None)}{', closed' if self._closed else ''})"
        )


@torch.library.custom_op("epfuse::moe_forward", mutates_args=())
def moe_forward(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    layer_id: int,
    x_scale: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """The MoE layer `layer_id` (an MoELayer's layer_id) on the current stream: y [T, H] bf16, a new
    tensor. w13 and w2 must be the layer's own weights (they are arguments so that graphs see the
    dependency). x_scale: x quantised by the caller (MoELayer.forward)."""
    return _layer_by_id(layer_id)._run(x, topk_ids, topk_weights, w13, w2, x_scale)


@moe_forward.register_fake
def _moe_forward_fake(
    x: torch.Tensor,
    topk_ids: torch.Tensor,
    topk_weights: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    layer_id: int,
    x_scale: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    torch._check(x.dim() == 2, lambda: f"x must be 2-D [tokens, hidden], got {x.dim()}-D")
    return x.new_empty(x.shape, dtype=torch.bfloat16)


def _moe_forward_setup_context(ctx: Any, inputs: Any, output: Any) -> None:
    pass


def _moe_forward_backward(ctx: Any, grad_y: torch.Tensor) -> Any:
    # epfuse serves inference: no gradient exists for the experts' weights or x. Raising here, rather
    # than torch's generic "no autograd formula", tells the caller what to do (also at torch.compile
    # time, which traces the backward when an input requires grad).
    raise Unsupported(
        "epfuse::moe_forward has no backward (epfuse is an inference layer): run the model under "
        "torch.no_grad() or torch.inference_mode(), or pass inputs that do not require grad"
    )


moe_forward.register_autograd(_moe_forward_backward, setup_context=_moe_forward_setup_context)
