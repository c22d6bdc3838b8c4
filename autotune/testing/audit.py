"""Whether a study and its results folder agree, and whether a run left anything behind.

Used after faults (the reliability tests, `scripts/soak.py`): a trial is *lost* when the storage
still calls it running after the run ended, when a launched trial has no `trial.json`, or when
the record and the storage tell different stories. A process is *left behind* when it still runs
and mentions the results folder on its command line (every server autotune launches carries its
log or GPU-state folder there) or belongs to a process group or session that one of those
started.
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from optuna.trial import FrozenTrial, TrialState

from autotune.record.stored import stored
from autotune.server import procs

FINISHED = (TrialState.COMPLETE, TrialState.FAIL)


@dataclass(frozen=True)
class Leftover:
    """A live process that should not be there."""

    pid: int
    pgid: int
    sid: int
    cmdline: str


def problems(trials: Sequence[FrozenTrial], folder: Path) -> list[str]:
    """Every way in which the study `trials` and the results `folder` disagree ([] when none).

    A finished trial whose folder holds a trial.json must tell the storage's story there: the
    same outcome, and COMPLETE in the storage only when complete on disk (a trial the storage
    calls stale while its record still says what it measured is a disagreement); a trial stored
    with its record must have its trial.json."""
    out: list[str] = []
    for t in trials:
        if t.state == TrialState.RUNNING:
            out.append(f"trial {t.number} is still RUNNING in the storage")
            continue
        if t.state not in FINISHED:
            continue  # WAITING: a queued point
        told = stored(t)
        outcome = told.outcome
        if not outcome:
            out.append(f"trial {t.number} is {t.state.name} without an outcome")
            continue
        path = folder / "trials" / f"{t.number:04d}" / "trial.json"
        if not told.has_record and not path.exists():
            continue  # never launched here: stale before a launch, skipped, another worker's
        try:
            written = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            out.append(f"trial {t.number}: {path} unreadable ({exc})")
            continue
        if written.get("outcome") != outcome:
            out.append(
                f"trial {t.number}: trial.json says {written.get('outcome')!r}, "
                f"the storage {outcome!r}"
            )
        if t.state == TrialState.COMPLETE and written.get("state") != "complete":
            out.append(f"trial {t.number}: COMPLETE in the storage, {written.get('state')} on disk")
        if t.state == TrialState.FAIL and written.get("state") == "complete":
            out.append(f"trial {t.number}: FAIL in the storage, complete on disk")
    numbers = {t.number for t in trials}
    for path in sorted(folder.glob("trials/*/trial.json")):
        if int(path.parent.name) not in numbers:
            out.append(f"{path} belongs to no trial of the study")
    return out


def leftovers(
    marker: str, *, sessions: Collection[int] = (), spare: Collection[int] = ()
) -> list[Leftover]:
    """Live processes that mention `marker` on their command line, or run in a process group or
    session of one of those or in `sessions`; `spare` (and this process) are left out."""
    table = list(procs.all_procs())
    lines = {p.pid: _cmdline(p.pid) for p in table}
    groups = set(sessions)
    for p in table:
        if marker in lines[p.pid] and p.pid not in spare:
            groups.update((p.pgid, p.sid))
    groups -= {os.getpgrp(), os.getsid(0)}  # never this process's own group or session
    me = os.getpid()
    return [
        Leftover(p.pid, p.pgid, p.sid, lines[p.pid])
        for p in table
        if p.pid not in spare
        and p.pid != me
        and (marker in lines[p.pid] or p.pgid in groups or p.sid in groups)
    ]


def _cmdline(pid: int) -> str:
    try:
        return (
            (procs.PROC / str(pid) / "cmdline")
            .read_bytes()
            .replace(b"\0", b" ")
            .decode(errors="replace")
        )
    except OSError:
        return ""
