"""How each kind of workload phase starts: sized to the server, shaped, and when it may end early.

`start` turns one phase of the study's `[workload]` into its runner (`phases.closed_loop`,
`open_loop` or `bursts`), its hard time limit and the plan it was sized to: a stress burst sized
to what the server shows it can run at once (`stress_plan` over `ServerFacts`), each phase's
prompt and answer lengths (`shaper`), and the early-end rule's questions asked while the phase
runs (`ender` for a steady or Poisson phase's windows, a stress phase's after each round).

Kept apart from the run (`loadgen.driver`), which sequences the phases and watches the server
whatever they are: what a phase sends and for how long is decided here from the spec and the
server's facts alone, and `autotune.testing.night` sizes its simulated bursts with the same
`stress_plan`.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field, fields
from typing import assert_never

from autotune.config.workload import (
    BurstOrder,
    Phase,
    Poisson,
    Steady,
    Stress,
    Warmup,
    WorkloadSpec,
)
from autotune.loadgen import phases as ph
from autotune.loadgen.earlyend import Round, Window, steady_end, stress_end
from autotune.loadgen.metrics import RequestRecord
from autotune.loadgen.shapes import Shaper

DEFAULT_STRESS_REQUESTS = 32  # when the server's max running requests is unknown
DEFAULT_PREFILL_CHUNK = 8192  # when chunked prefill is off or unknown


@dataclass(frozen=True)
class ServerFacts:
    """The server's effective limits, from the ledger; None where the log did not show them.
    Each field is named as the ledger's own key (`logparse.ledger.Ledger`), so `from_ledger`
    wires every one of them by name and a new field cannot be left out of a live run."""

    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    context_len: int | None = None
    max_total_num_tokens: int | None = None  # the KV pool; caps a stress burst to what can run

    @classmethod
    def from_ledger(cls, ledger: Mapping[str, object]) -> ServerFacts:
        """The facts a launched server's ledger (`Ledger.to_dict()`) shows."""
        return cls(**{f.name: _count(ledger.get(f.name)) for f in fields(cls)})

    @classmethod
    def of(cls, source: object) -> ServerFacts:
        """The facts an object holds as attributes named like the fields (the simulator's
        startup plan, which the night's time model reads instead of a log): every field by
        name, like `from_ledger`, so a new one reaches it too (a source without it fails)."""
        return cls(**{f.name: _count(getattr(source, f.name)) for f in fields(cls)})

    @property
    def pool_limits_input(self) -> bool:
        """Whether the KV pool, not the context length, caps a request's prompt: SGLang refuses
        a prompt of `min(context_len, max_total_num_tokens) − 6` tokens or more
        (`tp_worker`'s `max_req_input_len`), so with a pool smaller than the context a long
        prompt's refusal is the memory setting's doing."""
        pool, context = self.max_total_num_tokens, self.context_len
        return pool is not None and (context is None or pool < context)


def _count(value: object) -> int | None:
    """A whole count from the ledger; None for a missing or non-numeric value."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return int(value)


def stress_plan(phase: Stress, facts: ServerFacts) -> dict[str, int]:
    """Size a stress burst: the server's effective max running requests, each prompt one full
    prefill chunk (shrunk so input + output fits the context). When the KV pool size is known,
    the burst is cut to one more request than the pool can hold at once, so a round is not a
    long queue of prompts that could never run together. A worst case's ordered mix
    (`Stress.order`) also sizes its short prompts (`short_len`, never above `input_len`)."""
    requests = phase.requests or facts.max_running_requests or DEFAULT_STRESS_REQUESTS
    chunk = facts.chunked_prefill_size
    input_len = phase.input_len or (chunk if chunk and chunk > 0 else DEFAULT_PREFILL_CHUNK)
    out = phase.output_len
    if facts.context_len is not None:
        out = min(out, max(1, facts.context_len // 2))
        input_len = min(input_len, max(2, facts.context_len - out - 1))
    if phase.requests is None and facts.max_total_num_tokens:
        requests = min(requests, facts.max_total_num_tokens // (input_len + out) + 1)
    sized = {
        "requests": max(1, min(requests, ph.MAX_BURST)),
        "input_len": input_len,
        "output_len": out,
        "rounds": phase.rounds,
    }
    if phase.order is not BurstOrder.SAME and phase.short_len is not None:
        # a worst case's mix: the short prompts fit wherever the long ones do
        sized["short_len"] = max(2, min(phase.short_len, input_len))
    return sized


@dataclass(frozen=True)
class PhaseRun:
    """What a phase's runner is given: where its records go, how its requests are shaped."""

    spec: WorkloadSpec
    rt: ph.Runtime
    facts: ServerFacts
    index: int
    out: list[RequestRecord]
    shaper: Shaper
    start: float
    capped: list[int]  # open loop: arrivals that waited for an in-flight slot
    headroom: Callable[[], float | None] | None = None  # least free GPU memory so far (GiB)


@dataclass(frozen=True)
class Started:
    """A phase's runner, its hard time limit (seconds from its start) and what it was sized to."""

    coro: Coroutine[object, object, None]
    limit_s: float
    plan: dict[str, object] = field(default_factory=dict)


class _Sampler:
    """A steady or Poisson phase's windows for `earlyend.steady_end`: at each tick, the output
    tokens generated so far (those of requests still streaming included), the requests completed
    and the least free GPU memory so far; a window closes at the first tick past its end."""

    def __init__(self, run: PhaseRun, window_s: float) -> None:
        self.run = run
        self.window_s = window_s
        self.windows: list[Window] = []
        self._seen = 0
        self._done_tokens = 0
        self._completed = 0
        self._last = (0.0, 0.0)  # (seconds into the phase, tokens) at the last window's end

    def tick(self) -> bool:
        """Take a sample; True when it closed a window."""
        run = self.run
        now = run.rt.clock() - run.start
        while self._seen < len(run.out):
            r = run.out[self._seen]
            self._done_tokens += r.output_tokens
            self._completed += r.ok
            self._seen += 1
        if now < (len(self.windows) + 1) * self.window_s:
            return False
        live = sum(x.reader.output_tokens for x in run.rt.live.values() if x.reader is not None)
        tokens = float(self._done_tokens + live)
        t0, c0 = self._last
        free = run.headroom() if run.headroom is not None else None
        self.windows.append(Window(now, (tokens - c0) / max(now - t0, 1e-9), self._completed, free))
        self._last = (now, tokens)
        return True


def ender(phase: Phase, run: PhaseRun) -> asyncio.Task[str] | None:
    """The task that returns once a steady or Poisson phase may end early (None for other
    phases, or when the study's rule is off); its result is the phase's `early_end`."""
    rule = run.spec.end_early
    if not rule.enabled or not isinstance(phase, Steady | Poisson):
        return None
    clients = (
        phase.concurrency if isinstance(phase, Steady) else math.ceil(phase.rate * rule.window_s)
    )
    sampler = _Sampler(run, rule.window_s)
    tick_s = min(1.0, rule.window_s / 10)

    async def watch() -> str:
        while True:
            await asyncio.sleep(tick_s)
            if sampler.tick():
                why = steady_end(sampler.windows, rule, clients)
                if why is not None:
                    at = sampler.windows[-1].end_s
                    return f"ended at {at:.0f} s of {phase.duration_s:g}: {why}"

    return asyncio.create_task(watch())


def shaper(spec: WorkloadSpec, facts: ServerFacts, phase: Phase, index: int) -> Shaper:
    """The phase's own lengths, else the workload's; the dataset only when neither is set."""
    base_in = phase.input_len if not isinstance(phase, Stress) else None
    base_out = phase.output_len if not isinstance(phase, Stress) else None
    return Shaper(
        random.Random(f"{spec.seed}/{index}/shapes"),
        base_in or spec.input_len,
        base_out or spec.output_len,
        dataset=spec.dataset_rows if base_in is None and base_out is None else (),
        sessions=spec.sessions,
        max_context=facts.context_len,
    )


def start(phase: Phase, run: PhaseRun) -> Started:
    """The phase's runner, its limit and its plan, by the phase's kind."""
    match phase:
        case Warmup():
            return _start_warmup(phase, run)
        case Steady():
            return _start_steady(phase, run)
        case Poisson():
            return _start_poisson(phase, run)
        case Stress():
            return _start_stress(phase, run)
    assert_never(phase)


def _start_warmup(phase: Warmup, run: PhaseRun) -> Started:
    """Closed loop for a few requests; its timeout is the whole limit."""
    stop_at = run.start + phase.timeout_s
    coro = ph.closed_loop(
        run.rt, run.out, phase.name, run.shaper, phase.concurrency, stop_at, phase.requests
    )
    return Started(coro, phase.timeout_s)


def _start_steady(phase: Steady, run: PhaseRun) -> Started:
    """Closed loop sending for `duration_s`, then up to the drain timeout for the last replies."""
    stop_at = run.start + phase.duration_s
    coro = ph.closed_loop(
        run.rt, run.out, phase.name, run.shaper, phase.concurrency, stop_at, phase.max_requests
    )
    return Started(coro, phase.duration_s + run.spec.drain_timeout_s)


def _start_poisson(phase: Poisson, run: PhaseRun) -> Started:
    """Open loop with seeded arrivals for `duration_s`, then up to the drain timeout."""
    arrivals = random.Random(f"{run.spec.seed}/{run.index}/arrivals")
    coro = ph.open_loop(
        run.rt,
        run.out,
        phase.name,
        run.shaper,
        arrivals,
        phase.rate,
        phase.duration_s,
        phase.max_in_flight,
        run.capped,
    )
    return Started(coro, phase.duration_s + run.spec.drain_timeout_s)


def _start_stress(phase: Stress, run: PhaseRun) -> Started:
    """Bursts sized to the server (see `stress_plan`); the plan is reported with the result."""
    sized = stress_plan(phase, run.facts)
    coro = ph.bursts(
        run.rt,
        run.out,
        phase.name,
        run.shaper,
        sized["rounds"],
        sized["requests"],
        sized["input_len"],
        sized["output_len"],
        order=phase.order,
        short_len=sized.get("short_len"),
        order_seed=phase.order_seed,
        enough=_enough(run, sized["rounds"]),
    )
    plan: dict[str, object] = dict(sized)
    if "short_len" in sized:
        plan.update(order=str(phase.order), order_seed=phase.order_seed)
    return Started(coro, phase.timeout_s, plan)


def _enough(run: PhaseRun, rounds: int) -> Callable[[list[RequestRecord]], bool] | None:
    """The stress phase's question after each round (`phases.bursts`): may the remaining rounds
    be skipped (`earlyend.stress_end`)? It sets the phase's `early_end` when they may."""
    rule = run.spec.end_early
    if not rule.enabled:
        return None
    seen: list[Round] = []

    def enough(records: list[RequestRecord]) -> bool:
        free = run.headroom() if run.headroom is not None else None
        ok = sum(r.ok for r in records)
        seen.append(Round(ok, len(records) - ok, free))
        why = stress_end(seen, rule)
        if why is not None:
            run.rt.ended_early = f"ended after {len(seen)} of {rounds} rounds: {why}"
        return why is not None

    return enough
