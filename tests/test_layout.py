"""The package layout holds: imports point one way (import-linter's contracts in .importlinter),
and the tests mirror the packages (a folder tests/<package>/ for each package of autotune/, each
test file in the folder of the package it is about)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT = Path(sys.executable).with_name("lint-imports")
PACKAGES = frozenset(p.parent.name for p in (ROOT / "autotune").glob("*/__init__.py"))
WHOLE = frozenset({"reliability", "fixtures"})
"""Test folders that are not a package's: faults across the whole product, and log fixtures."""
DRIVERS = frozenset({"tests.simstudy", "tests.reliability.helpers"})
"""Helpers that run real `autotune` processes: a test using them is about what it runs."""
INSTRUMENTS = frozenset({"sim", "testing"})
"""Packages other packages' tests measure with (the simulator as the ground truth, the oracle,
the fake server): they count only for their own folders."""


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


@pytest.mark.parametrize(
    ("module", "line", "message"),
    [
        (
            "memory/model.py",
            "from autotune.review import winner",
            "autotune.memory is not allowed to import autotune.review",
        ),
        (
            "sim/server.py",
            "from autotune.errors import UsageError",
            "autotune.sim.server -> autotune.errors",
        ),
    ],
    ids=["an-upward-import-breaks-the-layers", "the-simulator-imports-nothing-outside-it"],
)
def test_a_forbidden_import_breaks_a_contract(
    tmp_path: Path, module: str, line: str, message: str
) -> None:
    tree = _copy(tmp_path)
    path = tree / "autotune" / module
    path.write_text(path.read_text() + f"\n{line}  # noqa\n")
    result = _lint(tree)
    assert result.returncode == 1
    assert message in result.stdout


def _test_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("test_*.py") if "__pycache__" not in p.parts)


def _has_a_test(path: Path) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return any(
        isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith("test_")
        for node in ast.walk(tree)
    )


def _imported(path: Path) -> set[str]:
    """The absolute modules `path` imports (`from tests import simstudy` names `tests.simstudy`)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names if node.module == "tests")
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
    return found


def test_every_package_has_a_test_folder_with_a_test() -> None:
    missing = [
        f"tests/{name}/"
        for name in sorted(PACKAGES)
        if not any(_has_a_test(p) for p in _test_files(ROOT / "tests" / name))
    ]
    assert not missing, f"packages without a test folder holding a test: {missing}"


def test_test_folders_are_packages_or_the_whole() -> None:
    strays = [
        str(d.relative_to(ROOT))
        for d in sorted((ROOT / "tests").iterdir())
        if d.is_dir() and d.name not in PACKAGES | WHOLE and _test_files(d)
    ]
    assert not strays, f"test folders named after no package of autotune/: {strays}"


def test_each_test_file_is_in_the_folder_of_the_package_it_imports_most() -> None:
    """Counted in distinct modules imported from each package. Left out: files that import no
    package (they run the command line), files that run real `autotune` processes through
    DRIVERS (they are about what they run, whatever they import to read its results), and the
    INSTRUMENTS outside their own folders. A tie is fine."""
    wrong: list[str] = []
    for name in sorted(PACKAGES):
        for path in _test_files(ROOT / "tests" / name):
            modules = _imported(path)
            if modules & DRIVERS:
                continue
            counts = Counter(
                m.split(".")[1]
                for m in modules
                if m.startswith("autotune.")
                and m.split(".")[1] in PACKAGES
                and (m.split(".")[1] not in INSTRUMENTS or m.split(".")[1] == name)
            )
            if counts and counts[name] < max(counts.values()):
                most = ", ".join(f"{k} {v}" for k, v in counts.most_common(3))
                wrong.append(f"{path.relative_to(ROOT)} (imports {most})")
    assert not wrong, "test files in another package's folder:\n" + "\n".join(wrong)
