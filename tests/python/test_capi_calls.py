"""Calls into libepfuse_c.so that need no GPU: the version, and NULL handles, which every function
rejects before touching CUDA, mapped to epfuse.InvalidArgument with the library's message."""

from __future__ import annotations

import ctypes
from typing import Any, Callable

import pytest

import epfuse
from epfuse import _lib


def test_api_version(lib: Any) -> None:
    assert epfuse.c_api_version() == _lib.C_API_VERSION == 4
    assert epfuse.library_path().endswith("libepfuse_c.so")


def _out() -> Any:
    return ctypes.byref(ctypes.c_void_p())


NULL = None
_cfg = _lib.LayerConfig(256, 256, 16, 4, 128, 0.0, 0, _lib.WEIGHTS_BF16, _lib.SCALES_FP32)
_cfg_fp8 = _lib.LayerConfig(256, 256, 16, 4, 128, 0.0, 0, _lib.WEIGHTS_FP8_BLOCK128, _lib.SCALES_FP32)

# (function, arguments, the message the library must give)
NULL_CALLS: list[tuple[str, Callable[[], tuple[Any, ...]], str]] = [
    (
        "epfuse_layer_forward",
        lambda: (NULL, NULL, NULL, NULL, 0, NULL, NULL),
        "epfuse_layer_forward: layer is NULL",
    ),
    ("epfuse_layer_check_errors", lambda: (NULL, NULL), "epfuse_layer_check_errors: layer is NULL"),
    (
        "epfuse_layer_create",
        lambda: (NULL, ctypes.byref(_cfg), NULL, NULL, _out()),
        "epfuse_layer_create: ws is NULL",
    ),
    (
        "epfuse_layer_create_fp8",
        lambda: (NULL, ctypes.byref(_cfg_fp8), NULL, NULL, 0, NULL, NULL, 0, _out()),
        "epfuse_layer_create_fp8: ws is NULL",
    ),
    ("epfuse_workspace_create", lambda: (NULL, ctypes.byref(_cfg), _out()), "epfuse_workspace_create: comm is NULL"),
    (
        "epfuse_workspace_memory",
        lambda: (NULL, ctypes.byref(ctypes.c_size_t()), ctypes.byref(ctypes.c_size_t())),
        "epfuse_workspace_memory: ws is NULL",
    ),
    ("epfuse_comm_rank", lambda: (NULL, ctypes.byref(ctypes.c_int())), "epfuse_comm_rank: comm is NULL"),
    ("epfuse_comm_world_size", lambda: (NULL, ctypes.byref(ctypes.c_int())), "epfuse_comm_world_size: comm is NULL"),
    ("epfuse_comm_borrow_nccl", lambda: (NULL, NULL), "epfuse_comm_borrow_nccl: out is NULL"),
    ("epfuse_nccl_unique_id", lambda: (NULL, 128), "epfuse_nccl_unique_id: id_out is NULL"),
    ("epfuse_comm_init_rank", lambda: (NULL, 128, 1, 0, 0, _out()), "epfuse_comm_init_rank: id is NULL"),
    ("epfuse_comm_abort", lambda: (NULL, b"a peer died"), "epfuse_comm_abort: comm is NULL"),
    ("epfuse_comm_aborted", lambda: (NULL, ctypes.byref(ctypes.c_int())), "epfuse_comm_aborted: comm is NULL"),
]


@pytest.mark.parametrize(("name", "args", "message"), NULL_CALLS, ids=[c[0] for c in NULL_CALLS])
def test_null_handle_is_invalid_argument(
    lib: Any, name: str, args: Callable[[], tuple[Any, ...]], message: str
) -> None:
    with pytest.raises(epfuse.InvalidArgument) as info:
        _lib.call(name, *args())
    e = info.value
    assert e.code == 2 and e.name == "EPFUSE_ERR_INVALID_ARGUMENT"
    assert e.function == name
    assert e.message == message
    # The message stays readable from the thread until its next call.
    assert _lib.last_error() == message


def test_success_clears_last_error(lib: Any) -> None:
    with pytest.raises(epfuse.InvalidArgument):
        _lib.call("epfuse_layer_check_errors", None, None)
    assert _lib.last_error() != ""
    _lib.call("epfuse_layer_destroy", None)  # destroying NULL is a no-op, like free(NULL)
    assert _lib.last_error() == ""


@pytest.mark.parametrize("kind", ["comm", "workspace", "layer"])
def test_destroy_null_is_a_no_op(lib: Any, kind: str) -> None:
    _lib.destroy(kind, 0)


def test_wrong_unique_id_size(lib: Any) -> None:
    buf = ctypes.create_string_buffer(64)
    with pytest.raises(epfuse.InvalidArgument, match="id_bytes = 64, an ncclUniqueId has 128"):
        _lib.call("epfuse_nccl_unique_id", buf, 64)


def test_init_rank_out_of_range(lib: Any) -> None:
    with pytest.raises(epfuse.InvalidArgument, match="rank 3 of world 2"):
        _lib.comm_init_rank(bytes(128), 2, 3, 0)


def test_python_wrapper_rejects_a_short_unique_id() -> None:
    with pytest.raises(ValueError, match="128 bytes"):
        _lib.comm_init_rank(b"short", 1, 0, 0)


@pytest.mark.parametrize("torch_first", [True, False])
def test_loaded_after_torch(lib: Any, torch_first: bool) -> None:
    """epfuse.torch borrows torch's communicator only from a library loaded after torch (one NCCL in
    the process); loaded before, the library has its own NCCL and the workspace makes its own comm."""
    import os
    import subprocess
    import sys

    pytest.importorskip("torch", reason="torch is not installed")
    code = (
        "import epfuse, epfuse._lib as l\n"
        + ("import torch\nl.load()\n" if torch_first else "l.load()\nimport torch\n")
        + "print(l.loaded_after_torch())\n"
    )
    env = dict(os.environ, EPFUSE_LIB=epfuse.library_path())
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        cwd=os.path.dirname(os.path.dirname(epfuse.__file__)),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(torch_first)
