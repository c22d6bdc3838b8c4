"""A stored trial is read in one place: no module outside `autotune.record` reads Optuna's
`user_attrs` or `system_attrs` of a trial or a study by itself.

Every reader goes through `autotune.record.stored` (the attributes, typed, read once by name)
and the views built on it (`record.view.TrialView`, `record.stored.StudyRecord`), so an
attribute's name, its type and its fallbacks live in one module. Writing stays where it is: an
attribute set (`set_user_attr`), a trial built with `user_attrs=…`, an assignment."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "autotune"
READER = PACKAGE / "record"
ATTRS = frozenset({"user_attrs", "system_attrs"})


def reads(tree: ast.AST) -> list[int]:
    """The line of every read of `.user_attrs`/`.system_attrs` in `tree`: an attribute loaded,
    not one assigned or deleted (a keyword of a call, `user_attrs=…`, is no attribute at all)."""
    return sorted(
        node.lineno
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and node.attr in ATTRS and isinstance(node.ctx, ast.Load)
    )


def offending(package: Path = PACKAGE) -> list[str]:
    """`path:line` of each read outside the reader's package."""
    out: list[str] = []
    for path in sorted(package.rglob("*.py")):
        if path.is_relative_to(READER):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        out.extend(f"{path.relative_to(package.parent)}:{line}" for line in reads(tree))
    return out


def test_no_module_outside_record_reads_optuna_attributes() -> None:
    found = offending()
    assert not found, "read through autotune.record.stored instead:\n" + "\n".join(found)


def test_the_check_sees_a_read_and_lets_writes_pass() -> None:
    source = (
        "a = t.user_attrs.get('outcome')\n"
        "b = 'x' in study.system_attrs\n"
        "t.user_attrs = {}\n"
        "create_trial(user_attrs={'k': 1}, system_attrs={})\n"
        "study.set_user_attr('k', 1)\n"
    )
    assert reads(ast.parse(source)) == [1, 2]
