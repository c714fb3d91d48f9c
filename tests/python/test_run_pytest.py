"""run_pytest.py, ctest's entry to this suite, on small suites of its own in a temporary directory: a
run whose GPU tests all skip fails on a machine with a GPU (a fake `nvidia-smi -L` that lists one
stands for it here) and passes, saying so, where every GPU is hidden; a run with a GPU test that ran
passes; an empty suite, or one run with --min-gpus above the machine's GPUs, is "Skipped" (77). No GPU
needed."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

RUNNER = Path(__file__).resolve().parent / "run_pytest.py"

CONFTEST = '''
import os
import pytest

@pytest.fixture()
def cuda():
    if os.environ.get("FAKE_CUDA_RUNS") != "1":
        pytest.skip("no CUDA device")
    return None
'''

CPU_TEST = "def test_cpu():\n    assert True\n"
GPU_TEST = "import pytest\n\npytestmark = pytest.mark.usefixtures('cuda')\n\ndef test_gpu():\n    assert True\n"
GPU_MODULE_SKIPPED = "import pytest\n\npytest.importorskip('epfuse_no_such_module', reason='torch is not installed')\n\ndef test_gpu():\n    pass\n"


def run(
    tmp_path: Path, files: dict[str, str], *, smi: bool, runner_args: tuple[str, ...] = (), **env: str
) -> subprocess.CompletedProcess[str]:
    suite = tmp_path / "suite"
    suite.mkdir()
    for name, text in files.items():
        (suite / name).write_text(text)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if smi:
        fake = bin_dir / "nvidia-smi"
        fake.write_text("#!/bin/sh\necho 'GPU 0: Fake GPU (UUID: GPU-0)'\n")
        fake.chmod(0o755)
    environ = {k: v for k, v in os.environ.items() if k not in ("CUDA_VISIBLE_DEVICES", "FAKE_CUDA_RUNS")}
    environ.update(PATH=str(bin_dir), **env)
    return subprocess.run(
        [sys.executable, str(RUNNER), *runner_args, str(suite), "-q", "-rs", "-p", "no:cacheprovider", "--rootdir", str(suite)],
        capture_output=True,
        text=True,
        env=environ,
        cwd=suite,
        timeout=300,
    )


def test_all_gpu_tests_skipped_on_a_gpu_machine_fails(tmp_path: Path) -> None:
    out = run(tmp_path, {"conftest.py": CONFTEST, "test_cpu.py": CPU_TEST, "test_gpu_a.py": GPU_TEST}, smi=True)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FAILED: this machine has a GPU" in out.stdout and "all 1 GPU tests skipped" in out.stdout
    assert "1 x Skipped: no CUDA device" in out.stdout


def test_gpu_modules_skipped_at_collection_count_as_gpu_tests(tmp_path: Path) -> None:
    out = run(tmp_path, {"conftest.py": CONFTEST, "test_cpu.py": CPU_TEST, "test_gpu_b.py": GPU_MODULE_SKIPPED}, smi=True)
    assert out.returncode == 1, out.stdout + out.stderr
    assert "torch is not installed" in out.stdout


def test_a_gpu_test_that_ran_passes(tmp_path: Path) -> None:
    out = run(
        tmp_path, {"conftest.py": CONFTEST, "test_cpu.py": CPU_TEST, "test_gpu_a.py": GPU_TEST}, smi=True, FAKE_CUDA_RUNS="1"
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "FAILED" not in out.stdout


@pytest.mark.parametrize("visible", ["", "-1"])
def test_without_a_visible_gpu_skips_pass_visibly(tmp_path: Path, visible: str) -> None:
    out = run(
        tmp_path,
        {"conftest.py": CONFTEST, "test_cpu.py": CPU_TEST, "test_gpu_a.py": GPU_TEST},
        smi=True,
        CUDA_VISIBLE_DEVICES=visible,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "NOTE: no GPU here" in out.stdout and "SKIPPED" in out.stdout  # pytest's -rs line


def test_no_test_collected_is_skipped(tmp_path: Path) -> None:
    out = run(tmp_path, {"conftest.py": CONFTEST}, smi=False, CUDA_VISIBLE_DEVICES="")
    assert out.returncode == 77, out.stdout + out.stderr
    assert "SKIPPED: pytest collected no test" in out.stdout


def test_fewer_gpus_than_min_gpus_is_skipped(tmp_path: Path) -> None:
    # The fake nvidia-smi lists one GPU; where torch sees GPUs (a GPU machine) the count is torch's.
    out = run(
        tmp_path, {"conftest.py": CONFTEST, "test_gpu_a.py": GPU_TEST}, smi=True, runner_args=("--min-gpus", "2")
    )
    assert out.returncode == 77, out.stdout + out.stderr
    assert "SKIPPED: these tests need 2 GPUs, this machine has 1 (" in out.stdout
