"""Asking the real SGLang (in the `sglang_python` fixture's venv) what it declares or prints."""

from __future__ import annotations

import subprocess
from pathlib import Path


def run_in_sglang(python: Path, source: str, *args: str, timeout: float = 300) -> str:
    """Run `source` with SGLang's Python; its stdout (a failure shows its stderr)."""
    done = subprocess.run(
        [str(python), "-c", source, *args], capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout
