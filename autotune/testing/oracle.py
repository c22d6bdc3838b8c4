"""Launches without launching: trial records produced by the simulator's pure model.

The benchmark (`scripts/bench_search.py`) and the sampler tests run whole studies in-process.
Each "launch" here plans the startup with `autotune.sim.model.plan_startup` (with the launch's
own jitter), writes the ledger the log would show (two-decimal GiB, as SGLang prints), drives a
stress phase of `STRESS_FORWARDS` full-chunk forwards with the profile's run-to-run variation,
and tells the study exactly what `autotune.trial.run` would: outcome, reason, headroom, stress peak,
capacity, throughput, constraints. The samplers only ever see those records; this module is the
stand-in for the machine and is never imported by them.

`stable` is the ground truth the benchmark scores against: the setting starts and passes the
stress phase, keeping the required headroom, with probability ≥ `STABLE_P`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import optuna

from autotune.config.space import grid, settings_for
from autotune.config.studyfile import (
    Budget,
    Choices,
    Constraints,
    FloatRange,
    Limits,
    SamplerConfig,
    Scalar,
    SearchConfig,
    ServerConfig,
    StudyConfig,
)
from autotune.config.workload import WorkloadSpec
from autotune.logparse.ledger import Ledger
from autotune.memory.model import phi
from autotune.sim.flags import ServerSettings
from autotune.sim.model import (
    StartupPlan,
    auto_mem_fraction,
    decode_throughput,
    gpu_class_defaults,
    plan_startup,
    transient_peak_gib,
)
from autotune.sim.profiles import Profile
from autotune.study.loop import tell
from autotune.study.objectives import constraint_values
from autotune.trial.record import Measured, Result

STRESS_FORWARDS = 200
STABLE_P = 0.95
CAUSES = {
    "kv_pool": "no_kv_room",
    "kv_budget": "no_kv_room",
    "pool_too_small": "pool_too_small",
    "graph_capture_oom": "graph_capture_failed",
    "alloc_oom": "torch_oom",
    "weights_oom": "torch_oom",
    "host_memory": "host_memory",
    "host_oom_killer": "host_oom_killer",
    "hicache_too_small": "hicache_too_small",
}
"""The simulator's startup failure kinds as the log parser names their causes
(`autotune.logparse.lines.Kind`); anything else is a start error."""
MEMORY_CAUSES = frozenset(
    {
        "no_kv_room",
        "pool_too_small",
        "graph_capture_failed",
        "torch_oom",
        "host_memory",
        "host_oom_killer",
    }
)
"""Causes `autotune.logparse.outcome.classify` calls a startup OOM (the rest: start errors)."""


@dataclass(frozen=True)
class Bench:
    """One profile's study: its search space, baseline, constraints and launch flags."""

    profile: Profile
    spec: bool
    search: SearchConfig
    constraints: Constraints

    @property
    def study_config(self) -> StudyConfig:
        server = ServerConfig(
            backend="sim",
            command=(),
            flags=(),
            env={},
            host="127.0.0.1",
            port=0,
            sim_profile=self.profile.name,
            sim_time_scale=None,
            sim_seed=0,
            limits=Limits(),
        )
        return StudyConfig(
            name=f"bench-{self.profile.name}",
            path=Path("bench.toml"),
            description="",
            server=server,
            search=self.search,
            workload=WorkloadSpec(phases=()),
            objectives=("capacity", "throughput"),
            constraints=self.constraints,
            budget=Budget(),
            sampler=SamplerConfig(),
            storage=None,
        )


def bench_for(profile: Profile, *, min_headroom_gib: float = 0.5) -> Bench:
    """The study an operator would write for this box: fraction, requests, host cache."""
    tp = profile.hardware.gpu_count
    spec = profile.draft is not None and profile.draft.algorithm.startswith("EAGLE")
    version = profile.sglang_version
    chunk, max_bs = gpu_class_defaults(profile.hardware.gpu_memory_mib, tp, version)
    auto = auto_mem_fraction(
        profile.hardware.gpu_memory_mib,
        chunk,
        16384,
        max_bs,
        tp,
        1,
        profile.draft.algorithm if spec and profile.draft else None,
        version=version,
    )
    base_f = 0.88 if spec else math.floor(auto * 100) / 100
    search = SearchConfig(
        params=(
            FloatRange("mem_fraction_static", 0.75, 0.98, 0.01),
            Choices("max_running_requests", (32, 48, 64, 96, 128)),
            Choices("hicache_size", (0, 24, 48, 96)),
        ),
        baseline={
            "mem_fraction_static": base_f,
            "max_running_requests": 48,
            "hicache_size": 48 if spec else 0,
        },
    )
    return Bench(profile, spec, search, Constraints(min_headroom_gib=min_headroom_gib))


def server_settings(bench: Bench, params: Mapping[str, Scalar]) -> ServerSettings:
    p = bench.profile
    h = float(params.get("hicache_size", 0) or 0)
    r = params.get("max_running_requests")
    c = params.get("chunked_prefill_size")
    return ServerSettings(
        chunked_prefill_size=int(c) if isinstance(c, int | float) else None,
        tp_size=p.hardware.gpu_count,
        mem_fraction_static=float(params["mem_fraction_static"]),
        max_running_requests=int(r) if isinstance(r, int | float) else None,
        enable_hierarchical_cache=h > 0,
        hicache_size=h,
        speculative_algorithm=p.draft.algorithm if bench.spec and p.draft else None,
        speculative_draft_model_path=p.draft.path if bench.spec and p.draft else None,
    )


def ledger_of(plan: StartupPlan) -> Ledger:
    """What the log of this startup shows, at the log's precision."""

    def r2(x: float | None) -> float | None:
        return round(x, 2) if x is not None else None

    final = plan.avail_final_gib if plan.ok else None
    return Ledger(
        p_gib=r2(plan.p_gib),
        weights_gib=r2(plan.weights_gib),
        avail_after_weights_gib=r2(plan.avail_after_weights_gib),
        max_total_num_tokens=plan.max_total_num_tokens,
        kv_gib=r2(plan.kv_gib),
        draft_weights_gib=r2(plan.draft_weights_gib),
        draft_kv_gib=r2(plan.draft_kv_gib),
        req_to_token_gib=r2(plan.req_to_token_gib),
        avail_after_pool_gib=r2(plan.avail_after_pool_gib),
        graph_gib=r2(plan.graph_gib),
        draft_graph_gib=r2(plan.draft_graph_gib),
        avail_after_graphs_gib=r2(final),
        available_gpu_mem_gib=r2(final),
        host_cache_gb=r2(plan.host_cache_gb) if plan.ok else None,
        host_cache_tokens=plan.host_cache_tokens if plan.ok else None,
        max_running_requests=plan.max_running_requests,
        chunked_prefill_size=plan.chunked_prefill_size,
        max_prefill_tokens=plan.max_prefill_tokens,
        context_len=plan.context_len,
        ranks=plan.tp,
        semantics=plan.version,
        sglang_version=plan.version,
    )


@dataclass(frozen=True)
class Launch:
    """One simulated trial: what the study is told, plus the truth for scoring."""

    params: dict[str, Scalar]
    outcome: str
    tokens: int
    feasible: bool
    stable: bool
    crashed: bool


def stable(bench: Bench, params: Mapping[str, Scalar]) -> tuple[bool, int]:
    """Ground truth: (stable with probability ≥ STABLE_P, capacity in tokens)."""
    plan = plan_startup(bench.profile, server_settings(bench, params))
    if not plan.ok or plan.avail_final_gib is None or plan.max_total_num_tokens is None:
        return False, 0
    limit = plan.avail_final_gib - bench.constraints.min_headroom_gib
    p = _p_pass(bench.profile, plan.chunked_prefill_size, 0, limit) * _p_pass(
        bench.profile, 0, plan.max_running_requests or 1, limit
    )
    return p >= STABLE_P, plan.max_total_num_tokens


def _p_pass(profile: Profile, tokens: int, seqs: int, limit: float) -> float:
    mean = transient_peak_gib(profile, tokens, seqs)
    sigma = profile.activation.variation
    if sigma <= 0:
        return 1.0 if mean <= limit else 0.0
    return phi((limit / mean - 1.0) / sigma) ** STRESS_FORWARDS


def best_stable(bench: Bench) -> int:
    """The most capacity any stable setting of the space holds (exhaustive)."""

    points = grid(bench.search) or []
    return max((tokens for ok, tokens in (stable(bench, p) for p in points) if ok), default=0)


def launch(bench: Bench, params: Mapping[str, Scalar], seed: int) -> tuple[Launch, Result]:
    """Run one simulated trial and build the result `autotune.study.storage.tell` stores."""
    prof = bench.profile
    plan = plan_startup(prof, server_settings(bench, params), seed=seed)
    ledger = ledger_of(plan)
    tokens = plan.max_total_num_tokens or 0
    record: dict[str, object] = {"params": dict(params), "ledger": ledger.to_dict()}
    truth, _ = stable(bench, params)
    if not plan.ok:
        assert plan.failure is not None
        cause = CAUSES.get(plan.failure.kind, "error")
        outcome = "startup_oom" if cause in MEMORY_CAUSES else "startup_error"
        reason = f"{outcome} ({cause}): {plan.failure.message}"
        measured = Measured(
            tokens, 0.0, outcome == "startup_oom", outcome != "startup_oom", None, None, None, None
        )
        return _done(bench, params, outcome, reason, tokens, measured, record, truth)
    rng = random.Random(seed * 7 + 3)
    r = plan.max_running_requests or 1
    peak = 0.0
    for _ in range(STRESS_FORWARDS):
        peak = max(peak, transient_peak_gib(prof, plan.chunked_prefill_size, 0, rng))
        peak = max(peak, transient_peak_gib(prof, 0, r, rng))
    free = plan.avail_final_gib or 0.0
    if peak > free:
        reason = (
            "runtime_oom (torch_oom): torch.OutOfMemoryError: CUDA out of memory. "
            f"Tried to allocate {peak - free + 0.01:.2f} GiB"
        )
        measured = Measured(tokens, 0.0, True, False, None, None, None, None)
        return _done(bench, params, "runtime_oom", reason, tokens, measured, record, truth)
    tput = decode_throughput(prof, r, plan.spec)
    record["stress_peak_gib"] = round(peak, 3)
    measured = Measured(tokens, tput, False, False, 0.0, round(free - peak, 3), None, None)
    return _done(bench, params, "ok", "", tokens, measured, record, truth)


def _done(
    bench: Bench,
    params: Mapping[str, Scalar],
    outcome: str,
    reason: str,
    tokens: int,
    m: Measured,
    record: dict[str, object],
    truth: bool,
) -> tuple[Launch, Result]:

    record["outcome"] = outcome
    attrs = {
        "capacity_tokens": tokens,
        "throughput_tok_s": m.throughput_tok_s,
        "headroom_gib": m.headroom_gib,
        "record": record,
    }
    feasible = all(v <= 0 for v in constraint_values(m, bench.constraints).values())
    crashed = outcome != "ok"
    result = Result("complete", outcome, reason, m, attrs)
    return Launch(dict(params), outcome, tokens, feasible, truth, crashed), result


def run_trial(study: optuna.Study, bench: Bench, trial: optuna.trial.Trial, seed: int) -> Launch:
    """Ask-side already done: suggest through the study's space, launch, tell."""
    settings = settings_for(trial, bench.search)
    result_launch, result = launch(bench, settings.params, seed)
    tell(study, trial, result, bench.study_config)
    return result_launch
