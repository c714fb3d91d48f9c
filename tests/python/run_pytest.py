"""ctest's entry to the Python package tests: runs pytest with the given arguments. Exits 77 (the
test's SKIP_RETURN_CODE) when pytest is not installed or collected no test, so that ctest reports
"Skipped" rather than a failure; otherwise pytest's exit status (all-skipped is 0)."""

import sys

try:
    import pytest
except ImportError:
    print(f"SKIPPED: pytest not installed for {sys.executable} (python3 -m pip install pytest)")
    sys.exit(77)

status = pytest.main(sys.argv[1:])
if status == pytest.ExitCode.NO_TESTS_COLLECTED:
    print("SKIPPED: pytest collected no test")
    sys.exit(77)
sys.exit(int(status))
