"""trial.json: the record of one trial (`TrialRecord`), what the study is told of it (`Result`,
through `TrialRecord.result`), and the file itself, owner-only and written atomically.

One module for the record and its file because the file is the record's only stored form: what
`write_record` writes is `TrialRecord.to_dict`, made JSON-safe as the study's attributes are
(`TrialRecord.result`), so trial.json and the storage hold the same figures.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from autotune.config.schema import Scalar
from autotune.errors import HarnessError
from autotune.logparse.outcome import Outcome
from autotune.record import keys
from autotune.trial.record import Measured, Result


@dataclass(frozen=True)
class TrialRecord:
    """What trial.json holds and what the study is told."""

    number: int
    state: str  # complete | fail | interrupted
    outcome: str
    reason: str
    params: Mapping[str, Scalar]
    argv: tuple[str, ...]
    ledger: Mapping[str, object]
    workload: Mapping[str, object]
    capacity_tokens: int
    throughput_tok_s: float
    headroom_gib: float | None
    error_rate: float | None
    p99_ttft_ms: float | None
    p99_itl_ms: float | None
    evidence: tuple[str, ...]
    phases: Mapping[str, float]
    log_path: str
    autotune_version: str
    sglang_version: str | None
    host: str
    backend: str
    fatal: str = ""
    stress_peak_gib: float | None = None
    teardown: tuple[str, ...] = ()
    """What the teardown waited for, and how long each process took to go."""
    log_notes: tuple[str, ...] = ()
    """What happened to server.log itself while the server ran (rotated, deleted)."""
    growth_gib: float | None = None
    """How far the server's footprint grew over the workload, read after flushing the cache
    before and after it (`autotune.trial.growth`); None when a flush or the probe failed."""
    exit_code: int | None = None
    """The server's main process's return code (negative: killed by that signal)."""
    exit_signal: str = ""
    """The signal that ended it (`SIGKILL`), "" when it exited or was never launched."""
    sender: str = ""
    """Who sent that signal: `autotune` (our stop), `oom_killer`, `outside`, "" (none or the
    server itself; `autotune.server.deaths`)."""
    host_state: tuple[str, ...] = ()
    """What stood in the server's way on the host when it died (a full disk, its port held by
    another process)."""

    def to_dict(self) -> dict[str, object]:
        """The record as trial.json holds it: sequences as lists, the growth under its key's
        name."""
        d = asdict(self)
        d["argv"] = list(self.argv)
        d["evidence"] = list(self.evidence)
        d["teardown"] = list(self.teardown)
        d["log_notes"] = list(self.log_notes)
        d["host_state"] = list(self.host_state)
        d[keys.GROWTH] = self.growth_gib  # the field bears the key's name
        return d

    def measured(self) -> Measured | None:
        """What a complete trial measured, for its objectives and constraints; None for a trial that
        did not complete (it is told as failed, without values)."""
        if self.state != "complete":
            return None
        return Measured(
            capacity_tokens=self.capacity_tokens,
            throughput_tok_s=self.throughput_tok_s,
            oom=Outcome.of(self.outcome).is_oom,
            crashed=Outcome.of(self.outcome).is_crash,
            error_rate=self.error_rate,
            headroom_gib=self.headroom_gib,
            p99_ttft_ms=self.p99_ttft_ms,
            p99_itl_ms=self.p99_itl_ms,
        )

    def result(self) -> Result:
        """The study's view: few flat attributes for tables, the whole record under `record`."""
        attrs: dict[str, object] = {
            keys.CAPACITY: self.capacity_tokens,
            keys.THROUGHPUT: self.throughput_tok_s,
            keys.HEADROOM: self.headroom_gib,
            keys.RECORD: _json_safe(self.to_dict()),
        }
        if self.exit_code is not None:
            attrs[keys.EXIT_CODE] = self.exit_code
            attrs[keys.EXIT_SIGNAL] = self.exit_signal
            attrs[keys.SENDER] = self.sender
        return Result(self.state, self.outcome, self.reason, self.measured(), attrs, self.fatal)


def private_dir(folder: Path) -> None:
    """Create a trial folder readable by its owner only (0o700), its `trials/` parent too: the
    server's log and the record hold the command line and what the server printed."""
    folder.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    folder.mkdir(mode=0o700, exist_ok=True)
    os.chmod(folder, 0o700)


def write_record(record: TrialRecord, trial_dir: Path) -> Path:
    """trial.json (owner-only), written atomically (a crash leaves the old file or the new one,
    never half)."""
    return _write_json(_json_safe(record.to_dict()), trial_dir)


def read_record(trial_dir: Path) -> dict[str, object] | None:
    """trial.json as written, None when there is none (or it cannot be read)."""
    try:
        data = json.loads((trial_dir / "trial.json").read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def rewrite_record(trial_dir: Path, record: Mapping[str, object]) -> Path:
    """Replace trial.json with `record` (a dict read with `read_record` and changed)."""
    return _write_json(_json_safe(record), trial_dir)


def _write_json(data: object, trial_dir: Path) -> Path:
    path = trial_dir / "trial.json"
    tmp = path.with_suffix(".json.tmp")
    try:
        private_dir(trial_dir)
        text = json.dumps(data, indent=2, sort_keys=True) + "\n"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        tmp.replace(path)
    except OSError as exc:
        raise HarnessError(f"cannot write {path}: {exc.strerror or exc}") from exc
    return path


def _json_safe(value: object) -> object:
    """Plain JSON types only; NaN and infinities become None (Optuna's storage rejects them)."""
    if isinstance(value, Mapping):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return None
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)
