"""Under CI an SGLang oracle test that skips fails (tests/conftest.py's report hook), so an
oracle whose dependencies went missing cannot pass CI by checking nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CASES = """
import pytest

@pytest.mark.sglang
def test_oracle_skips() -> None:
    pytest.skip("SGLang's response code does not import here: No module named 'x'")

def test_other_skips() -> None:
    pytest.skip("no chromium")
"""


def _run(tmp_path: Path, ci: bool) -> str:
    (tmp_path / "conftest.py").write_text(
        "from tests.conftest import pytest_runtest_makereport  # noqa: F401\n"
    )
    (tmp_path / "test_cases.py").write_text(CASES)
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    env["PYTHONPATH"] = str(ROOT)
    if ci:
        env["CI"] = "true"
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120, check=False,
    )  # fmt: skip
    return done.stdout


def test_an_oracle_that_skips_fails_under_ci(tmp_path: Path) -> None:
    out = _run(tmp_path, ci=True)
    assert "1 failed, 1 skipped" in out, out
    assert "an SGLang oracle test skipped under CI: Skipped: SGLang's response code" in out


def test_outside_ci_it_skips(tmp_path: Path) -> None:
    assert "2 skipped" in _run(tmp_path, ci=False)
