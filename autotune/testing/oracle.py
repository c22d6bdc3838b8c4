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


TRIAL_REQUESTS = 1500
"""Requests one trial's workload serves (the allocator's growth counts them)."""
STRESS_CONTEXT = 4096
"""Live context per running request in the stress phase, in tokens (no more than the pool)."""


@dataclass(frozen=True)
class Mismatch:
    """Where the world differs from the memory model the search fits (all off by default).

    growth_mib_per_request: the allocator's footprint grows while serving, so free memory
        shrinks by this much per request served (never given back during the run).
    rank_imbalance_gib: the last rank has this much less free memory than rank 0 (a foreign
        process); the pool is sized by the least, rank 0's log shows its own figures.
    peak_tail_dof: the forward peak's run-to-run variation is Student-t with these degrees of
        freedom (same sd as `activation.variation`) instead of normal; 0 = normal.
    context_mib_per_1k_tokens: every forward's peak grows by this much per 1,000 tokens of live
        context in the batch (`STRESS_CONTEXT` per running request, at most the pool).
    spike_probability, spike_factor: once in that many stress phases, one forward peaks at
        (1 + spike_factor) times its draw.
    """

    growth_mib_per_request: float = 0.0
    rank_imbalance_gib: float = 0.0
    peak_tail_dof: float = 0.0
    context_mib_per_1k_tokens: float = 0.0
    spike_probability: float = 0.0
    spike_factor: float = 0.0

    @property
    def on(self) -> bool:
        return self != Mismatch()


MISMATCH = Mismatch(
    growth_mib_per_request=0.2,
    rank_imbalance_gib=0.5,
    peak_tail_dof=5.0,
    context_mib_per_1k_tokens=4.0,
    spike_probability=0.02,
    spike_factor=0.5,
)
"""The world `scripts/bench_search.py --mismatch` runs every profile in."""


@dataclass(frozen=True)
class Bench:
    """One profile's study: its search space, baseline, constraints and launch flags, and the
    world's mismatches with the model."""

    profile: Profile
    spec: bool
    search: SearchConfig
    constraints: Constraints
    mismatch: Mismatch = Mismatch()

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
    return Bench(
        profile,
        spec,
        search,
        Constraints(min_headroom_gib=min_headroom_gib),
        mismatch or Mismatch(),
    )


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
        avail_after_weights_gib=free(plan.avail_after_weights_gib),
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


def stable(bench: Bench, params: Mapping[str, Scalar]) -> tuple[bool, int]:
    """Ground truth: (stable with probability ≥ STABLE_P, capacity in tokens)."""
    p, tokens = p_stable(bench, params)
    return p >= STABLE_P, tokens


def p_stable(bench: Bench, params: Mapping[str, Scalar], soak: float = 1.0) -> tuple[float, int]:
    """(probability that a launch starts and passes a stress phase `soak` times as long with
    the required headroom, capacity in tokens); the world's mismatches included."""
    plan = _plan(bench, params)
    if not plan.ok or plan.avail_final_gib is None or plan.max_total_num_tokens is None:
        return 0.0, 0
    w = bench.mismatch
    growth = _growth_gib(w, soak)
    limit = plan.avail_final_gib - growth - bench.constraints.min_headroom_gib
    prefill, decode = _forward_means(bench, plan)
    n = round(STRESS_FORWARDS * soak)
    sigma = bench.profile.activation.variation
    fp = _forward_cdf(limit / prefill, sigma, w.peak_tail_dof)
    fd = _forward_cdf(limit / decode, sigma, w.peak_tail_dof)
    plain = fp**n * fd**n
    q = 1.0 - (1.0 - w.spike_probability) ** soak if w.spike_probability > 0 else 0.0
    if q <= 0:
        return plain, plan.max_total_num_tokens
    k = 1.0 + w.spike_factor
    sp = _forward_cdf(limit / (prefill * k), sigma, w.peak_tail_dof)
    sd = _forward_cdf(limit / (decode * k), sigma, w.peak_tail_dof)
    spiked = 0.5 * fp ** (n - 1) * sp * fd**n + 0.5 * fp**n * fd ** (n - 1) * sd
    return (1.0 - q) * plain + q * spiked, plan.max_total_num_tokens


def _forward_cdf(ratio: float, sigma: float, dof: float) -> float:
    """P(one forward's peak ≤ ratio × its mean): the multiplier is 1 + sigma·X, X of unit
    variance, normal or (dof ≥ 3) Student-t."""
    if sigma <= 0:
        return 1.0 if ratio >= 1.0 else 0.0
    z = (ratio - 1.0) / sigma
    if dof <= 0:
        return phi(z)
    return student_cdf(z / math.sqrt((dof - 2.0) / dof), int(dof))


def student_cdf(t: float, dof: int) -> float:
    """Student's t CDF for an integer number of degrees of freedom (Abramowitz & Stegun
    26.7.3–4, closed form)."""
    theta = math.atan(abs(t) / math.sqrt(dof))
    c2 = math.cos(theta) ** 2
    if dof % 2 == 1:
        term, total = math.cos(theta), 0.0
        if dof > 1:
            total = term
            for k in range(1, (dof - 3) // 2 + 1):
                term *= c2 * (2 * k) / (2 * k + 1)
                total += term
        a = 2.0 / math.pi * (theta + math.sin(theta) * total)
    else:
        term, total = 1.0, 1.0
        for k in range(1, (dof - 2) // 2 + 1):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        a = math.sin(theta) * total
    return 0.5 + math.copysign(0.5 * a, t)


def _forward_multiplier(rng: random.Random, sigma: float, dof: float) -> float:
    if sigma <= 0:
        return 1.0
    x = rng.gauss(0.0, 1.0)
    if dof > 0:
        chi2 = rng.gammavariate(dof / 2.0, 2.0)
        x = x / math.sqrt(chi2 / dof) * math.sqrt((dof - 2.0) / dof)
    return max(0.0, 1.0 + sigma * x)


def _forward_means(bench: Bench, plan: StartupPlan) -> tuple[float, float]:
    """Mean peak (GiB) of one full-chunk prefill forward and of one full decode forward, with
    the live context of the batch (`STRESS_CONTEXT` tokens per running request, no more than
    the pool holds) when the world's peak grows with it."""
    prof = bench.profile
    r = plan.max_running_requests or 1
    extra = 0.0
    per_k = bench.mismatch.context_mib_per_1k_tokens
    if per_k > 0:
        live = min(plan.max_total_num_tokens or 0, r * STRESS_CONTEXT)
        extra = per_k * live / 1000.0 / 1024.0
    prefill = transient_peak_gib(prof, plan.chunked_prefill_size, 0) + extra
    decode = transient_peak_gib(prof, 0, r) + extra
    return prefill, decode


def _growth_gib(w: Mismatch, soak: float) -> float:
    """What the allocator's footprint grew by over a workload `soak` times a trial's."""
    return w.growth_mib_per_request * TRIAL_REQUESTS * soak / 1024.0


def _plan(bench: Bench, params: Mapping[str, Scalar], seed: int = 0) -> StartupPlan:
    """The startup, with one rank short of `rank_imbalance_gib` when the world has it (the MIN
    over ranks sizes the pool; that rank is the last)."""
    tp = bench.profile.hardware.gpu_count
    short = bench.mismatch.rank_imbalance_gib
    foreign = [0.0] * (tp - 1) + [short] if tp > 1 and short > 0 else []
    return plan_startup(
        bench.profile, server_settings(bench, params), foreign_gib=foreign, seed=seed
    )


def best_stable(bench: Bench) -> int:
    """The most capacity any stable setting of the space holds (exhaustive)."""

    points = grid(bench.search) or []
    return max((tokens for ok, tokens in (stable(bench, p) for p in points) if ok), default=0)


def launch(
    bench: Bench, params: Mapping[str, Scalar], seed: int, soak: float = 1.0
) -> tuple[Launch, Result]:
    """Run one simulated trial and build the result `autotune.study.storage.tell` stores;
    `soak` makes the workload that many times a trial's (confirm's soak)."""
    prof = bench.profile
    w = bench.mismatch
    plan = _plan(bench, params, seed)
    shown = w.rank_imbalance_gib if prof.hardware.gpu_count > 1 else 0.0
    ledger = ledger_of(plan, shown)
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
    peak = _stress_peak(bench, plan, rng, soak)
    growth = _growth_gib(w, soak)
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
    head = round(free - peak - growth, 3)
    measured = Measured(tokens, tput, False, False, 0.0, head, None, None)
    return _done(bench, params, "ok", "", tokens, measured, record, truth)


def _stress_peak(bench: Bench, plan: StartupPlan, rng: random.Random, soak: float) -> float:
    """The largest forward peak of a stress phase: `STRESS_FORWARDS` full-chunk prefills and as
    many full decode batches (× `soak`), each with its run-to-run variation, one of them a
    spike when the world has them."""
    w = bench.mismatch
    sigma = bench.profile.activation.variation
    prefill, decode = _forward_means(bench, plan)
    n = round(STRESS_FORWARDS * soak)
    spike = -1
    if w.spike_probability > 0:
        q = 1.0 - (1.0 - w.spike_probability) ** soak
        if rng.random() < q:
            spike = rng.randrange(2 * n)
    peak = 0.0
    for i in range(n):
        for kind, mean in enumerate((prefill, decode)):
            m = _forward_multiplier(rng, sigma, w.peak_tail_dof)
            if 2 * i + kind == spike:
                m *= 1.0 + w.spike_factor
            peak = max(peak, mean * m)
    return peak


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
