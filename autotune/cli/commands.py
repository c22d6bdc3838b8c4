"""The subcommands: each module listed has `register(sub)`, adding its subparser and handler.

Modules are imported only when the parser is built, so the CLI's start-up pays for what it lists.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable

Registrar = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]

MODULES = (
    "autotune.cli.run",
    "autotune.cli.check",
    "autotune.cli.status",
    "autotune.cli.rebuild",
    "autotune.cli.ledger",
    "autotune.cli.report",
    "autotune.cli.explain",
    "autotune.cli.export",
    "autotune.cli.confirm",
    "autotune.cli.init",
)


def _registrar(module: str) -> Registrar:
    def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
        importlib.import_module(module).register(sub)

    return register


REGISTRARS: list[Registrar] = [_registrar(name) for name in MODULES]
