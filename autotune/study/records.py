"""The trial folders, the study's second record, and how they are kept in step with the storage.

Every trial a worker launches gets `trials/NNNN/` (its number) under the worker's folder, with
the server's `server.log` and the trial's `trial.json`. Three rules keep that record true:

* a trial folder is created once, for one trial, and never written by another: `claim` refuses a
  folder that exists, and `check_folders` refuses a run whose storage holds fewer trials than the
  folders (a study.db deleted or emptied, another `--storage`), since its new trials would take
  the old ones' numbers and overwrite their logs and records;
* `trial.json` says what the storage says: once a trial is told, or failed as stale by a later
  run, `keep` rewrites its outcome, reason and state to the storage's (what the trial measured
  stays as `measured_outcome`) and adds the `storage` block: the trial as the storage holds it
  (state, parameters and their distributions, objective values, constraints and attributes);
* a trial told without a launch (skipped, refused before it started) has no folder: its line in
  `trials/not-launched.jsonl` holds its `storage` block;
* from those blocks `autotune.study.rebuild` gives a lost storage its trials back.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from optuna.trial import FrozenTrial

from autotune.errors import HarnessError, UsageError
from autotune.masking import redact
from autotune.record.stored import as_json, stored
from autotune.study.storage import default_storage_url
from autotune.trial.trialfile import read_record, rewrite_record

TRIALS = "trials"
STORAGE_BLOCK = "storage"
"""The key of `trial.json` that holds the trial as the storage holds it (`stored`)."""
NOT_LAUNCHED = "not-launched.jsonl"
"""The file under `trials/` that keeps the trials told without a launch (`keep_unlaunched`)."""
MEASURED_OUTCOME = "measured_outcome"
"""The key of `trial.json` that keeps what the trial measured when the storage recorded another
ending (stale, harness_error after a storage failure)."""

log = logging.getLogger("autotune.study.records")


def trial_dir(folder: Path, number: int) -> Path:
    """Where trial `number` of a worker whose folder is `folder` keeps its log and record."""
    return folder / TRIALS / f"{number:04d}"


def trial_folders(folder: Path) -> dict[int, Path]:
    """The trial folders under `folder/trials/`, by number (other entries are left out)."""
    root = folder / TRIALS
    if not root.is_dir():
        return {}
    return {int(p.name): p for p in sorted(root.iterdir()) if p.is_dir() and p.name.isdigit()}


def check_folders(folder: Path, numbers: Sequence[int], rebuild_hint: str) -> None:
    """Refuse a storage that does not know every trial folder of this worker: a trial it would
    number as one of theirs would overwrite that folder's log and record."""
    found = trial_folders(folder)
    unknown = sorted(set(found) - set(numbers))
    if not unknown:
        return
    raise UsageError(
        f"{folder / TRIALS} holds {len(found)} trial folders but the storage has {len(numbers)} "
        f"trials (none for {_numbers(unknown)}): restore the storage, run `{rebuild_hint}` to "
        "rebuild it from the trial folders, or use --results-dir elsewhere"
    )


def _numbers(ns: Sequence[int]) -> str:
    shown = ", ".join(f"{n:04d}" for n in ns[:4])
    return shown + (f" and {len(ns) - 4} more" if len(ns) > 4 else "")


def rebuild_command(name: str, study_folder: Path, url: str) -> str:
    """The `autotune rebuild` command line that gives the study at `url` its trials back from
    the trial folders under `study_folder` (`autotune.study.rebuild`)."""
    parts = ["autotune rebuild", f"--study {name}"]
    if study_folder.parent != Path("results"):
        parts.append(f"--results-dir {shlex.quote(str(study_folder.parent))}")
    if url != default_storage_url(study_folder):
        parts.append(f"--storage {shlex.quote(redact(url))}")
    return " ".join(parts)


def claim(folder: Path, number: int) -> Path:
    """Create trial `number`'s folder (owner-only, as `trial.trialfile.private_dir` keeps it); a
    HarnessError when it exists already: it holds another trial's log and record."""
    path = trial_dir(folder, number)
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        path.mkdir(mode=0o700)
    except FileExistsError:
        raise HarnessError(
            f"{path} exists already and holds another trial's record; it is never reused "
            "(restore the storage that holds that trial, or use another --results-dir)"
        ) from None
    except OSError as exc:
        raise HarnessError(f"cannot create {path}: {exc.strerror or exc}") from exc
    os.chmod(path, 0o700)
    return path


def agrees(record: Mapping[str, object], t: FrozenTrial) -> bool:
    """Whether `record` (a trial.json) tells the stored trial `t`'s story: the same outcome,
    and the trial as the storage holds it now."""
    outcome = stored(t).outcome or ""
    block = record.get(STORAGE_BLOCK)
    return record.get("outcome") == outcome and _same_json(block, as_json(t))


def keep(where: Path, t: FrozenTrial) -> bool:
    """Make trial.json in `where` agree with the finished trial `t` as stored; a folder without
    one (autotune was killed before it wrote it) gets one. False when there is nothing to keep:
    `t` still runs, or `where` is not the folder `t` recorded as its own (a trial refused a
    folder that holds another one's record, or never got that far), or the file cannot be
    written (a warning says why)."""
    if not t.state.is_finished() or not where.is_dir() or not owns(t, where):
        return False
    record: dict[str, Any] = dict(read_record(where) or {})
    if record and agrees(record, t):
        return True
    told = stored(t)
    outcome, reason = told.outcome or "", told.reason or ""
    written = record.get("outcome")
    if written and written != outcome and MEASURED_OUTCOME not in record:
        record[MEASURED_OUTCOME] = written
    if not record:
        record = {"number": t.number, "params": dict(t.params)}
    if written != outcome:
        record.update(
            state="complete" if t.state.name == "COMPLETE" else "fail",
            outcome=outcome,
            reason=reason,
        )
    record[STORAGE_BLOCK] = as_json(t)
    try:
        rewrite_record(where, record)
    except HarnessError as exc:
        log.warning("trial %d: %s; it agrees with the storage once rewritten", t.number, exc)
        return False
    return True


def keep_unlaunched(folder: Path, t: FrozenTrial) -> bool:
    """A trial told without a launch (skipped, refused before it started) has no trial folder;
    its line in `trials/not-launched.jsonl` (appended, owner-only) keeps it as the storage holds
    it, so the folders and that file hold every trial the storage was told. False when it could
    not be written (a warning says why) or a folder of that number exists."""
    if trial_dir(folder, t.number).exists():
        return False
    told = stored(t)
    line = {
        "number": t.number,
        "outcome": told.outcome or "",
        "reason": told.reason or "",
        STORAGE_BLOCK: as_json(t),
    }
    path = folder / TRIALS / NOT_LAUNCHED
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        with os.fdopen(fd, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line, sort_keys=True, default=str) + "\n")
    except OSError as exc:
        log.warning("trial %d: cannot write %s: %s", t.number, path, exc.strerror or exc)
        return False
    return True


def not_launched(folder: Path) -> dict[int, dict[str, Any]]:
    """The trials of `trials/not-launched.jsonl`, by number (the last line of a number wins;
    a line that cannot be read is left out)."""
    out: dict[int, dict[str, Any]] = {}
    try:
        lines = (folder / TRIALS / NOT_LAUNCHED).read_text(encoding="utf-8").splitlines()
    except OSError:
        return out
    for text in lines:
        try:
            entry = json.loads(text)
            out[int(entry["number"])] = entry
        except (ValueError, KeyError, TypeError):
            continue
    return out


def owns(t: FrozenTrial, where: Path) -> bool:
    """Whether `where` is the trial folder `t` recorded (`keys.TRIAL_DIR`) when it was launched."""
    recorded = stored(t).trial_dir
    return recorded is not None and Path(recorded).resolve() == where.resolve()


def reconcile(folder: Path, trials: Sequence[FrozenTrial]) -> list[int]:
    """`keep` every finished trial of this worker's folder whose trial.json does not agree with
    the storage (a run killed between telling a trial and rewriting its record, a trial failed as
    stale by this run or by another worker); the numbers rewritten."""
    found = trial_folders(folder)
    out = []
    for t in trials:
        where = found.get(t.number)
        if where is None or not t.state.is_finished():
            continue
        record = read_record(where)
        if record is not None and agrees(record, t):
            continue
        if keep(where, t):
            out.append(t.number)
    return out


def _same_json(a: object, b: object) -> bool:
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)
