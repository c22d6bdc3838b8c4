"""A study's night in hours: the simulated wall time of its launches, workloads and confirm soak.

The benchmark (`scripts/bench_search.py`) counts launches; an operator counts hours. Each launch
here costs what it would on the box, in the profile's real-world seconds:

* startup: the profile's `[startup]` phases as the simulator runs them (`autotune.sim.startup`):
  init, weight load, the draft's load, the KV pool, CUDA-graph capture (0.5.23's prefill graph
  too), the host cache by its size, the server's start and warm-up. A launch that fails at
  startup stops where its plan fails (`StartupPlan.failure.stage`: 0.9 of the weight load for a
  weight OOM, 0.3 of a capture for a capture OOM, the stage's end otherwise).
* workload: the study's `[workload]` phases driven against the launch (`phase_s`): a warm-up's
  requests, a steady phase's `duration_s` and its drain (the requests still running and queued
  when sending stops, at most `drain_timeout_s`), a Poisson phase likewise, a stress phase's
  rounds (its burst sized as `autotune.loadgen.phasestart.stress_plan` sizes it), every request
  timed by the profile's `[timing]` (`autotune.sim.runtime.prefill_time_s`, `decode_time_s`, the
  draft's accept length); the whole at most the study's `workload_s`. A launch that OOMs under
  load dies in the stress phase's first round.
* teardown: `TEARDOWN_S` per launch (SIGTERM, the server's exit, its GPU memory given back;
  the profiles carry no figure for it).

The confirm soak (`autotune confirm`) is one more launch of the exported setting with the
workload `autotune.review.confirm.soak` lengthens by the soak's factor (`review.soak.soak_plan`).
With the study's `[workload] end_early` on (the default; `early_end_s`), a steady or Poisson
phase ends where the driver's rule (`autotune.loadgen.earlyend.steady_end`) would fire in the
model's world, whose throughput is flat once the batch is full and the clients' requests are out
of step (`SETTLE_WAVES` request times at full batch), at the latest of: that plus the rule's
windows, its minimum time, and its minimum completed requests at the full batch's completion
rate (each rounded up to a whole window); the requests then in flight are cancelled, so there is
no drain, only the driver's `ABORT_SETTLE_S`. A stress phase's peak is the same every round in
the model, so it runs two rounds of its three or more (`earlyend.stress_end`). The confirm soak
never ends early (`autotune.review.confirm.soak` turns the rule off).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from autotune.config.schema import StudyConfig
from autotune.config.workload import (
    LengthDist,
    Phase,
    Poisson,
    Steady,
    Stress,
    Warmup,
    WorkloadSpec,
    workload_from_dict,
)
from autotune.loadgen.driver import ABORT_SETTLE_S
from autotune.loadgen.earlyend import min_requests
from autotune.loadgen.phasestart import ServerFacts, stress_plan
from autotune.review.confirm import soak
from autotune.sim.profiles import Profile
from autotune.sim.runtime import accept_length, decode_time_s, prefill_time_s
from autotune.sim.startupplan import StartupPlan

SETTLE_WAVES = 2.0
"""Request times at full batch until a closed loop's throughput is steady: the first wave of
requests is admitted (prefilled) at once and ends together; the spread of the answers' lengths
puts the second out of step."""
TEARDOWN_S = 20.0
"""Seconds from SIGTERM to the GPU given back, per launch (SGLang exits in seconds once its
workload is drained; the driver frees the memory with a lag): no profile carries it."""

BENCH_WORKLOAD = workload_from_dict(
    {
        "input_len": {"dist": "lognormal", "mean": 2000, "std": 1500, "min": 100, "max": 16000},
        "output_len": {"dist": "normal", "mean": 512, "std": 128, "min": 64, "max": 2048},
        "request_timeout_s": 1800,
        "drain_timeout_s": 600,
        "phases": [
            {"kind": "warmup", "requests": 4, "concurrency": 2},
            {"kind": "steady", "name": "traffic", "concurrency": 128, "duration_s": 900},
            {"kind": "stress", "rounds": 3},
        ],
    }
)
"""The workload a benchmark box's study drives: what `autotune init` writes where the log shows
no serving lines (a generic chat mix of prompts, 512-token answers, a 900 s steady phase with as
many clients as the most request slots the search tries, three stress rounds)."""


@dataclass(frozen=True)
class Hours:
    """Where a night's seconds went."""

    startup_s: float = 0.0
    workload_s: float = 0.0
    teardown_s: float = 0.0
    soak_s: float = 0.0
    launches: int = 0

    def __add__(self, other: Hours) -> Hours:
        return Hours(
            self.startup_s + other.startup_s,
            self.workload_s + other.workload_s,
            self.teardown_s + other.teardown_s,
            self.soak_s + other.soak_s,
            self.launches + other.launches,
        )

    @property
    def total_h(self) -> float:
        """The night from the first launch to the confirm soak's end, in hours."""
        return (self.startup_s + self.workload_s + self.teardown_s + self.soak_s) / 3600.0


STAGES = (
    "init",
    "weights",
    "draft_weights",
    "kv",
    "draft_kv",
    "workspace",
    "prefill_graphs",
    "graphs",
    "draft_graphs",
    "post_capture",
    "hicache",
)
"""The startup's stages in the order the simulator runs them (0.5.23's; 0.5.9 loads the draft
after the target's graphs, which moves no total)."""
PARTIAL = {"weights": 0.9, "graphs": 0.3, "prefill_graphs": 0.3, "draft_graphs": 0.3}
"""How far into its stage a failing launch gets (the simulator's own shares)."""


def startup_s(profile: Profile, plan: StartupPlan) -> float:
    """Seconds from the launch to the server ready (or to its startup failure)."""
    st = profile.startup
    spec = plan.spec
    host_gb = (plan.host_cache_gb or 0.0) + (plan.host_draft_gb or 0.0)
    length = {
        "init": st.init_distributed_s,
        "weights": st.weight_load_s,
        "draft_weights": st.draft_load_s if spec else 0.0,
        "kv": st.kv_alloc_s,
        "draft_kv": 0.2 * st.kv_alloc_s if spec else 0.0,
        "workspace": 0.0,
        "prefill_graphs": st.prefill_graph_capture_s if plan.version != "0.5.9" else 0.0,
        "graphs": st.graph_capture_s,
        "draft_graphs": st.draft_graph_capture_s if spec else 0.0,
        "post_capture": 0.0,
        "hicache": st.hicache_s_per_gb * host_gb,
    }
    fail = plan.failure
    if fail is None:
        return sum(length.values()) + st.server_start_s + st.warmup_s
    if fail.stage == "hicache":
        # a host pool that does not fit fails when it is allocated: the request's size
        length["hicache"] = 0.0
    stop = STAGES.index(fail.stage) if fail.stage in STAGES else 0
    done = sum(length[s] for s in STAGES[:stop])
    return done + PARTIAL.get(fail.stage, 1.0) * length[STAGES[stop]]


def request_s(
    profile: Profile, plan: StartupPlan, input_len: float, output_len: float, b: int
) -> float:
    """One request's time with `b` requests decoding beside it: its prompt's prefill chunks, then
    its answer's decode steps (the draft's accept length tokens a step)."""
    chunk = plan.chunked_prefill_size or 0
    chunks = max(1, math.ceil(input_len / chunk)) if chunk > 0 else 1
    prefill = (
        prefill_time_s(profile, round(input_len))
        + (chunks - 1) * profile.timing.prefill_base_ms / 1000.0
    )
    steps = output_len / accept_length(profile, plan.spec)
    return prefill + steps * decode_time_s(profile, max(b, 1))


def phase_s(profile: Profile, plan: StartupPlan, spec: WorkloadSpec, phase: Phase) -> float:
    """Seconds the load generator spends on one phase against this launch."""
    slots = plan.max_running_requests or 1
    inp = _mean(phase.input_len if not isinstance(phase, Stress) else None, spec.input_len)
    out = _mean(phase.output_len if not isinstance(phase, Stress) else None, spec.output_len)
    if isinstance(phase, Warmup):
        b = min(phase.concurrency, slots)
        rounds = math.ceil(phase.requests / max(b, 1))
        return min(rounds * request_s(profile, plan, inp, out, b), phase.timeout_s)
    if isinstance(phase, Steady | Poisson):
        if isinstance(phase, Steady):
            clients = phase.concurrency
        else:  # arrivals in flight at once: the rate times a request's time at full batch
            clients = min(
                phase.max_in_flight,
                math.ceil(phase.rate * request_s(profile, plan, inp, out, slots)),
            )
        b = min(max(clients, 1), slots)
        early = early_end_s(profile, plan, spec, phase)
        if early is not None:
            return early + ABORT_SETTLE_S
        drain = request_s(profile, plan, inp, out, b) * (0.5 + max(clients - b, 0) / b)
        return phase.duration_s + min(drain, spec.drain_timeout_s)
    sized = stress_plan(phase, ServerFacts.of(plan))
    if spec.end_early.enabled:  # the model's peak repeats: the third round onwards is skipped
        sized["rounds"] = min(sized["rounds"], 2)
    n, length = sized["requests"], sized["input_len"]
    chunk = plan.chunked_prefill_size or length
    prefill = n * math.ceil(length / max(chunk, 1)) * prefill_time_s(profile, min(length, chunk))
    decode = (
        sized["output_len"]
        / accept_length(profile, plan.spec)
        * decode_time_s(profile, min(n, slots))
    )
    return min(phase.timeout_s, sized["rounds"] * (prefill + decode))


def _clients(profile: Profile, plan: StartupPlan, spec: WorkloadSpec, phase: Phase) -> int:
    """The requests a steady or Poisson phase keeps out at once: its clients, or its arrival rate
    times one request's time at full batch."""
    if isinstance(phase, Steady):
        return phase.concurrency
    if isinstance(phase, Poisson):
        slots = plan.max_running_requests or 1
        inp, out = _mean(phase.input_len, spec.input_len), _mean(phase.output_len, spec.output_len)
        one = request_s(profile, plan, inp, out, slots)
        return min(phase.max_in_flight, math.ceil(phase.rate * one))
    return 1


def early_end_s(
    profile: Profile, plan: StartupPlan, spec: WorkloadSpec, phase: Phase
) -> float | None:
    """Where a steady or Poisson phase ends early in the model's world (seconds into it), None
    when it runs its whole duration (the rule off, another kind of phase, or the rule's earliest
    moment past the duration). See the module docstring for the model."""
    rule = spec.end_early
    if not rule.enabled or not isinstance(phase, Steady | Poisson):
        return None
    slots = plan.max_running_requests or 1
    clients = _clients(profile, plan, spec, phase)
    b = min(max(clients, 1), slots)
    one = request_s(
        profile,
        plan,
        _mean(phase.input_len, spec.input_len),
        _mean(phase.output_len, spec.output_len),
        b,
    )
    # the rule's `clients` for a Poisson phase: the arrivals of one window
    counted = clients if isinstance(phase, Steady) else math.ceil(phase.rate * rule.window_s)
    needed = min_requests(rule, counted)
    at = max(SETTLE_WAVES * one + rule.windows * rule.window_s, rule.min_s, needed * one / b)
    at = math.ceil(at / rule.window_s) * rule.window_s
    return at if at < phase.duration_s else None


def workload_s(
    profile: Profile, plan: StartupPlan, spec: WorkloadSpec, limit_s: float, ooms: bool = False
) -> float:
    """Seconds of the whole workload against a launch that started (at most `limit_s`); one
    that OOMs under load dies in the stress phase's first round."""
    total = 0.0
    for phase in spec.phases:
        if ooms and isinstance(phase, Stress):
            total += phase_s(profile, plan, spec, replace(phase, rounds=1)) / 2
            break
        total += phase_s(profile, plan, spec, phase)
    return min(total, limit_s)


def launch_hours(
    profile: Profile, plan: StartupPlan, cfg: StudyConfig, outcome: str, stress_repeats: int = 1
) -> Hours:
    """One trial's cost: its startup, its workload if it started (its stress phases run
    `stress_repeats` times, as the search asked), its teardown."""
    work = 0.0
    if plan.ok:
        spec, limit = cfg.workload.stress_passes(cfg.server.limits.workload_s, stress_repeats)
        work = workload_s(profile, plan, spec, limit, ooms=outcome == "runtime_oom")
    return Hours(startup_s(profile, plan), work, TEARDOWN_S, 0.0, 1)


def soak_hours(profile: Profile, plan: StartupPlan, cfg: StudyConfig, factor: float) -> Hours:
    """The confirm soak's cost: one launch of the exported setting, its workload lengthened by
    the soak's factor (`autotune.review.confirm.soak`) over its steady phases as a trial of the
    setting ran them (ended early where the rule fires), its teardown."""
    ran = {}
    for phase in cfg.workload.phases:
        early = early_end_s(profile, plan, cfg.workload, phase)
        if early is not None:
            ran[phase.name] = early
    soaked = soak(cfg, factor, ran)
    work = 0.0
    if plan.ok:
        work = workload_s(profile, plan, soaked.workload, soaked.server.limits.workload_s)
    return Hours(0.0, 0.0, 0.0, startup_s(profile, plan) + work + TEARDOWN_S, 0)


def _mean(own: LengthDist | None, default: LengthDist) -> float:
    d = own or default
    return d.mean if d.kind != "uniform" else (d.low + d.high) / 2
