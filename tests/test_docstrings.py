"""Every public definition in autotune/ says what it owns and why, in a docstring.

Public means what a reader of a module sees first: its module-level functions and classes, and
the methods and nested classes of its public classes, whose names do not start with `_` (dunder
methods and private helpers are left to their comments). A definition without a docstring is
listed by path, line and qualified name, so the one that is missing is found at once.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "autotune"

Definition = ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef


def _public(body: Sequence[ast.stmt], prefix: str = "") -> Iterator[tuple[str, Definition]]:
    """The public definitions of a module's or a public class's body, with their qualified names;
    a public class's own methods and nested classes follow it."""
    for node in body:
        if not isinstance(node, Definition) or node.name.startswith("_"):
            continue
        name = prefix + node.name
        yield name, node
        if isinstance(node, ast.ClassDef):
            yield from _public(node.body, name + ".")


def _definitions() -> Iterator[tuple[str, Definition]]:
    """Every public definition in the package, as `path:line Qual.name`."""
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for name, node in _public(tree.body):
            yield f"{path.relative_to(ROOT)}:{node.lineno} {name}", node


def test_the_rule_sees_the_package() -> None:
    names = [where for where, _ in _definitions()]
    assert len(names) > 500, "the walk found too few definitions: the package moved?"
    assert any(where.endswith(" Outcome.is_oom") for where in names), "methods are not visited"


def test_every_public_definition_has_a_docstring() -> None:
    missing = [where for where, node in _definitions() if ast.get_docstring(node) is None]
    assert not missing, f"{len(missing)} public definitions without a docstring:\n" + "\n".join(
        missing
    )
