"""epfuse: the expert-parallel MoE layer as one persistent CUDA kernel per GPU, from Python.

`import epfuse` needs neither torch nor a GPU; the native library (libepfuse_c.so) is loaded on
first use. `epfuse.torch` (needs torch) has the Workspace, the MoELayer and the custom op
`torch.ops.epfuse.moe_forward`; `epfuse.hf` runs HF transformers MoE blocks through them.
"""

from __future__ import annotations

from ._lib import C_API_VERSION, LayerConfig, LibraryError, c_api_version, library_path, load
from .errors import (
    Aborted,
    BootstrapError,
    CudaError,
    Error,
    InternalError,
    InvalidArgument,
    InvalidConfig,
    NcclError,
    Timeout,
    Unsupported,
)

__version__ = "0.1.0"

__all__ = [
    "C_API_VERSION",
    "LayerConfig",
    "LibraryError",
    "c_api_version",
    "library_path",
    "load",
    "Error",
    "InvalidConfig",
    "InvalidArgument",
    "CudaError",
    "NcclError",
    "BootstrapError",
    "Timeout",
    "Unsupported",
    "InternalError",
    "Aborted",
    "__version__",
]
