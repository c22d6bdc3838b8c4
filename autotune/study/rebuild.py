"""A lost study storage rebuilt from the trial folders: `autotune rebuild`.

The trial folders are the study's second record (`autotune.study.records`): each `trial.json`
says what its trial measured and, in its `storage` block, how the storage held it. When the
storage is gone (study.db deleted or emptied, a database dropped), `rebuild` creates the study
again in an empty storage, trial by trial in number order, so that every trial keeps its number
and its folder:

* a trial.json with a `storage` block is restored as the storage held it (state, parameters and
  distributions, objective values, constraints, attributes, dates);
* a trial.json without one (a run killed between telling the trial and rewriting its record, or
  a record from before the block) is restored from the record alone: its parameters, and its
  objective values and constraints computed again with the study file's objectives and
  constraints, as the run computes them;
* a folder without trial.json (autotune was killed mid-trial and never resumed) becomes a FAIL
  `stale` trial, as a resume would have recorded it;
* a trial told without a launch (skipped, refused before it started) is restored from its line
  in `trials/not-launched.jsonl` as the storage held it;
* a number neither holds (a trial failed before it launched by a killed run's recovery or
  another worker, or one whose line was never written) becomes a FAIL `skipped` trial, which
  counts for nothing.

The study's own attributes come back from the study file as a first run sets them (objectives,
metric names, backend, baseline, seed logs), and the search's stop (`search_done`) is decided
again from the restored trials, as the run decides it before an ask; the queue a first run makes
(the baseline, the grid) is queued again from where the folders end, and so is every point cut
short (`Outcome.requeued`) that no later trial ran. The storage must hold no trial of the
study; the folders are only read.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, fields
from datetime import datetime
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, json_to_distribution
from optuna.samplers import RandomSampler
from optuna.trial import FrozenTrial, TrialState, create_trial

from autotune.config.schema import StudyConfig
from autotune.config.space import Space, distributions, same_point
from autotune.errors import UsageError
from autotune.logparse.outcome import Outcome
from autotune.masking import redact
from autotune.record import internals, keys
from autotune.record.seeds import read_seeds, store_seeds
from autotune.record.stored import stored, study_record
from autotune.study.loop import nothing_left, prepare, search_done
from autotune.study.objectives import constraint_values, objective_values
from autotune.study.records import STORAGE_BLOCK, not_launched, trial_folders
from autotune.study.runner import study_lock
from autotune.study.samplers import make_sampler
from autotune.study.storage import check_sqlite, open_study
from autotune.trial.record import Measured
from autotune.trial.trialfile import TrialRecord, read_record

KILLED = (
    "autotune was killed mid-trial and wrote no record; restored from its trial folder by "
    "`autotune rebuild`"
)
NO_FOLDER = "not launched: no trial folder holds it (restored by `autotune rebuild`)"


@dataclass(frozen=True)
class Rebuilt:
    """What a rebuild restored, by where each trial came from."""

    folders: int
    as_stored: int
    from_records: int
    killed: int
    without_folder: int
    queued: int

    def line(self, name: str, url: str) -> str:
        """The one line `autotune rebuild` prints: how many trials came back from where, the storage
        URL with its password redacted."""
        return (
            f"study {name} rebuilt in {redact(url)} from {self.folders} trial folders: "
            f"{self.as_stored} trials as the storage held them, {self.from_records} from their "
            f"records alone, {self.killed} killed mid-trial (stale), {self.without_folder} "
            f"numbers without a folder (skipped), {self.queued} points queued; see "
            f"`autotune status --study {name}`"
        )


def worker_folders(study_folder: Path) -> list[Path]:
    """The study folder and its workers' GPU-group folders (`workers.worker_folder`)."""
    return [study_folder, *sorted(p for p in study_folder.glob("gpus-*") if p.is_dir())]


def all_not_launched(study_folder: Path) -> dict[int, dict[str, Any]]:
    """Every worker's trials told without a launch (`records.not_launched`), by number."""
    found: dict[int, dict[str, Any]] = {}
    for base in worker_folders(study_folder):
        found.update(not_launched(base))
    return found


def all_trial_folders(study_folder: Path) -> dict[int, Path]:
    """Every worker's trial folders, by number; a number in two folders is refused."""
    found: dict[int, Path] = {}
    for base in worker_folders(study_folder):
        for number, path in trial_folders(base).items():
            if number in found:
                raise UsageError(
                    f"trial {number} has two folders, {found[number]} and {path}; they come "
                    "from two studies: move one away and rebuild again"
                )
            found[number] = path
    return found


def rebuild(cfg: StudyConfig, study_folder: Path, url: str) -> Rebuilt:
    """Give the storage at `url` the trials of study `cfg.name` back from its trial folders,
    holding every worker folder's lock meanwhile (no run may write them)."""
    with ExitStack() as locks:
        for base in worker_folders(study_folder):
            if (base / "trials").is_dir():
                locks.enter_context(study_lock(base))
        return _rebuild(cfg, study_folder, url)


def _rebuild(cfg: StudyConfig, study_folder: Path, url: str) -> Rebuilt:
    check_sqlite(url)  # an application's database given by mistake is refused first
    folders = all_trial_folders(study_folder)
    if not folders:
        raise UsageError(
            f"{study_folder} holds no trial folders (trials/NNNN) to rebuild study {cfg.name} "
            "from; check --results-dir and --study"
        )
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    seeds = read_seeds(cfg)
    study = open_study(cfg, url, RandomSampler(seed=0))
    held = study.get_trials(deepcopy=False)
    if held:
        raise UsageError(
            f"--storage {redact(url)}: study {cfg.name} holds {len(held)} trials already; a "
            "rebuild goes only into a storage without them (move the storage aside first)"
        )
    space = distributions(cfg.search)
    store_seeds(study, cfg, seeds, space)
    queue, baseline = _first_queue(cfg, seeds)
    if baseline is not None:
        study.set_user_attr(keys.BASELINE, baseline)
    unlaunched = all_not_launched(study_folder)
    counts = {"stored": 0, "record": 0, "killed": 0, "none": 0}
    rebuilt: list[FrozenTrial] = []
    last = max([*folders, *unlaunched])
    for number in range(last + 1):
        path = folders.get(number)
        record = read_record(path) if path is not None else None
        queued = queue[number] if number < len(queue) else {}
        try:
            if path is None and number in unlaunched:
                t, how = _as_stored(_search_order(unlaunched[number], cfg)), "stored"
            elif path is None:
                t, how = _placeholder(), "none"
            elif record is None or not record.get("outcome"):
                t, how = _killed(path, _searched(queued, space), space), "killed"
            elif isinstance(record.get(STORAGE_BLOCK), Mapping):
                t, how = _as_stored(_search_order(record, cfg)), "stored"
            else:
                t, how = _from_record(_search_order(record, cfg), path, cfg, space), "record"
        except (ValueError, KeyError, TypeError) as exc:  # a parameter outside today's search
            raise UsageError(
                f"trial {number} ({path}): cannot be restored ({exc}); rebuild with the study "
                "file it ran with"
            ) from None
        counts[how] += 1
        study.add_trial(t)
        rebuilt.append(t)
    points = [dict(p) for p in queue[last + 1 :]]
    points += _owed(rebuilt, points, space)
    for params in points:
        study.enqueue_trial(params)
    why = nothing_left(study, make_sampler(cfg.sampler))
    if why:  # the search's stop is the study's, not a trial's: decided again from the trials
        search_done(study, why)
    return Rebuilt(
        folders=len(folders),
        as_stored=counts["stored"],
        from_records=counts["record"],
        killed=counts["killed"],
        without_folder=counts["none"],
        queued=len(points),
    )


def _first_queue(
    cfg: StudyConfig, seeds: Sequence[Mapping[str, Any]]
) -> tuple[list[dict[str, object]], object]:
    """The points a first run queues (`loop.prepare`: the baseline, the grid) in their order,
    and the baseline attribute it sets; read from a study in memory."""
    directions = [optuna.study.StudyDirection.MAXIMIZE] * len(cfg.objectives)
    scratch = optuna.create_study(directions=directions)
    store_seeds(scratch, cfg, seeds, distributions(cfg.search))
    prepare(scratch, cfg)
    points = [internals.fixed_params(t) for t in scratch.get_trials(deepcopy=False)]
    return points, study_record(scratch).baseline


def _search_order(record: Mapping[str, Any], cfg: StudyConfig) -> dict[str, Any]:
    """`record` with its parameters in the order the study file lists them, the order a run
    suggests and records them in (trial.json is written with its keys sorted)."""
    order = {p.name: i for i, p in enumerate(cfg.search.params)}

    def ordered(params: object) -> object:
        if not isinstance(params, Mapping):
            return params
        return dict(sorted(params.items(), key=lambda kv: (order.get(kv[0], len(order)), kv[0])))

    out = dict(record)
    out["params"] = ordered(record.get("params"))
    block = record.get(STORAGE_BLOCK)
    if isinstance(block, Mapping):
        out[STORAGE_BLOCK] = {**block, "params": ordered(block.get("params"))}
    return out


def _as_stored(record: Mapping[str, Any]) -> FrozenTrial:
    block: Mapping[str, Any] = record[STORAGE_BLOCK]
    state = TrialState[str(block["state"])]
    user = dict(block.get("user_attrs") or {})
    if block.get("record"):
        user[keys.RECORD] = {k: v for k, v in record.items() if k != STORAGE_BLOCK}
    dists = {str(k): json_to_distribution(str(v)) for k, v in block["distributions"].items()}
    t = create_trial(
        state=state,
        values=block.get("values") if state == TrialState.COMPLETE else None,
        params=dict(block.get("params") or {}),
        distributions=dists,
        user_attrs=user,
        system_attrs=dict(block.get("system_attrs") or {}),
    )
    _dates(t, block.get("datetime_start"), block.get("datetime_complete"))
    return t


def _from_record(
    record: Mapping[str, Any], path: Path, cfg: StudyConfig, space: Mapping[str, BaseDistribution]
) -> FrozenTrial:
    """A trial from its record alone, told as the run tells it (`loop.tell`)."""
    params = _searched(record.get("params") or {}, space)
    measured = _measured(record)
    user: dict[str, Any] = {
        keys.OUTCOME: str(record.get("outcome", "")),
        keys.REASON: str(record.get("reason", "")),
        keys.TRIAL_DIR: str(path),
        keys.CAPACITY: record.get("capacity_tokens"),
        keys.THROUGHPUT: record.get("throughput_tok_s"),
        keys.HEADROOM: record.get("headroom_gib"),
        keys.RECORD: dict(record),
    }
    user = {**keys.flat_attrs(record), **user}
    if record.get("state") == "complete" and measured is not None:
        return create_trial(
            state=TrialState.COMPLETE,
            values=objective_values(measured, cfg.objectives),
            params=params,
            distributions={k: space[k] for k in params},
            user_attrs=user,
            system_attrs=internals.constraint_attrs(constraint_values(measured, cfg.constraints)),
        )
    return create_trial(
        state=TrialState.FAIL,
        params=params,
        distributions={k: space[k] for k in params},
        user_attrs=user,
    )


def _measured(record: Mapping[str, Any]) -> Measured | None:
    """What a complete record measured, read as the run reads it (`TrialRecord.measured`)."""
    names = {f.name for f in fields(TrialRecord)}
    try:
        tr = TrialRecord(**{k: v for k, v in record.items() if k in names})
    except TypeError:  # a record missing fields: nothing measured can be read from it
        return None
    return tr.measured()


def _killed(
    path: Path, params: Mapping[str, object], space: Mapping[str, BaseDistribution]
) -> FrozenTrial:
    return create_trial(
        state=TrialState.FAIL,
        params=dict(params),
        distributions={k: space[k] for k in params},
        user_attrs={keys.OUTCOME: "stale", keys.REASON: KILLED, keys.TRIAL_DIR: str(path)},
    )


def _placeholder() -> FrozenTrial:
    return create_trial(
        state=TrialState.FAIL, user_attrs={keys.OUTCOME: "skipped", keys.REASON: NO_FOLDER}
    )


def _searched(params: Mapping[str, Any], space: Mapping[str, BaseDistribution]) -> dict[str, Any]:
    """The parameters of `params` the study file searches (fixed ones are not Optuna's)."""
    return {k: v for k, v in params.items() if k in space}


def _owed(
    rebuilt: Sequence[FrozenTrial], queued: Sequence[Mapping[str, object]], space: Space
) -> list[dict[str, object]]:
    """Points of trials cut short (their ending runs the point again) that no later trial ran
    and that are not queued already (the same point of `space`): a run queued each again when
    it ended so."""
    out: list[dict[str, object]] = []
    for i, t in enumerate(rebuilt):
        params = dict(t.params)
        if not params or not Outcome.of(stored(t).outcome or "").requeued:
            continue
        later = [dict(u.params) for u in rebuilt[i + 1 :]] + [dict(q) for q in queued] + out
        if not any(same_point(params, p, space) for p in later):
            out.append(params)
    return out


def _dates(t: FrozenTrial, start: object, complete: object) -> None:
    if isinstance(start, str):
        t.datetime_start = datetime.fromisoformat(start)
    if isinstance(complete, str):
        t.datetime_complete = datetime.fromisoformat(complete)
