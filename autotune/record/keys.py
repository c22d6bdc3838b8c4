"""The names of the attributes a trial and its study are stored with, defined once for writers and
readers, and the flat form of a trial record's figures (`flat_attrs`: `ledger.kv_tokens`, …)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TypeGuard

OUTCOME = "outcome"
REASON = "reason"
CAPACITY = "capacity_tokens"
THROUGHPUT = "throughput_tok_s"
HEADROOM = "headroom_gib"
STRESS_PEAK = "stress_peak_gib"
GROWTH = "growth_gib"
"""A trial record's field: how far the server's GPU memory footprint grew over one trial's
workload beyond what its bursts explain (the allocator's growth while serving), GiB."""
EXIT_CODE = "exit_code"
"""The server's main process's return code (negative: the signal that ended it)."""
EXIT_SIGNAL = "exit_signal"
"""The name of the signal that ended the server (`SIGKILL`), "" when it exited by itself."""
SENDER = "signal_sender"
"""Who sent that signal: `autotune`, `oom_killer`, `outside`, or "" (none, or the server's own)."""
RECORD = "record"
"""The whole trial record (params, ledger, workload summary, log path, versions, host)."""
TRIAL_DIR = "trial_dir"
WORKER = "worker"
OBJECTIVES = "objectives"
"""A study attribute: the objectives the study was created with."""
BACKEND = "backend"
"""A study attribute: the backend (`sim` or `sglang`) whose trials the study holds."""
BASELINE = "baseline"
"""A study attribute: the operator's baseline point (the searched parameters of `[baseline]`),
queued first; every review surface measures the exported setting against it."""
FIXED_PARAMS = "fixed_params"
"""Optuna's system attribute for the parameters of an enqueued trial."""
FORECAST = "capacity_aware:forecast"
"""A trial's system attribute: the capacity search's forecast for it, with `kappa`, how much the
memory model's misses widened its margins when it was proposed."""
SEEDED_FROM = "search_seeds"
"""A trial attribute: where each seed log the search's memory model started from came from."""
SEARCH_DONE = "search_done"
"""A study attribute: the search found nothing left worth a launch, decided before the next ask
(so no trial is left behind): `{"reason": …, "trials": counted trials, "last_trial": N}`."""
SEEDS = "seeds"
"""A study attribute: the seed logs, `{"points": [...], "space": {...}, ...}` (`record.seeds`)."""
CHECK = "check"
"""A study attribute: what `autotune check` measured of its one launch, for the night's ETA:
`{"trial": N or None, "launch_s": …, "startup_s": …, "teardown_s": …, "log_bytes": …}`."""
SHORT_LOAD = "short_load"
"""A trial attribute: the trial ran `autotune check`'s short load (a few seconds of short answers
and one stress round), so its throughput and growth are not the study workload's; its pool,
ledger and stress peak are (`record.stored`)."""
CONFIRMATION = "confirmation"
"""A study attribute: the latest verdict of `autotune confirm`."""
CONFIRMATIONS = "confirmations"
"""A study attribute: the short history of confirmation verdicts, oldest first."""
SEARCH_RULE = "search_rule"
"""A trial attribute: the capacity search's rule that chose the trial's point."""
SEARCH_WHY = "search_why"
"""A trial attribute: why the capacity search chose the point, in a sentence."""
STRESS_REPEATS = "stress_repeats"
"""A trial attribute: how many times the trial runs its workload's stress phases, back to back on
the one launch (set by the capacity search where a setting must hold again: each pass that holds
counts as one hold, at a stress phase's cost instead of a launch's). Absent: once."""
RUNS_AS = "runs_as"
"""A trial attribute: the number of the measured trial a skipped trial was not launched for,
because SGLang would run its point as that trial's (the effective setting is equal)."""
SEARCH_STOP = "search_done"
"""A trial attribute: why the capacity search had nothing left worth a launch after this trial
(the name of the study's `SEARCH_DONE`, here on the trial)."""

METRIC_NAMES = {"capacity": CAPACITY, "throughput": THROUGHPUT}
"""Each objective's metric name on the study (`study.set_metric_names`): what Optuna's plots and
Optuna Dashboard label the axes with, the trial attribute's own name."""

LEDGER_PREFIX = "ledger."
"""Flat user attributes: one per figure of the trial's memory ledger, `ledger.<name>_<unit>`
(`ledger.kv_tokens`, `ledger.weights_gib`), written beside the nested `record` so Optuna
Dashboard and any Optuna reader show each figure as its own column."""

UNITS = ("_gib", "_gb", "_tokens", "_requests", "_ranks", "_gpus", "_s", "_fraction", "_ratio")
"""The unit a flat ledger key of a number ends in: GiB per GPU, decimal GB (host memory), tokens,
requests, ranks, GPUs, seconds, a ratio; `mem_fraction_static` keeps SGLang's flag name, which
says it is a fraction (of the GPU's memory)."""

LEDGER_RENAMES = {
    "max_total_num_tokens": "kv_tokens",
    "chunked_prefill_size": "chunked_prefill_tokens",
    "context_len": "context_tokens",
    "page_size": "page_tokens",
    "graph_max_bs": "graph_max_batch_requests",
    "ranks": "logged_ranks",
    "tp_size": "tp_gpus",
    "pp_size": "pp_gpus",
    "dp_size": "dp_ranks",
    "max_total_tokens_cap": "max_total_tokens_cap_tokens",
    "requested_cuda_graph_max_bs": "requested_graph_max_batch_requests",
    "requested_context_length": "requested_context_tokens",
    "requested_chunked_prefill_size": "requested_chunked_prefill_tokens",
}
"""Ledger fields whose names end in no unit, as their flat key names (the others keep theirs)."""

LEDGER_GROUPS = {"graph_phases": ("graph.", "_gib"), "startup_timings": ("startup.", "_s")}
"""Ledger fields that hold one figure per name: each becomes `ledger.<prefix><name><unit>`
(`ledger.graph.decode_gib`, `ledger.startup.load_weight_s`)."""

MAX_TEXT = 200
"""The longest string a flat ledger key holds (a dtype, a model type, a version)."""


def ledger_key(field: str) -> str:
    """The flat user attribute of one ledger field (`max_total_num_tokens` → `ledger.kv_tokens`)."""
    return LEDGER_PREFIX + LEDGER_RENAMES.get(field, field)


def ledger_attrs(ledger: object) -> dict[str, int | float | str]:
    """The ledger of a trial record (`Ledger.to_dict`) as flat user attributes: one key per
    figure the log showed (None ones are left out), its unit in the name. Keys stay far below
    the 512 characters of Optuna's RDB key column (`MAX_INDEXED_STRING_LENGTH`) and values are
    numbers or short strings, so every storage Optuna supports holds them whole."""
    if not isinstance(ledger, Mapping):
        return {}
    out: dict[str, int | float | str] = {}
    for field, value in ledger.items():
        group = LEDGER_GROUPS.get(str(field))
        if group is not None and isinstance(value, Mapping):
            prefix, unit = group
            for name, v in value.items():
                if _figure(v):
                    out[f"{LEDGER_PREFIX}{prefix}{name}{unit}"] = v
        elif _figure(value) or (isinstance(value, str) and 0 < len(value) <= MAX_TEXT):
            out[ledger_key(str(field))] = value
    return out


RECORD_FIGURES = (STRESS_PEAK, GROWTH, "error_rate", "p99_ttft_ms", "p99_itl_ms")
"""Figures of a trial record, besides the ledger, that are stored flat under their own names."""


def flat_attrs(record: object) -> dict[str, int | float | str]:
    """A trial record's figures as flat user attributes: the ledger's (`ledger_attrs`) and the
    workload's (`RECORD_FIGURES`); figures not measured are left out."""
    if not isinstance(record, Mapping):
        return {}
    out: dict[str, int | float | str] = {
        name: v for name in RECORD_FIGURES if _figure(v := record.get(name))
    }
    return {**out, **ledger_attrs(record.get("ledger"))}


def _figure(v: object) -> TypeGuard[int | float]:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
