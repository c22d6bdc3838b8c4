"""Launches without launching: trial records produced by the simulator's pure model.

The benchmark (`scripts/bench_search.py`) and the sampler tests run whole studies in-process.
Each "launch" here plans the startup with `autotune.sim.memplan.plan_startup` (with the launch's
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
from dataclasses import dataclass, fields, replace
from pathlib import Path

import optuna

from autotune.config.schema import (
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
from autotune.config.space import grid, settings_for
from autotune.config.workload import WorkloadSpec
from autotune.logparse.ledger import Ledger
from autotune.record import internals, keys
from autotune.record.stored import stored
from autotune.sim.flags import ServerSettings
from autotune.sim.memplan import plan_startup
from autotune.sim.profiles import Mismatch, Profile
from autotune.sim.runtime import decode_throughput, forward_cdf, growth_gib, transient_peak_gib
from autotune.sim.sizing import auto_mem_fraction, gpu_class_defaults
from autotune.sim.startupplan import StartupPlan
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
(`autotune.logparse.events.Kind`); anything else is a start error."""
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


TRIAL_REQUESTS = 1500
"""Requests one trial's workload serves (the allocator's growth counts them)."""
STRESS_CONTEXT = 4096
"""Live context per running request in the stress phase, in tokens (no more than the pool)."""


MISMATCH = Mismatch(
    growth_mib_per_request=0.2,
    rank_imbalance_gib=0.5,
    peak_tail_dof=5,
    context_mib_per_1k_tokens=4.0,
    spike_probability=5e-5,
    spike_factor=0.5,
)
"""The world `scripts/bench_search.py --mismatch` runs every profile in (the simulator's
`[mismatch]` keys): 0.2 MiB of allocator growth per request served (0.29 GiB over a trial), the
last rank 0.5 GiB short, Student-t peaks with 5 degrees of freedom, 4 MiB more peak per 1,000
tokens of live context, one forward in 20,000 peaking 50% higher (one stress phase in 50)."""


@dataclass(frozen=True)
class Bench:
    """One profile's study: its search space, baseline, constraints and launch flags (the
    world's mismatches with the model are the profile's `[mismatch]`)."""

    profile: Profile
    spec: bool
    search: SearchConfig
    constraints: Constraints

    @property
    def mismatch(self) -> Mismatch:
        """Where the profile's world differs from what the memory model assumes (its `[mismatch]`
        table)."""
        return self.profile.mismatch

    @property
    def study_config(self) -> StudyConfig:
        """The profile's study as a `StudyConfig` on the simulator backend, for the samplers and the
        review to read as they read a real one."""
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
            sim_version=None,
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


def bench_for(
    profile: Profile, *, min_headroom_gib: float = 0.5, mismatch: Mismatch | None = None
) -> Bench:
    """The study an operator would write for this box: fraction, requests, host cache. The
    box's world is its profile's own `[mismatch]`, with `mismatch`'s keys on top (`over`)."""
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
    if mismatch is not None:
        profile = replace(profile, mismatch=over(profile.mismatch, mismatch))
    return Bench(profile, spec, search, Constraints(min_headroom_gib=min_headroom_gib))


def over(own: Mismatch, extra: Mismatch) -> Mismatch:
    """A profile's own `[mismatch]` with the keys `extra` sets (those off their default) on top:
    a benchmark world adds to the box's table, it never erases it."""
    default = Mismatch()
    changed = {
        f.name: getattr(extra, f.name)
        for f in fields(Mismatch)
        if getattr(extra, f.name) != getattr(default, f.name)
    }
    return replace(own, **changed)


def server_settings(bench: Bench, params: Mapping[str, Scalar]) -> ServerSettings:
    """The simulator's server settings for `params` on the bench's profile (its GPUs, and its draft
    model when the bench runs speculative decoding)."""
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


def ledger_of(plan: StartupPlan, rank0_extra_gib: float = 0.0) -> Ledger:
    """What the log of this startup shows, at the log's precision: rank 0's free-memory figures,
    `rank0_extra_gib` more than the least rank's the plan holds."""

    def r2(x: float | None) -> float | None:
        return round(x, 2) if x is not None else None

    def free(x: float | None) -> float | None:
        return r2(x + rank0_extra_gib) if x is not None else None

    final = plan.avail_final_gib if plan.ok else None
    return Ledger(
        p_gib=free(plan.p_gib),
        weights_gib=r2(plan.weights_gib),
        # A, what the pool is sized from: after the draft's weights too where they load first
        # (0.5.23), as the log's last weight load before the pool shows it
        avail_after_weights_gib=free(
            plan.avail_after_draft_weights_gib
            if plan.avail_after_draft_weights_gib is not None and plan.version != "0.5.9"
            else plan.avail_after_weights_gib
        ),
        max_total_num_tokens=plan.max_total_num_tokens,
        kv_gib=r2(plan.kv_gib),
        draft_weights_gib=r2(plan.draft_weights_gib),
        draft_kv_gib=r2(plan.draft_kv_gib),
        req_to_token_gib=r2(plan.req_to_token_gib),
        avail_after_pool_gib=free(plan.avail_after_pool_gib),
        graph_gib=r2(plan.graph_gib),
        draft_graph_gib=r2(plan.draft_graph_gib),
        avail_after_graphs_gib=free(final),
        available_gpu_mem_gib=free(final),
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
    throughput: float = 0.0
    stress_repeats: int = 1
    """How many stress passes the launch ran (what the search asked)."""
    truth_tokens: int = 0
    """The setting's capacity as the ground truth counts it (`stable`): the figure the best
    stable capacity and the front are read in. `tokens` is this launch's own, which the
    startup's jitter moves by about 1% from launch to launch; scored against the ground truth's
    best it would miss a launch of the best setting itself."""


def stable(bench: Bench, params: Mapping[str, Scalar]) -> tuple[bool, int]:
    """Ground truth: (stable with probability ≥ STABLE_P, capacity in tokens)."""
    p, tokens = p_stable(bench, params)
    return p >= STABLE_P, tokens


def p_stable(bench: Bench, params: Mapping[str, Scalar], soak: float = 1.0) -> tuple[float, int]:
    """(probability that a launch starts and passes a stress phase `soak` times as long with
    the required headroom, capacity in tokens); the profile's mismatches included."""
    plan = _plan(bench, params)
    if not plan.ok or plan.avail_final_gib is None or plan.max_total_num_tokens is None:
        return 0.0, 0
    prof = bench.profile
    limit = (
        plan.avail_final_gib
        - growth_gib(prof, round(TRIAL_REQUESTS * soak))
        - bench.constraints.min_headroom_gib
    )
    r = plan.max_running_requests or 1
    live = _live_tokens(plan)
    n = round(STRESS_FORWARDS * soak)
    fp = forward_cdf(prof, plan.chunked_prefill_size, 0, limit, live)
    fd = forward_cdf(prof, 0, r, limit, live)
    return fp**n * fd**n, plan.max_total_num_tokens


def _live_tokens(plan: StartupPlan) -> int:
    """The stress batch's live context: `STRESS_CONTEXT` tokens per running request, at most
    what the pool holds."""
    return min(plan.max_total_num_tokens or 0, (plan.max_running_requests or 1) * STRESS_CONTEXT)


def _plan(bench: Bench, params: Mapping[str, Scalar], seed: int = 0) -> StartupPlan:
    return plan_startup(bench.profile, server_settings(bench, params), seed=seed)


def plan_for(bench: Bench, params: Mapping[str, Scalar], seed: int = 0) -> StartupPlan:
    """The startup plan of a launch of `params` on the bench's box (with launch `seed`'s
    jitter): what the benchmark's departure score and its time accounting read."""
    return _plan(bench, params, seed)


def best_stable(bench: Bench) -> int:
    """The most capacity any stable setting of the space holds (exhaustive)."""

    points = grid(bench.search) or []
    return max((tokens for ok, tokens in (stable(bench, p) for p in points) if ok), default=0)


def front(bench: Bench) -> list[tuple[int, float]]:
    """The true Pareto front of the space: (capacity, decode throughput) of the stable settings
    that no other stable setting beats on both (exhaustive; mean throughput, no jitter)."""
    points = []
    for params in grid(bench.search) or []:
        ok, tokens = stable(bench, params)
        if ok:
            plan = _plan(bench, params)
            r = plan.max_running_requests or 1
            points.append((tokens, decode_throughput(bench.profile, r, plan.spec)))
    best = {
        (t, x)
        for t, x in points
        if not any(t2 >= t and x2 >= x and (t2, x2) != (t, x) for t2, x2 in points)
    }
    return sorted(best)


def covered(front_points: list[tuple[int, float]], launches: list[Launch]) -> float:
    """The share of the true front that stable, feasible launches reached: a front point counts
    when one launch holds 99% of its capacity and 98% of its throughput."""
    if not front_points:
        return 0.0
    held = [(x.truth_tokens, x.throughput) for x in launches if x.feasible and x.stable]
    hit = sum(any(t >= 0.99 * ft and tp >= 0.98 * fx for t, tp in held) for ft, fx in front_points)
    return hit / len(front_points)


def launch(
    bench: Bench,
    params: Mapping[str, Scalar],
    seed: int,
    soak: float = 1.0,
    stress_repeats: int = 1,
) -> tuple[Launch, Result]:
    """Run one simulated trial and build the result `autotune.study.storage.tell` stores;
    `soak` makes the workload that many times a trial's (confirm's soak); `stress_repeats`
    runs its stress phase that many times (the peak is the largest over every pass)."""
    prof = bench.profile
    plan = _plan(bench, params, seed)
    ledger = ledger_of(plan, plan.p_per_rank[0] - plan.p_gib)
    tokens = plan.max_total_num_tokens or 0
    record: dict[str, object] = {"params": dict(params), "ledger": ledger.to_dict()}
    truth = stable(bench, params)
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
    peak = max(_stress_peak(bench, plan, rng, soak) for _ in range(max(1, stress_repeats)))
    growth = growth_gib(prof, round(TRIAL_REQUESTS * soak))
    free = plan.avail_final_gib or 0.0
    if peak + growth > free:
        reason = (
            "runtime_oom (torch_oom): torch.OutOfMemoryError: CUDA out of memory. "
            f"Tried to allocate {peak + growth - free + 0.01:.2f} GiB"
        )
        measured = Measured(tokens, 0.0, True, False, None, None, None, None)
        return _done(bench, params, "runtime_oom", reason, tokens, measured, record, truth)
    tput = decode_throughput(prof, r, plan.spec)
    record["stress_peak_gib"] = round(peak + growth, 3)
    # what the probe sees once the workload is over and the server idles: the memory the
    # allocator kept (the harness's `growth_gib`, free at the workload's start minus at its end)
    record[keys.GROWTH] = round(growth, 3)
    head = round(free - peak - growth, 3)
    measured = Measured(tokens, tput, False, False, 0.0, head, None, None)
    return _done(bench, params, "ok", "", tokens, measured, record, truth)


def _stress_peak(bench: Bench, plan: StartupPlan, rng: random.Random, soak: float) -> float:
    """The largest forward peak of a stress phase: `STRESS_FORWARDS` full-chunk prefills and as
    many full decode batches (× `soak`), each drawn as the simulator draws a forward."""
    prof = bench.profile
    r = plan.max_running_requests or 1
    live = _live_tokens(plan)
    peak = 0.0
    for _ in range(round(STRESS_FORWARDS * soak)):
        peak = max(peak, transient_peak_gib(prof, plan.chunked_prefill_size, 0, rng, live))
        peak = max(peak, transient_peak_gib(prof, 0, r, rng, live))
    return peak


def _done(
    bench: Bench,
    params: Mapping[str, Scalar],
    outcome: str,
    reason: str,
    tokens: int,
    m: Measured,
    record: dict[str, object],
    truth: tuple[bool, int],
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
    holds, truth_tokens = truth
    launched = Launch(
        dict(params),
        outcome,
        tokens,
        feasible,
        holds,
        crashed,
        m.throughput_tok_s,
        truth_tokens=truth_tokens,
    )
    return launched, result


def run_trial(study: optuna.Study, bench: Bench, trial: optuna.trial.Trial, seed: int) -> Launch:
    """Ask-side already done: suggest through the study's space, launch (its stress phase as
    many times as the search asked, `keys.STRESS_REPEATS`), tell."""
    settings = settings_for(trial, bench.search)
    repeats = stored(internals.fresh(study, trial)).stress_repeats
    result_launch, result = launch(bench, settings.params, seed, stress_repeats=repeats)
    tell(study, trial, result, bench.study_config)
    return replace(result_launch, stress_repeats=repeats)
