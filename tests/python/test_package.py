"""The package without torch and without a GPU: import, errors, library loading rules."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import epfuse
from epfuse import _lib, errors

PYTHON_DIR = str(Path(epfuse.__file__).resolve().parents[1])


def _run_python(code: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ)
    full_env["PYTHONPATH"] = PYTHON_DIR + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=full_env, timeout=120)


def test_import_without_torch() -> None:
    # sys.modules["torch"] = None makes any `import torch` fail, as on a machine without torch.
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import epfuse, epfuse.errors, epfuse._lib\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
        "try:\n"
        "    import epfuse.torch\n"
        "except ImportError:\n"
        "    print('epfuse.torch needs torch: ok')\n"
        "else:\n"
        "    raise SystemExit('epfuse.torch imported without torch')\n"
        "print('imported', epfuse.__version__)\n"
    )
    out = _run_python(code)
    assert out.returncode == 0, out.stderr
    assert "imported 0.1.0" in out.stdout
    assert "epfuse.torch needs torch: ok" in out.stdout


def test_import_does_not_load_the_library() -> None:
    # Loading waits for the first call, so that epfuse.torch gets torch's NCCL (see epfuse/_lib.py).
    out = _run_python("import epfuse, epfuse._lib as l; print(l._lib is None)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


def test_missing_library_is_a_clear_error(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "libepfuse_c.so"
    code = "import epfuse\ntry:\n    epfuse.load()\nexcept epfuse.LibraryError as e:\n    print('ERR', e)\n"
    out = _run_python(code, {"EPFUSE_LIB": str(missing)})
    assert out.returncode == 0, out.stderr
    assert "ERR epfuse: libepfuse_c.so not found" in out.stdout
    assert str(missing) in out.stdout
    assert "EPFUSE_LIB" in out.stdout


def test_library_that_does_not_load_is_a_clear_error(tmp_path: Path) -> None:
    bogus = tmp_path / "libepfuse_c.so"
    bogus.write_bytes(b"not an ELF file")
    out = _run_python(
        "import epfuse\ntry:\n    epfuse.load()\nexcept epfuse.LibraryError as e:\n    print('ERR', e)\n",
        {"EPFUSE_LIB": str(tmp_path)},  # a directory: the library inside it
    )
    assert out.returncode == 0, out.stderr
    assert f"ERR epfuse: cannot load {bogus}" in out.stdout
    assert "LD_LIBRARY_PATH" in out.stdout


def test_candidate_paths(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("EPFUSE_LIB", str(tmp_path))  # a directory: the library inside it, nothing else
    assert _lib.candidate_paths() == [str(tmp_path / "libepfuse_c.so")]
    monkeypatch.setenv("EPFUSE_LIB", str(tmp_path / "x.so"))
    assert _lib.candidate_paths() == [str(tmp_path / "x.so")]
    monkeypatch.delenv("EPFUSE_LIB")
    assert _lib.candidate_paths() == [str(Path(_lib.__file__).resolve().parent / "libepfuse_c.so")]


@pytest.mark.parametrize(
    ("code", "cls", "name"),
    [
        (1, epfuse.InvalidConfig, "EPFUSE_ERR_INVALID_CONFIG"),
        (2, epfuse.InvalidArgument, "EPFUSE_ERR_INVALID_ARGUMENT"),
        (3, epfuse.CudaError, "EPFUSE_ERR_CUDA"),
        (4, epfuse.NcclError, "EPFUSE_ERR_NCCL"),
        (5, epfuse.BootstrapError, "EPFUSE_ERR_BOOTSTRAP"),
        (6, epfuse.Timeout, "EPFUSE_ERR_TIMEOUT"),
        (7, epfuse.Unsupported, "EPFUSE_ERR_UNSUPPORTED"),
        (8, epfuse.InternalError, "EPFUSE_ERR_INTERNAL"),
        (9, epfuse.Aborted, "EPFUSE_ERR_ABORTED"),
    ],
)
def test_error_for_code(code: int, cls: type, name: str) -> None:
    e = errors.error_for_code(code, "something failed", "epfuse_fn")
    assert type(e) is cls
    assert isinstance(e, epfuse.Error)
    assert e.code == code
    assert e.name == name
    assert e.message == "something failed"
    assert e.function == "epfuse_fn"
    assert str(e) == f"[{name}] something failed"


def test_error_classes_are_also_builtin_kinds() -> None:
    assert issubclass(epfuse.InvalidArgument, ValueError)
    assert issubclass(epfuse.InvalidConfig, ValueError)
    assert issubclass(epfuse.Timeout, TimeoutError)
    assert issubclass(epfuse.Error, RuntimeError)
    unknown = errors.error_for_code(42, "from the future")
    assert type(unknown) is epfuse.Error and unknown.code == 42 and unknown.name == "EPFUSE_ERR_42"


def test_readme_example_compiles() -> None:
    # The GPU suite runs it (test_gpu_torch.py::test_readme_example); here: it is valid Python and short.
    readme = Path(__file__).resolve().parents[2] / "README.md"
    if not readme.exists():
        pytest.skip(f"{readme} not in this checkout")
    section = readme.read_text().split("## Using epfuse from PyTorch", 1)[1]
    block = section.split("```python\n", 1)[1].split("```", 1)[0]
    compile(block, "README example", "exec")
    assert len(block.strip().splitlines()) <= 12
