"""Seed logs: server logs of earlier starts (`[search] seed_logs`) read into the records the
memory model learns from, kept once on the study, never as trials.

A seed is what a finished trial would have stored had it run that start: the setting (from the
log's `server_args=` line), the ledger (`logparse.accounting.build_ledger` over the last start, the
parser that reads trial logs), the outcome the log alone decides (`logparse.outcome.classify`:
a start that served or was stopped is `ok`, an OOM at startup or under load is itself) and the
reason line. A log autotune wrote for a trial has its `trial.json` beside it; from that record
come what a log cannot show: the stress peak and headroom the GPU probe measured, the error
rate, and the backend the trial ran on.

The rule across backends: the producer of a bare log cannot be known (the simulator writes
SGLang's formats), so a seed is accepted on either backend and tagged with its origin (the log's
path and the study's backend when it was stored); a log whose `trial.json` names another
backend is refused, so the model never fits a simulator's launch into a real study or the other
way round.

`read_seeds` checks each log against the study (a ledger, an ending that says something about
memory, the same fixed flags) and raises `ConfigError` on `search.seed_logs` with the fix;
`store_seeds` keeps them as the study attribute `seeds` when a run starts; `seeds_of` reads them
back. This module sits below the searches, which turn the records into their points.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, distribution_to_json, json_to_distribution

from autotune.config.schema import (
    HICACHE,
    Choices,
    Fixed,
    FlagValue,
    FloatRange,
    IntRange,
    Param,
    Scalar,
    StudyConfig,
)
from autotune.config.space import point_key, same_value
from autotune.errors import ConfigError
from autotune.logparse.accounting import build_ledger
from autotune.logparse.events import Kind
from autotune.logparse.ledger import Ledger
from autotune.logparse.lines import parse_lines
from autotune.logparse.outcome import Outcome, classify, reason_line
from autotune.logparse.serverargs import read_server_args
from autotune.record import keys
from autotune.record.stored import study_record

KEY = "search.seed_logs"
_ALIASES = {
    "tensor_parallel_size": "tp_size",
    "pipeline_parallel_size": "pp_size",
    "data_parallel_size": "dp_size",
    "model": "model_path",
}


@dataclass(frozen=True)
class Seed:
    """One seed log as the searches read it back."""

    index: int
    log: str
    """The path as the study file gives it."""
    origin: str
    """Where it came from, in one line: the log, and the backend of the study that stored it."""
    params: Mapping[str, Scalar]
    ledger: Ledger
    outcome: str
    reason: str
    feasible: bool
    violated: frozenset[str]
    stress_peak_gib: float | None
    headroom_gib: float | None

    @property
    def name(self) -> str:
        """How the seed is named to the operator: `seed N (server.log)`."""
        return f"seed {self.index} ({Path(self.log).name})"


@dataclass(frozen=True)
class Seeds:
    """Everything the study keeps of its seed logs."""

    points: tuple[Seed, ...]
    space: Mapping[str, BaseDistribution]
    """The searched parameters' distributions, for a first proposal before any trial finished."""
    min_headroom_gib: float
    backend: str


def read_seeds(cfg: StudyConfig) -> list[dict[str, Any]]:
    """Every seed log of the study as a JSON-safe record; `ConfigError` on the first bad one."""
    given = cfg.search.seed_logs
    return [read_seed(path, cfg, index=i + 1) for i, path in enumerate(given)]


def read_seed(path: Path, cfg: StudyConfig, *, index: int = 1) -> dict[str, Any]:
    """The record one seed log stands for (setting, last start's ledger, outcome, reason, and from a
    `trial.json` beside it the peak and headroom), checked against the study; a log that cannot seed
    it is a `ConfigError` on `search.seed_logs` saying why."""
    shown = _shown(path, cfg)
    try:
        with open(path, encoding="utf-8", errors="replace", newline="\n") as fh:
            log = parse_lines(fh)
    except OSError as exc:
        raise ConfigError(
            KEY, f"{shown}: cannot read it ({exc.strerror}); fix it or remove it"
        ) from None
    starts = log.of(Kind.SERVER_ARGS)
    if not starts:
        raise ConfigError(
            KEY,
            f"{shown}: no server_args line, so the setting it ran cannot be read; give the log "
            "of a whole server start (journalctl -u UNIT > server.log)",
        )
    first = starts[-1].line_no
    events = tuple(e for e in log.events if e.line_no >= first)
    batches = tuple(b for b in log.batches if b.line_no >= first)
    ledger = build_ledger(events)
    if ledger.p_gib is None:
        raise ConfigError(
            KEY,
            f"{shown}: no memory ledger (no `Load weight begin/end … avail mem` lines of the "
            "last start); give the log of a start that loaded its weights, or remove it",
        )
    verdict = classify(events, batches=batches)
    outcome = _outcome(verdict.outcome)
    if outcome is None:
        raise ConfigError(
            KEY,
            f"{shown}: the last start ended {verdict.outcome} ({verdict.cause or 'no cause'}), "
            "which says nothing about memory settings; give the log of a start that served, "
            "was stopped or ran out of memory",
        )
    if outcome == "ok" and not ledger.max_total_num_tokens:
        raise ConfigError(
            KEY, f"{shown}: no `KV Cache is allocated` line; give the log of a whole start"
        )
    args = read_server_args(starts[-1].text)
    _check_flags(shown, args, cfg.server.flags)
    params = _params(shown, args, ledger, cfg.search.params)
    rec = _trial_record(path)
    backend = rec.get("backend") if rec else None
    if isinstance(backend, str) and backend and backend != cfg.server.backend:
        raise ConfigError(
            KEY,
            f"{shown}: a {backend} trial's log (its trial.json says so) cannot seed a "
            f"{cfg.server.backend} study: the memory model never fits across backends; give a "
            f"log of the {cfg.server.backend} backend, or remove it",
        )
    peak = _float(rec.get("stress_peak_gib")) if rec else None
    headroom = _float(rec.get("headroom_gib")) if rec and outcome == "ok" else None
    error_rate = _float(rec.get("error_rate")) if rec and outcome == "ok" else None
    violated = _violated(cfg, outcome, headroom, error_rate)
    reason = ""
    if outcome != "ok":
        reason = reason_line(str(verdict.outcome), verdict.cause, verdict.evidence)
    producer = f"the trial.json beside it says {backend}" if backend else "producer unknown"
    return {
        "index": index,
        "log": shown,
        "origin": f"seed log {shown} ({producer}; stored into a {cfg.server.backend} study)",
        "params": params,
        "ledger": ledger.to_dict(),
        "outcome": outcome,
        "reason": reason,
        "evidence": list(verdict.evidence),
        "feasible": outcome == "ok" and not violated,
        "violated": sorted(violated),
        "stress_peak_gib": peak,
        "headroom_gib": headroom,
    }


def store_seeds(
    study: optuna.Study,
    cfg: StudyConfig,
    records: Sequence[Mapping[str, Any]],
    space: Mapping[str, BaseDistribution],
) -> None:
    """Keep the seeds on the study (once: a run with the same logs leaves them as they are)."""
    value = {
        "points": [dict(r) for r in records],
        "space": {k: distribution_to_json(d) for k, d in space.items() if not d.single()},
        "min_headroom_gib": cfg.constraints.min_headroom_gib,
        "backend": cfg.server.backend,
    }
    held = study_record(study).seeds
    if not records and held is None:
        return
    if held != json.loads(json.dumps(value)):
        study.set_user_attr(keys.SEEDS, value)


def seeds_of(study: optuna.Study) -> Seeds | None:
    """The seeds the study holds, or None; seeds stored on another backend are left out."""
    attrs = study_record(study)
    raw = attrs.seeds
    if not isinstance(raw, Mapping):
        return None
    backend = str(raw.get("backend", ""))
    held = attrs.backend
    if held is not None and backend and held != backend:
        return None
    points = []
    for p in raw.get("points", ()) or ():
        seed = _seed(p)
        if seed is not None:
            points.append(seed)
    space: dict[str, BaseDistribution] = {}
    for k, d in (raw.get("space") or {}).items():
        try:
            space[str(k)] = json_to_distribution(str(d))
        except (ValueError, KeyError, TypeError):
            continue
    if not points:
        return None
    head = _float(raw.get("min_headroom_gib")) or 0.0
    return Seeds(points=tuple(points), space=space, min_headroom_gib=head, backend=backend)


def origins(study: optuna.Study) -> list[str]:
    """One line per seed: where it came from."""
    seeds = seeds_of(study)
    return [s.origin for s in seeds.points] if seeds else []


def seeded_baseline(study: optuna.Study, baseline: Mapping[str, Scalar]) -> Seed | None:
    """The seed whose setting is the baseline's (every baseline parameter equal, in the space
    the seeds were stored with), or None."""
    seeds = seeds_of(study)
    if seeds is None or not baseline:
        return None
    key = point_key(baseline, seeds.space)
    for s in seeds.points:
        if key.within(point_key(s.params, seeds.space)):
            return s
    return None


# ---------------------------------------------------------------------------------------------


def _seed(p: object) -> Seed | None:
    if not isinstance(p, Mapping):
        return None
    params = p.get("params")
    led = p.get("ledger")
    if not isinstance(params, Mapping) or not isinstance(led, Mapping):
        return None
    return Seed(
        index=int(p.get("index", 0) or 0),
        log=str(p.get("log", "")),
        origin=str(p.get("origin", "")),
        params=dict(params),
        ledger=Ledger.from_dict(led),
        outcome=str(p.get("outcome", "")),
        reason=" ".join([str(p.get("reason", "")), *[str(e) for e in p.get("evidence", ()) or ()]]),
        feasible=bool(p.get("feasible", False)),
        violated=frozenset(str(v) for v in p.get("violated", ()) or ()),
        stress_peak_gib=_float(p.get("stress_peak_gib")),
        headroom_gib=_float(p.get("headroom_gib")),
    )


def _shown(path: Path, cfg: StudyConfig) -> str:
    try:
        return str(path.relative_to(cfg.path.parent))
    except ValueError:
        return str(path)


def _outcome(o: Outcome) -> str | None:
    """The ending a seed records: a start that served or was stopped held (`ok`); an OOM is
    itself; anything else says nothing about memory."""
    if o in (Outcome.READY, Outcome.STOPPED):
        return "ok"
    if o.is_oom:
        return str(o)
    return None


def _check_flags(
    shown: str, args: Mapping[str, Any], flags: Sequence[tuple[str, FlagValue]]
) -> None:
    """Every fixed flag of the study that the log's server_args show must have the same value."""
    for name, value in flags:
        dest = _ALIASES.get(name, name)
        if dest not in args:
            continue
        if not _same_flag(value, args[dest]):
            raise ConfigError(
                KEY,
                f"{shown}: ran --{name.replace('_', '-')} {_text(args[dest])}, the study fixes "
                f"{_text(value)} (server.flags.{name}); give a log of the same server, or "
                "remove it",
            )


def _params(
    shown: str, args: Mapping[str, Any], ledger: Ledger, params: Sequence[Param]
) -> dict[str, Scalar]:
    out: dict[str, Scalar] = {}
    for p in params:
        value = _param_value(p.name, args, ledger)
        if value is None:
            raise ConfigError(
                KEY,
                f"{shown}: its server_args do not show {p.name}, which the study searches; give "
                "a log whose server_args line shows it, or remove it",
            )
        value = _typed(p, value)
        if isinstance(p, Fixed) and not same_value(value, p.value):
            raise ConfigError(
                KEY,
                f"{shown}: ran {p.name}={_text(value)}, the study fixes {_text(p.value)} "
                f"(search.{p.name}); give a log of that setting, or remove it",
            )
        out[p.name] = value
    return out


def _param_value(name: str, args: Mapping[str, Any], ledger: Ledger) -> Scalar | None:
    if name == HICACHE:
        on = args.get("enable_hierarchical_cache", args.get("enable_hicache"))
        if on is False or (on is None and args.get(HICACHE) in (None, 0)):
            return 0
        size = args.get(HICACHE)
        return size if _scalar(size) else ledger.hicache_size_gb
    value = args.get(name)
    if _scalar(value):
        return value
    shown = getattr(ledger, name, None)
    return shown if _scalar(shown) else None


def _typed(p: Param, value: Scalar) -> Scalar:
    if isinstance(p, FloatRange) and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if isinstance(p, IntRange) and isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(p, Choices):
        for choice in p.values:
            if same_value(choice, value):
                return choice
    return value


def _violated(
    cfg: StudyConfig, outcome: str, headroom: float | None, error_rate: float | None
) -> set[str]:
    c = cfg.constraints
    out: set[str] = set()
    if Outcome.of(outcome).is_oom:
        out.add("oom")
    if c.min_headroom_gib > 0 and headroom is not None and headroom < c.min_headroom_gib:
        out.add("headroom_gib")
    if error_rate is not None and error_rate > c.max_error_rate:
        out.add("error_rate")
    return out


def _trial_record(log: Path) -> dict[str, Any] | None:
    """The trial.json autotune wrote beside a trial's server.log, when it is that log's record."""
    path = log.parent / "trial.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    logged = data.get("log_path")
    if isinstance(logged, str) and Path(logged).name != log.name:
        return None
    return data


def _scalar(v: object) -> bool:
    return isinstance(v, bool | int | float | str) and not (isinstance(v, float) and math.isnan(v))


def _float(v: object) -> float | None:
    if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
        return float(v)
    return None


def _same_flag(value: FlagValue, arg: object) -> bool:
    """Whether a fixed flag's value is what a log's server_args show for it (not a point: a
    bare flag is any true value, a list flag element by element, else the value or its text)."""
    if isinstance(value, bool):
        return bool(arg) is value
    if isinstance(value, tuple):
        if not isinstance(arg, list | tuple):
            return False
        if len(arg) != len(value):
            return False
        return all(_same_flag(v, a) for v, a in zip(value, arg, strict=True))
    if arg is None:
        return False
    if isinstance(arg, bool | int | float | str) and same_value(value, arg):
        return True
    return str(value) == str(arg)


def _text(v: object) -> str:
    if isinstance(v, tuple | list):
        return " ".join(str(x) for x in v)
    if isinstance(v, bool):
        return str(v).lower()
    return str(v)
