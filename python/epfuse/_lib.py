"""ctypes binding of libepfuse_c.so (include/epfuse/c_api.h).

The library is loaded on first use, not at `import epfuse`: `import epfuse.torch` imports torch
before it, so that the process has one NCCL (torch's, which libepfuse_c.so then binds to by soname)
and a communicator borrowed from torch.distributed belongs to the library that uses it.

Where the library comes from: $EPFUSE_LIB (the .so, or a directory holding it, e.g. a CMake build's
src/capi), else the copy `pip install .` put next to this file.
"""

from __future__ import annotations

import ctypes
import os
import sys
import threading
from ctypes import POINTER, c_char_p, c_float, c_int, c_int32, c_int64, c_size_t, c_void_p
from typing import Any, Callable

from .errors import ERR_INTERNAL, error_for_code

# The version of c_api.h this binding was written against (EPFUSE_C_API_VERSION).
C_API_VERSION = 4
LIBRARY_NAME = "libepfuse_c.so"
# Bytes of an ncclUniqueId (NCCL_UNIQUE_ID_BYTES).
NCCL_UNIQUE_ID_BYTES = 128


# epfuse_layer_config.weight_format and .scale_format (EPFUSE_WEIGHTS_*, EPFUSE_SCALES_*).
WEIGHTS_BF16 = 0
WEIGHTS_FP8_BLOCK128 = 1
SCALES_FP32 = 0
SCALES_UE8M0 = 1


class LayerConfig(ctypes.Structure):
    """epfuse_layer_config: the shape of a layer (or the largest layer a workspace must hold).

    The fields are src/common/config_fields.h's list, in its order (tests/python/test_config_fields.py
    checks them against it and c_api.h). Ctypes takes positional values by order and unknown keywords
    silently: build one with every field by name."""

    _fields_ = [
        ("hidden", c_int32),
        ("intermediate", c_int32),
        ("num_experts", c_int32),
        ("topk", c_int32),
        ("max_tokens_per_rank", c_int32),
        ("swiglu_clamp", c_float),
        ("num_sms", c_int32),
        ("weight_format", c_int32),
        ("scale_format", c_int32),
    ]

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)}" for name, _ in self._fields_)
        return f"LayerConfig({fields})"


# Opaque handles (epfuse_comm*, epfuse_workspace*, epfuse_layer*) and device pointers are c_void_p.
HANDLE = c_void_p
HANDLE_OUT = POINTER(c_void_p)

# Every function of c_api.h: name -> (argtypes, restype). tests/python/test_capi_signatures.py parses
# the header and fails when the two disagree.
SIGNATURES: dict[str, tuple[list[Any], Any]] = {
    "epfuse_c_api_version": ([], c_int),
    "epfuse_last_error": ([], c_char_p),
    # communicators
    "epfuse_comm_borrow_nccl": ([c_void_p, HANDLE_OUT], c_int),
    "epfuse_nccl_unique_id": ([c_void_p, c_size_t], c_int),
    "epfuse_comm_init_rank": ([c_void_p, c_size_t, c_int, c_int, c_int, HANDLE_OUT], c_int),
    "epfuse_comm_destroy": ([HANDLE], c_int),
    "epfuse_comm_abort": ([HANDLE, c_char_p], c_int),
    "epfuse_comm_aborted": ([HANDLE, POINTER(c_int)], c_int),
    "epfuse_comm_rank": ([HANDLE, POINTER(c_int)], c_int),
    "epfuse_comm_world_size": ([HANDLE, POINTER(c_int)], c_int),
    # workspaces
    "epfuse_workspace_create": ([HANDLE, POINTER(LayerConfig), HANDLE_OUT], c_int),
    "epfuse_workspace_destroy": ([HANDLE], c_int),
    "epfuse_workspace_memory": ([HANDLE, POINTER(c_size_t), POINTER(c_size_t)], c_int),
    # layers
    "epfuse_layer_create": ([HANDLE, POINTER(LayerConfig), c_void_p, c_void_p, HANDLE_OUT], c_int),
    "epfuse_layer_create_fp8": (
        [HANDLE, POINTER(LayerConfig), c_void_p, c_void_p, c_int64, c_void_p, c_void_p, c_int64, HANDLE_OUT],
        c_int,
    ),
    "epfuse_layer_destroy": ([HANDLE], c_int),
    "epfuse_layer_forward": ([HANDLE, c_void_p, c_void_p, c_void_p, c_int, c_void_p, c_void_p], c_int),
    "epfuse_layer_forward_fp8": ([HANDLE, c_void_p, c_void_p, c_void_p, c_void_p, c_int, c_void_p, c_void_p], c_int),
    "epfuse_layer_check_errors": ([HANDLE, c_void_p], c_int),
}


class LibraryError(OSError):
    """libepfuse_c.so could not be found or loaded, or is of another C API version."""


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_path: str | None = None
_after_torch = False


def candidate_paths() -> list[str]:
    """Where load() looks: $EPFUSE_LIB alone when set (an explicit choice never falls back to another
    copy), else the package's own copy."""
    env = os.environ.get("EPFUSE_LIB")
    if env:
        env = os.path.abspath(env)
        return [os.path.join(env, LIBRARY_NAME) if os.path.isdir(env) else env]
    return [os.path.join(os.path.dirname(os.path.abspath(__file__)), LIBRARY_NAME)]


def _open(path: str) -> ctypes.CDLL:
    try:
        return ctypes.CDLL(path)
    except OSError as e:
        # The usual cause is a dependency (libnccl.so.2, libcublas.so.13) outside the loader's path.
        raise LibraryError(
            f"epfuse: cannot load {path}: {e}. Its dependencies (NCCL, cuBLAS) must be findable: "
            "import torch first (its NCCL and cuBLAS are then used), or add the CUDA/NCCL library "
            "directories (e.g. /usr/local/cuda/lib64) to LD_LIBRARY_PATH"
        ) from e


def load() -> ctypes.CDLL:
    """The loaded library, with every function's signature declared and the API version checked."""
    global _lib, _path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is not None:
            return _lib
        tried = candidate_paths()
        path = next((p for p in tried if os.path.exists(p)), None)
        if path is None:
            raise LibraryError(
                f"epfuse: {LIBRARY_NAME} not found (looked at {', '.join(tried)}). Install the package "
                "with `pip install .` from the repository root, or point EPFUSE_LIB at a build's "
                f"{LIBRARY_NAME} (cmake --build build --target epfuse_c: build/src/capi/{LIBRARY_NAME})"
            )
        lib = _open(path)
        missing = [name for name in SIGNATURES if not hasattr(lib, name)]
        if missing:
            raise LibraryError(f"epfuse: {path} lacks {', '.join(missing)}: a library of another version?")
        for name, (argtypes, restype) in SIGNATURES.items():
            fn = getattr(lib, name)
            fn.argtypes = argtypes
            fn.restype = restype
        version = lib.epfuse_c_api_version()
        if version != C_API_VERSION:
            raise LibraryError(
                f"epfuse: {path} has C API version {version}, this package needs {C_API_VERSION}: "
                "rebuild the library and the package from one checkout"
            )
        global _after_torch
        _after_torch = "torch" in sys.modules
        _lib, _path = lib, path
        return lib


def loaded_after_torch() -> bool:
    """Whether the library was loaded after torch, so that it uses torch's NCCL, cuBLAS and CUDA
    runtime (resolved by soname) rather than second copies: only then can it use a communicator
    borrowed from torch.distributed."""
    load()
    return _after_torch


def library_path() -> str:
    """The file load() loaded (loading it if needed)."""
    load()
    assert _path is not None
    return _path


def last_error() -> str:
    """epfuse_last_error(): the calling thread's last error message ("" if none)."""
    msg = load().epfuse_last_error()
    return msg.decode("utf-8", "replace") if msg else ""


def call(name: str, *args: Any) -> None:
    """Calls the C function `name`; a nonzero return raises the Error subclass of its code, with the
    library's message."""
    fn: Callable[..., int] = getattr(load(), name)
    code = fn(*args)
    if code != 0:
        message = last_error() or f"{name} failed with code {code}"
        raise error_for_code(code, message, name)


def c_api_version() -> int:
    return int(load().epfuse_c_api_version())


# --- thin wrappers, shared by epfuse.torch and anything else that holds raw device pointers ---


def nccl_unique_id() -> bytes:
    """A new ncclUniqueId (made by rank 0, sent to every rank for comm_init_rank)."""
    buf = ctypes.create_string_buffer(NCCL_UNIQUE_ID_BYTES)
    call("epfuse_nccl_unique_id", buf, NCCL_UNIQUE_ID_BYTES)
    return buf.raw


def comm_init_rank(unique_id: bytes, world_size: int, rank: int, device: int) -> int:
    if len(unique_id) != NCCL_UNIQUE_ID_BYTES:
        raise ValueError(f"unique_id must be {NCCL_UNIQUE_ID_BYTES} bytes, got {len(unique_id)}")
    out = c_void_p()
    call("epfuse_comm_init_rank", unique_id, NCCL_UNIQUE_ID_BYTES, world_size, rank, device, ctypes.byref(out))
    return _handle(out)


def comm_borrow_nccl(nccl_comm: int) -> int:
    out = c_void_p()
    call("epfuse_comm_borrow_nccl", c_void_p(nccl_comm), ctypes.byref(out))
    return _handle(out)


def comm_abort(comm: int, why: str) -> None:
    """epfuse_comm_abort: an owned communicator is ended with ncclCommAbort, a borrowed one marked
    unusable for epfuse; later calls on it raise epfuse.Aborted naming `why`."""
    call("epfuse_comm_abort", c_void_p(comm), why.encode("utf-8", "replace"))


def comm_aborted(comm: int) -> bool:
    v = c_int()
    call("epfuse_comm_aborted", c_void_p(comm), ctypes.byref(v))
    return bool(v.value)


def comm_rank(comm: int) -> int:
    v = c_int()
    call("epfuse_comm_rank", c_void_p(comm), ctypes.byref(v))
    return v.value


def comm_world_size(comm: int) -> int:
    v = c_int()
    call("epfuse_comm_world_size", c_void_p(comm), ctypes.byref(v))
    return v.value


def workspace_create(comm: int, capacity: LayerConfig) -> int:
    out = c_void_p()
    call("epfuse_workspace_create", c_void_p(comm), ctypes.byref(capacity), ctypes.byref(out))
    return _handle(out)


def workspace_memory(ws: int) -> tuple[int, int]:
    sym, priv = c_size_t(), c_size_t()
    call("epfuse_workspace_memory", c_void_p(ws), ctypes.byref(sym), ctypes.byref(priv))
    return sym.value, priv.value


def layer_create(ws: int, config: LayerConfig, w13: int, w2: int) -> int:
    out = c_void_p()
    call("epfuse_layer_create", c_void_p(ws), ctypes.byref(config), c_void_p(w13), c_void_p(w2), ctypes.byref(out))
    return _handle(out)


def layer_create_fp8(
    ws: int, config: LayerConfig, w13: int, w13_scales: int, w13_scales_count: int, w2: int, w2_scales: int,
    w2_scales_count: int,
) -> int:
    out = c_void_p()
    call(
        "epfuse_layer_create_fp8",
        c_void_p(ws),
        ctypes.byref(config),
        c_void_p(w13),
        c_void_p(w13_scales),
        w13_scales_count,
        c_void_p(w2),
        c_void_p(w2_scales),
        w2_scales_count,
        ctypes.byref(out),
    )
    return _handle(out)


def layer_forward_fp8(
    layer: int, x_fp8: int, x_scales: int, topk_idx: int, topk_weights: int, num_tokens: int, y: int, stream: int
) -> None:
    call(
        "epfuse_layer_forward_fp8",
        c_void_p(layer),
        c_void_p(x_fp8),
        c_void_p(x_scales),
        c_void_p(topk_idx),
        c_void_p(topk_weights),
        num_tokens,
        c_void_p(y),
        c_void_p(stream),
    )


def layer_forward(layer: int, x: int, topk_idx: int, topk_weights: int, num_tokens: int, y: int, stream: int) -> None:
    call(
        "epfuse_layer_forward",
        c_void_p(layer),
        c_void_p(x),
        c_void_p(topk_idx),
        c_void_p(topk_weights),
        num_tokens,
        c_void_p(y),
        c_void_p(stream),
    )


def layer_check_errors(layer: int, stream: int) -> None:
    call("epfuse_layer_check_errors", c_void_p(layer), c_void_p(stream))


def destroy(kind: str, handle: int) -> None:
    """epfuse_{kind}_destroy for kind in comm, workspace, layer."""
    call(f"epfuse_{kind}_destroy", c_void_p(handle))


def _handle(out: c_void_p) -> int:
    if not out.value:
        raise error_for_code(ERR_INTERNAL, "the C API returned success and a NULL handle", "")
    return int(out.value)
