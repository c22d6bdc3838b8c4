"""The signals that stop a run cleanly, defined once for the command line (`cli.common`), the
study runner and the trial's teardown (`trial.run`), and which of them came first (a SIGHUP
ends the run with another exit code than Ctrl-C: `cli.common.HUNG_UP`).

Kept apart from `trial.run` so that the command line can name them without importing the
workload driver and the server lifecycle.
"""

from __future__ import annotations

import signal

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""Ctrl-C, `systemctl stop`, a terminal (an SSH session) hanging up. Each stops the server and
records the trial as interrupted; one that is ignored when autotune starts (SIGHUP under
`nohup`) stays ignored."""

_received: list[int] = []


def received(signum: int) -> None:
    """Note that a stop signal came (every handler of one calls this, the teardown's, which holds
    it until the server is stopped, too): how the run ends depends on which came first."""
    _received.append(signum)


def first_received() -> int | None:
    """The first stop signal noted since `forget`, None if none came."""
    return _received[0] if _received else None


def forget() -> None:
    """Start a command afresh: no stop signal noted yet."""
    _received.clear()
