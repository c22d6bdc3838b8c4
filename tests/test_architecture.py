"""docs/architecture.md is checked against the code: every module and name it places exists.

The page is the map a new reader trusts first; a row that names a module that was split, or a
function that was renamed, sends them to the wrong place. Each backticked `path.py` in its tables
(the "Old → new" table's left column names files that no longer exist, so only its right column
is read) must exist, and each backticked name in the parentheses right after it must be defined
in that module (a function, class, method, or module-level assignment).
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "architecture.md"
_PLACE = re.compile(r"`((?:[\w.-]+/)*[\w-]+\.py)`((?:\s*\((?:[^()]*)\))?)")
_NAME = re.compile(r"`([A-Za-z_][\w.]*)`")


def _file(path: str) -> Path:
    if path.startswith(("tests/", "scripts/", "autotune/")):
        return ROOT / path
    return ROOT / "autotune" / path


@cache
def _defined(path: Path) -> frozenset[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return frozenset(names)


def _rows() -> list[tuple[int, str]]:
    """The table rows of the page that describe today's code, with their line numbers."""
    rows: list[tuple[int, str]] = []
    section = ""
    for number, line in enumerate(PAGE.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("#"):
            section = line
            continue
        if not line.startswith("|"):
            continue
        if "Old" in section and "new" in section:
            cells = line.split("|")
            line = re.sub(r"\([^()]*→[^()]*\)", "", cells[2] if len(cells) > 2 else "")
        rows.append((number, line))
    return rows


def places() -> list[tuple[int, str, tuple[str, ...]]]:
    """Each (line, module path, names placed in it) the page's tables claim."""
    found: list[tuple[int, str, tuple[str, ...]]] = []
    for number, row in _rows():
        for match in _PLACE.finditer(row):
            group = match.group(2)
            prose = re.sub(r"`[^`]*`", "", group).strip(" ()")
            listed = not re.search(r"[A-Za-z]", prose) and "→" not in group
            names = (
                tuple(n for n in _NAME.findall(group) if not n.endswith(".py")) if listed else ()
            )
            found.append((number, match.group(1), names))
    return found


def test_the_page_names_modules() -> None:
    assert len(places()) > 40


def test_every_module_the_page_names_exists() -> None:
    missing = [f"line {n}: {p}" for n, p, _ in places() if not _file(p).is_file()]
    assert not missing, "docs/architecture.md names modules that do not exist: " + "; ".join(
        missing
    )


def test_every_name_the_page_places_is_defined_there() -> None:
    wrong = []
    for number, path, names in places():
        file = _file(path)
        if not file.is_file():
            continue
        for name in names:
            if name.split(".")[-1] not in _defined(file):
                wrong.append(f"line {number}: {name} in {path}")
    assert not wrong, "docs/architecture.md places names where they are not defined: " + "; ".join(
        wrong
    )


def _modules() -> list[Path]:
    return sorted((ROOT / "autotune").rglob("*.py"))


def _private_optuna(tree: ast.Module) -> list[int]:
    """Lines that import a private Optuna module or name, or read a private attribute of an
    object other than `self`/`cls` (Optuna's `study._storage`, `trial._trial_id`, …)."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("optuna"):
            private = any(p.startswith("_") for p in (node.module or "").split("."))
            if private or any(a.name.startswith("_") for a in node.names):
                lines.append(node.lineno)
        elif isinstance(node, ast.Import):
            if any(a.name.startswith("optuna") and "._" in a.name for a in node.names):
                lines.append(node.lineno)
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_"):
            if node.attr.startswith("__") or (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls", "argparse")
            ):
                continue
            lines.append(node.lineno)
    return lines


def test_only_the_shim_touches_optunas_private_api() -> None:
    """The claim "record/internals.py: Optuna's private API": a module that imports Optuna
    reaches nothing private of it, nor of any other object it holds (the shim wraps it)."""
    shim = ROOT / "autotune" / "record" / "internals.py"
    found = []
    for path in _modules():
        text = path.read_text(encoding="utf-8")
        if path == shim or not re.search(r"^\s*(import|from) optuna", text, re.M):
            continue
        found += [f"{path.relative_to(ROOT)}:{n}" for n in _private_optuna(ast.parse(text))]
    assert not found, "private Optuna API outside record/internals.py: " + ", ".join(found)


def test_private_optuna_reads_are_caught() -> None:
    caught = _private_optuna(
        ast.parse("from optuna.study._x import y\nstudy._storage.get(trial._trial_id)\n")
    )
    assert caught == [1, 2, 2]


def test_masking_lives_in_one_module() -> None:
    """The claim "masking.py: masking secrets": no other product module defines a masking,
    redacting or scrubbing function of its own (one that hands the work to `autotune.masking`
    is a delegate; the simulator, which imports nothing of autotune, aside)."""
    home = ROOT / "autotune" / "masking.py"
    found = []
    for path in _modules():
        if path == home or "sim" in path.relative_to(ROOT / "autotune").parts[:1]:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        delegates = {
            a.asname or a.name
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.module == "autotune.masking"
            for a in n.names
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if not re.match(r"_?(mask|redact|scrub)", node.name):
                continue
            called = {
                c.func.id
                for c in ast.walk(node)
                if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)
            }
            if not called & delegates:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name}")
    assert not found, "masking defined outside masking.py: " + ", ".join(found)


def test_the_command_line_computes_nothing() -> None:
    """The claim "cli/: argparse only": a subcommand parses its arguments, opens the study and
    hands the work on; it imports none of the packages that compute (the memory arithmetic, the
    log's reading, the search, the load driver)."""
    computing = ("autotune.memory", "autotune.logparse", "autotune.search", "autotune.loadgen")
    found = []
    for path in sorted((ROOT / "autotune" / "cli").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = (
                [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else []
            )
            found += [
                f"{path.relative_to(ROOT)}:{node.lineno} {n}"
                for n in names
                if n.startswith(computing)
            ]
    assert not found, "the command line imports a computing package: " + ", ".join(found)
