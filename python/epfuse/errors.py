"""The exceptions of the epfuse package, one per error code of include/epfuse/c_api.h.

Every failure of the C library and every argument the Python wrappers reject raises an `Error`
subclass; `Error.code` is the C code (EPFUSE_ERR_*), `Error.name` its name.
"""

from __future__ import annotations

import builtins

# The codes of c_api.h (EPFUSE_ERR_* = epfuse::ErrorCode + 1); tests/python parses the header to
# check these numbers.
OK = 0
ERR_INVALID_CONFIG = 1
ERR_INVALID_ARGUMENT = 2
ERR_CUDA = 3
ERR_NCCL = 4
ERR_BOOTSTRAP = 5
ERR_TIMEOUT = 6
ERR_UNSUPPORTED = 7
ERR_INTERNAL = 8
ERR_ABORTED = 9

CODE_NAMES: dict[int, str] = {
    OK: "EPFUSE_OK",
    ERR_INVALID_CONFIG: "EPFUSE_ERR_INVALID_CONFIG",
    ERR_INVALID_ARGUMENT: "EPFUSE_ERR_INVALID_ARGUMENT",
    ERR_CUDA: "EPFUSE_ERR_CUDA",
    ERR_NCCL: "EPFUSE_ERR_NCCL",
    ERR_BOOTSTRAP: "EPFUSE_ERR_BOOTSTRAP",
    ERR_TIMEOUT: "EPFUSE_ERR_TIMEOUT",
    ERR_UNSUPPORTED: "EPFUSE_ERR_UNSUPPORTED",
    ERR_INTERNAL: "EPFUSE_ERR_INTERNAL",
    ERR_ABORTED: "EPFUSE_ERR_ABORTED",
}


class Error(RuntimeError):
    """An epfuse failure: `code` (EPFUSE_ERR_*), `name`, `message`, and `function` (the C function
    that failed, or "" for a check done in Python)."""

    code: int = ERR_INTERNAL

    def __init__(self, message: str, *, code: int | None = None, function: str = "") -> None:
        if code is not None:
            self.code = code
        self.message = message
        self.function = function
        super().__init__(message)

    @property
    def name(self) -> str:
        return CODE_NAMES.get(self.code, f"EPFUSE_ERR_{self.code}")

    def __str__(self) -> str:
        return f"[{self.name}] {self.message}"


class InvalidConfig(Error, ValueError):
    """A layer or workspace shape is out of range, or a layer does not fit its workspace."""

    code = ERR_INVALID_CONFIG


class InvalidArgument(Error, ValueError):
    """A bad argument: a NULL handle, or a tensor of the wrong dtype, device, shape or layout."""

    code = ERR_INVALID_ARGUMENT


class CudaError(Error):
    code = ERR_CUDA


class NcclError(Error):
    code = ERR_NCCL


class BootstrapError(Error):
    code = ERR_BOOTSTRAP


class Timeout(Error, builtins.TimeoutError):
    """A bounded wait ran past its bound (on the device: the message names rank, phase and flag)."""

    code = ERR_TIMEOUT


class Unsupported(Error):
    code = ERR_UNSUPPORTED


class InternalError(Error):
    code = ERR_INTERNAL


class Aborted(Error):
    """Another rank failed first; the message names it and why."""

    code = ERR_ABORTED


_BY_CODE: dict[int, type[Error]] = {
    cls.code: cls
    for cls in (
        InvalidConfig,
        InvalidArgument,
        CudaError,
        NcclError,
        BootstrapError,
        Timeout,
        Unsupported,
        InternalError,
        Aborted,
    )
}


def error_for_code(code: int, message: str, function: str = "") -> Error:
    """The exception for a nonzero return code of the C API (an unknown code gives a plain Error)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return Error(message, code=code, function=function)
    return cls(message, function=function)
