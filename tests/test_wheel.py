"""autotune installs like a tool: the wheel, in a fresh venv, runs the demo and the simulator from
an empty folder (the example studies and simulator profiles ship inside the package)."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.simstudy import assert_none_left

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.e2e


def _run(argv: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def test_the_wheel_runs_the_demo_from_an_empty_folder(tmp_path: Path) -> None:
    dist = tmp_path / "dist"
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(dist),
                  str(ROOT)], cwd=tmp_path)  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    [wheel] = list(dist.glob("autotune-*.whl"))
    env_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    python = env_dir / "bin" / "python"
    installed = _run([str(python), "-m", "pip", "install", "-q", str(wheel)], cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr[-2000:]

    empty = tmp_path / "empty"
    empty.mkdir()
    demo = _run([str(env_dir / "bin" / "autotune"), "run", "--study", "demo", "--n-trials", "2"],
                cwd=empty)  # fmt: skip
    assert demo.returncode == 0, demo.stdout[-2000:] + demo.stderr[-2000:]
    assert "study demo finished" in demo.stdout
    assert sorted(p.name for p in empty.iterdir()) == ["results"]
    status = _run([str(env_dir / "bin" / "autotune"), "status", "--study", "demo"], cwd=empty)
    assert status.returncode == 0 and "2 trials finished" in status.stdout, status.stdout

    listed = _run([str(python), "-c", "from autotune.sim.profiles import list_profiles as l; "
                   "print(' '.join(l()))"], cwd=empty)  # fmt: skip
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert "kimi-k2.5-tp8-96g" in listed.stdout.split(), listed.stdout
    assert_none_left(empty)
