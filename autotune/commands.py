"""The list of subcommands; each entry adds one subparser with `handler` set to its function."""

from __future__ import annotations

import argparse
from collections.abc import Callable

Registrar = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]

REGISTRARS: list[Registrar] = []
