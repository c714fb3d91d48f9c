"""Shared fixtures of the Python package tests.

The package under test: the installed `epfuse` if there is one, else the source tree's python/
(ctest sets PYTHONPATH to it and EPFUSE_LIB to the built libepfuse_c.so).

Fixtures skip, with the reason in pytest's summary (-rs), what this machine cannot run: `torch_mod`
(torch not installed), `transformers_mod`, `lib` (no libepfuse_c.so: only when EPFUSE_LIB is unset;
a set EPFUSE_LIB that does not load is a failure), `cuda` (no CUDA device).

EPFUSE_TORCH_RESULTS=<path>: the GPU tests' checks are written there as one JSON at the end.
"""

from __future__ import annotations

import datetime
import importlib
import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
HEADER = REPO_ROOT / "include" / "epfuse" / "c_api.h"

try:
    import epfuse  # noqa: F401
except ImportError:
    sys.path.insert(0, str(REPO_ROOT / "python"))
    import epfuse  # noqa: F401


def _optional(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def pytest_report_header(config: pytest.Config) -> list[str]:
    lines = [f"epfuse package: {Path(epfuse.__file__).parent}"]
    try:
        lines.append(f"epfuse library: {epfuse.library_path()}")
    except Exception as e:  # noqa: BLE001 - a header line, never a failure
        lines.append(f"epfuse library: not loaded ({e})")
    torch = sys.modules.get("torch") or _optional("torch")
    if torch is None:
        lines.append("torch: not installed (the torch and HF tests skip)")
    else:
        cuda = torch.cuda.is_available()
        lines.append(
            f"torch {torch.__version__}, CUDA devices: {torch.cuda.device_count() if cuda else 0}"
            + ("" if cuda else " (the GPU tests skip)")
        )
    tf = _optional("transformers")
    lines.append(f"transformers: {tf.__version__ if tf else 'not installed (the HF tests skip)'}")
    return lines


@pytest.fixture(scope="session")
def torch_mod() -> Any:
    torch = _optional("torch")
    if torch is None:
        pytest.skip("torch is not installed")
    return torch


@pytest.fixture(scope="session")
def transformers_mod(torch_mod: Any) -> Any:
    tf = _optional("transformers")
    if tf is None:
        pytest.skip("transformers is not installed")
    return tf


@pytest.fixture(scope="session")
def lib() -> Any:
    """The loaded libepfuse_c.so (epfuse._lib's ctypes CDLL)."""
    from epfuse import _lib

    if not os.environ.get("EPFUSE_LIB") and not os.path.exists(_lib.candidate_paths()[0]):
        pytest.skip(f"no {_lib.LIBRARY_NAME}: set EPFUSE_LIB to a build's src/capi/{_lib.LIBRARY_NAME}")
    return _lib.load()


@pytest.fixture(scope="session")
def cuda(torch_mod: Any, request: pytest.FixtureRequest) -> Any:
    """torch, on a machine with a CUDA device and the library; the current device is cuda:0."""
    if not torch_mod.cuda.is_available():
        pytest.skip("no CUDA device")
    request.getfixturevalue("lib")
    torch_mod.cuda.set_device(0)
    import epfuse.torch  # noqa: F401 - registers torch.ops.epfuse

    return torch_mod


# --- the results file (EPFUSE_TORCH_RESULTS) ---

_RESULTS: list[dict[str, Any]] = []


@pytest.fixture(scope="session")
def record() -> Any:
    """record(check=..., model=..., shape=..., max_abs_err=..., max_rel_err=..., verified=..., **more)
    adds one check to the results file."""

    def add(**entry: Any) -> None:
        _RESULTS.append(entry)

    return add


def _git_commit() -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    path = os.environ.get("EPFUSE_TORCH_RESULTS")
    if not path:
        return
    torch = sys.modules.get("torch")
    tf = sys.modules.get("transformers")
    device = None
    if torch is not None and torch.cuda.is_available():
        device = f"{torch.cuda.device_count()}x {torch.cuda.get_device_name(0)}"
    doc = {
        "device": device,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "commit": _git_commit(),
        "command": " ".join(shlex.quote(a) for a in [Path(sys.executable).name, "-m", "pytest", *sys.argv[1:]]),
        "torch": getattr(torch, "__version__", None),
        "transformers": getattr(tf, "__version__", None),
        "epfuse_library": _library_path_or_none(),
        "pytest_exit_status": int(exitstatus),
        "checks": _RESULTS,
        "all_verified": bool(_RESULTS) and all(c.get("verified") for c in _RESULTS),
    }
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(doc, indent=2) + "\n")


def _library_path_or_none() -> str | None:
    try:
        return epfuse.library_path()
    except Exception:  # noqa: BLE001
        return None


@pytest.fixture
def repo_script():
    """Loads a script of scripts/ by name (e.g. "trace_plot") as a module."""

    def load(name: str):
        spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "scripts" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod

    return load
