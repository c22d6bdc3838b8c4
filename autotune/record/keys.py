"""The names of the user attributes a trial is stored with, defined once for writers and readers."""

from __future__ import annotations

OUTCOME = "outcome"
REASON = "reason"
CAPACITY = "capacity_tokens"
THROUGHPUT = "throughput_tok_s"
HEADROOM = "headroom_gib"
STRESS_PEAK = "stress_peak_gib"
GROWTH = "growth_gib"
"""A trial record's field: how far the server's GPU memory footprint grew over one trial's
workload beyond what its bursts explain (the allocator's growth while serving), GiB."""
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
