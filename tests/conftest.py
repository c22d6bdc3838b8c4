"""Fixtures every test folder may use: `no_leftovers`, the test's folder, checked at the end for
processes that outlive the test (see tests/simstudy.py); `fake_server`, which starts the fake
SGLang server (`autotune.testing.fakeserver`); `study_file`, a writer of study files;
`load_script`, a loader of `scripts/*.py` as modules; `sglang_python`, a Python with the
real SGLang package, the oracle for flags, log formats and response shapes (under CI an oracle
test that skips fails)."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from types import ModuleType

import pytest

from autotune.testing import fakeserver
from autotune.trial.signals import forget
from tests.reliability.helpers import World
from tests.simstudy import assert_none_left

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def no_stop_noted() -> None:
    """Each test starts as a command does (`cli.common.stop_signals`): no stop signal noted."""
    forget()


@pytest.fixture
def no_leftovers(tmp_path: Path) -> Iterator[Path]:
    """The test's folder; at the end no process mentioning it may be alive."""
    yield tmp_path
    assert_none_left(tmp_path)


@pytest.fixture
def fake_server() -> Iterator[Callable[..., fakeserver.Running]]:
    """Starts `python -m autotune.testing.fakeserver ARGS` on a free port; at the end each one's
    process group is killed and must be gone."""
    started: list[fakeserver.Running] = []

    def start(*args: str) -> fakeserver.Running:
        server = fakeserver.start(*args)
        started.append(server)
        return server

    yield start
    for server in started:
        assert server.stop(), f"fake server group {server.proc.pid} still alive"


@pytest.fixture
def load_script(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], ModuleType]:
    """Loads `scripts/NAME.py` as the module NAME, in `sys.modules` for the test's length (the
    script's dataclasses look their module up there)."""

    def load(name: str) -> ModuleType:
        spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        monkeypatch.setitem(sys.modules, name, module)
        spec.loader.exec_module(module)
        return module

    return load


@pytest.fixture
def study_file(tmp_path: Path) -> Callable[[str], Path]:
    """Write study text to tmp_path/configs/t.toml and return its path."""

    def write(text: str) -> Path:
        path = tmp_path / "configs" / "t.toml"
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        return path

    return write


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    """A test folder that runs real `autotune` processes and, at the end, checks that nothing
    they started is left and every foreign process the test started still lives."""
    w = World(tmp_path)
    try:
        yield w
    finally:
        w.finish()


@pytest.fixture(scope="session")
def sglang_python() -> Path:
    """The Python of a venv with SGLang (scripts/sglang_venv.py makes and caches it; CI names
    it in $AUTOTUNE_SGLANG_PYTHON). A missing oracle fails the test, it does not skip it."""
    given = os.environ.get("AUTOTUNE_SGLANG_PYTHON")
    if given:
        return Path(given)
    done = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "sglang_venv.py")],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"no SGLang venv for the oracle tests: {done.stderr.strip()[-500:]}")
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """Under CI (`CI` set), an oracle test (marker `sglang`) that skips fails instead: CI's SGLang
    venv holds everything SGLang's code imports, so a skip there means an oracle checked nothing."""
    report: pytest.TestReport = yield
    if os.environ.get("CI") and report.skipped and item.get_closest_marker("sglang") is not None:
        report.outcome = "failed"
        reason = report.longrepr[-1] if isinstance(report.longrepr, tuple) else report.longrepr
        report.longrepr = f"an SGLang oracle test skipped under CI: {reason}"
    return report
