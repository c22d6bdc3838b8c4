"""The package layout holds: imports point one way (import-linter's contracts in .importlinter)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).with_name("lint-imports")


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT), "--config", str(tree / ".importlinter"), "--no-cache"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _copy(tmp: Path) -> Path:
    tree = tmp / "tree"
    shutil.copytree(
        ROOT / "autotune", tree / "autotune", ignore=shutil.ignore_patterns("__pycache__")
    )
    shutil.copy(ROOT / ".importlinter", tree / ".importlinter")
    return tree


def test_the_contracts_hold(tmp_path: Path) -> None:
    result = _lint(_copy(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_an_upward_import_breaks_the_layers(tmp_path: Path) -> None:
    tree = _copy(tmp_path)
    model = tree / "autotune" / "memory" / "model.py"
    model.write_text(model.read_text() + "\nfrom autotune.review import winner  # noqa\n")
    result = _lint(tree)
    assert result.returncode == 1
    assert "autotune.memory is not allowed to import autotune.review" in result.stdout


def test_the_simulator_imports_nothing_outside_it(tmp_path: Path) -> None:
    tree = _copy(tmp_path)
    server = tree / "autotune" / "sim" / "server.py"
    server.write_text(server.read_text() + "\nfrom autotune.errors import UsageError  # noqa\n")
    result = _lint(tree)
    assert result.returncode == 1
    assert "autotune.sim.server -> autotune.errors" in result.stdout
