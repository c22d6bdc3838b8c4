"""The list of subcommands; each entry adds one subparser with `handler` set to its function."""

from __future__ import annotations

import argparse
from collections.abc import Callable

Registrar = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]

REGISTRARS: list[Registrar] = []


def _run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from autotune.run_cmd import register

    register(sub)


def _status(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from autotune.status_cmd import register

    register(sub)


REGISTRARS += [_run, _status]


def _ledger(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from autotune.ledger_cmd import register

    register(sub)


REGISTRARS.append(_ledger)


def _report(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from autotune.report_cmd import register

    register(sub)


def _explain(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from autotune.explain import register

    register(sub)


def _export(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from autotune.export import register

    register(sub)


def _confirm(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from autotune.confirm import register

    register(sub)


REGISTRARS += [_report, _explain, _export, _confirm]
