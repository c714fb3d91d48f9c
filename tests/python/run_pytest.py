"""ctest's entry to the Python package tests: runs pytest with the given arguments, after an optional
`--min-gpus N` (the run's tests need N GPUs).

Exit status:
- 77 (the test's SKIP_RETURN_CODE, ctest reports "Skipped") when pytest is not installed, collected
  no test, or the machine has fewer GPUs than --min-gpus;
- 1 on a machine with a GPU where every GPU test (a test using the `cuda` fixture of conftest.py)
  skipped: there a skipped GPU test means the suite did not test what it exists for (torch without
  CUDA, the library not loading, ...), and ctest must not report "Passed". The skip reasons are
  printed. Without a GPU, GPU tests skip visibly (-rs) and the run passes on its other tests;
- otherwise pytest's exit status.

A machine has a GPU when torch.cuda.is_available(), or when `nvidia-smi -L` lists one (a torch built
without CUDA sees none), unless CUDA_VISIBLE_DEVICES hides every device ("" or "-1").
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

try:
    import pytest
except ImportError:
    print(f"SKIPPED: pytest not installed for {sys.executable} (python3 -m pip install pytest)")
    sys.exit(77)


def gpu_count() -> tuple[int, str]:
    """(how many GPUs this machine has that the tests should use, how that was decided)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return 0, f"CUDA_VISIBLE_DEVICES={visible!r} hides every GPU"
    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.device_count(), f"torch.cuda.is_available() ({torch.cuda.device_count()} devices)"
    except Exception:  # noqa: BLE001 - no torch, or a broken one: ask the driver
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0, "torch sees no CUDA device and there is no nvidia-smi"
    try:
        out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        return 0, f"nvidia-smi -L failed ({e})"
    gpus = [line for line in out.stdout.splitlines() if line.startswith("GPU ")]
    if out.returncode == 0 and gpus:
        return len(gpus), f"nvidia-smi -L lists {len(gpus)} GPU(s)"
    return 0, "nvidia-smi -L lists no GPU"


def _reason(report: pytest.CollectReport | pytest.TestReport) -> str:
    longrepr = report.longrepr
    return str(longrepr[2]) if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)


class GpuTestTally:
    """The GPU tests: those using the `cuda` fixture, and the test_gpu_* modules that skipped whole at
    collection (pytest.importorskip of torch); which of them ran (passed or failed) and which skipped, why."""

    def __init__(self) -> None:
        self.gpu_tests: set[str] = set()
        self.ran: set[str] = set()
        self.skipped: dict[str, str] = {}

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.skipped and os.path.basename(report.nodeid.split("::")[0]).startswith("test_gpu"):
            self.gpu_tests.add(report.nodeid)
            self.skipped[report.nodeid] = _reason(report)

    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        self.gpu_tests |= {item.nodeid for item in items if "cuda" in getattr(item, "fixturenames", ())}

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.nodeid not in self.gpu_tests:
            return
        if report.skipped:
            self.skipped.setdefault(report.nodeid, _reason(report))
        elif report.when == "call" or report.failed:
            self.ran.add(report.nodeid)


def verdict(status: int, has_gpu: bool, why: str, tally: GpuTestTally) -> tuple[int, list[str]]:
    """The exit status of the run and the lines to print after pytest's own report."""
    if status == pytest.ExitCode.NO_TESTS_COLLECTED:
        return 77, ["SKIPPED: pytest collected no test"]
    if tally.gpu_tests and not tally.ran:
        if not has_gpu:
            return int(status), [f"NOTE: no GPU here ({why}): the {len(tally.gpu_tests)} GPU tests skipped"]
        lines = [
            f"FAILED: this machine has a GPU ({why}) but all {len(tally.gpu_tests)} GPU tests skipped, so "
            "nothing on the GPU was tested. Skip reasons:"
        ]
        reasons = sorted(set(tally.skipped.values()))
        lines += [f"  {sum(1 for r in tally.skipped.values() if r == reason)} x {reason}" for reason in reasons]
        return 1, lines
    return int(status), []


def main(args: list[str]) -> int:
    min_gpus = 0
    if args[:1] == ["--min-gpus"]:
        min_gpus, args = int(args[1]), args[2:]
    gpus, why = gpu_count()
    if gpus < min_gpus:
        print(f"SKIPPED: these tests need {min_gpus} GPUs, this machine has {gpus} ({why})")
        return 77
    tally = GpuTestTally()
    status = pytest.main(args, plugins=[tally])
    code, lines = verdict(status, gpus > 0, why, tally)
    for line in lines:
        print(line)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
