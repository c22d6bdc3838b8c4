"""Running a workload against one server: phases in order, the server watched throughout.

`run_workload` is synchronous (it runs its own event loop) for the study loop to call per trial.
It polls `is_dead()` every POLL_S in a worker thread (the check may touch files, processes or
HTTP); once it returns a reason, the running phase is cancelled at once, every in-flight request
is recorded as cancelled, what was running is kept in `Died`, and later phases are skipped.
Each phase has a hard time limit (duration + drain, or its timeout), so the whole run is bounded
by `WorkloadSpec.max_wall_s()` plus a few seconds, whatever the server does.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import math
import random
import time
from collections.abc import Callable, Coroutine, Mapping
from concurrent.futures import Executor
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
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
from autotune.loadgen.apis import APIS, RequestOptions
from autotune.loadgen.client import Client, HttpError
from autotune.loadgen.earlyend import Round, Window, steady_end, stress_end
from autotune.loadgen.metrics import RequestRecord, Slo, Summary, summarize
from autotune.loadgen.shapes import Shaper, TokenPool

POLL_S = 0.15
MIN_POLL_GAP_S = 0.02  # pokes cannot make the watcher poll faster than this
DEFAULT_STRESS_REQUESTS = 32  # when the server's max running requests is unknown
DEFAULT_PREFILL_CHUNK = 8192  # when chunked prefill is off or unknown
ABORT_SETTLE_S = 5.0
"""How long the driver waits after a phase that ended early cancelled requests in flight, before
the next phase: SGLang aborts a request whose client went away, a streamed one 2 s after its
response ended (`TokenizerManager.create_abort_task`), one not streamed or still waiting at its
next disconnect poll, every `SGLANG_REQUEST_STATE_WAIT_TIMEOUT` (4) s
(`TokenizerManager._wait_one_response`, `sglang/srt/managers/tokenizer_manager.py`)."""


@dataclass(frozen=True)
class Target:
    """Where to send load: `http://HOST:PORT`, an API key (sent as a Bearer token), a model name
    for the OpenAI APIs (None: ask /v1/models)."""

    base_url: str
    api_key: str | None = None
    model: str | None = None


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


class Activity:
    """What the workload is waiting for, for a hang watchdog on another thread: `owed_s()` is
    how long requests have been out with nothing at all coming back from the server (None when
    nothing is owed, also before the workload starts and after it ends)."""

    def __init__(self) -> None:
        self._rt: ph.Runtime | None = None

    def owed_s(self) -> float | None:
        """Seconds the server has owed an answer with nothing heard from it, None when nothing is
        owed or no phase runs (read from the watchdog's thread)."""
        rt = self._rt
        return None if rt is None else rt.owed_s()

    def streamed(self) -> bool:
        """Whether the requests stream: then every running request owes a byte at every decode
        step, and silence while the server's log moves means its output is lost on the way."""
        rt = self._rt
        return rt is not None and rt.options.stream


@dataclass(frozen=True)
class Died:
    """The server died during the workload: why, when, and what was in flight.

    `in_flight*` describe the requests in flight when the server stopped answering: when
    connections first failed (`connections_lost_s`) if that came before the death was known.
    """

    reason: str
    at_s: float  # seconds since the workload started, when is_dead() reported it
    phase: str
    connections_lost_s: float | None
    in_flight: int
    in_flight_input_tokens: int
    in_flight_output_tokens: int  # generated so far by the requests in flight
    oldest_in_flight_s: float | None


@dataclass(frozen=True)
class PhaseResult:
    """One phase as it ran: when it started and how long, what ended it, its summary, and the plan
    it was sized to."""

    name: str
    kind: str
    started_s: float
    duration_s: float
    ended_by: str  # completed | ended_early | time_limit | server_died | skipped
    summary: Summary
    plan: dict[str, object]  # what the phase was sized to (stress: requests, input_len, ...)
    early_end: str | None = None  # ended_early: when, of what was planned, and the rule's why

    def to_dict(self) -> dict[str, object]:
        """The phase for `trial.json` and `workload.json`, its summary as plain JSON values."""
        d = {k: v for k, v in asdict(self).items() if k != "summary"}
        d["summary"] = self.summary.to_dict()
        return d


@dataclass(frozen=True)
class WorkloadResult:
    """Per-phase summaries, the overall summary (warm-up excluded), death info, all records."""

    phases: tuple[PhaseResult, ...]
    overall: Summary
    died: Died | None
    duration_s: float
    records: tuple[RequestRecord, ...]

    def to_dict(self) -> dict[str, object]:
        """JSON-safe and compact: summaries only, no per-request records."""
        return {
            "duration_s": self.duration_s,
            "overall": self.overall.to_dict(),
            "phases": [p.to_dict() for p in self.phases],
            "died": None if self.died is None else asdict(self.died),
        }

    def write_records(self, path: Path) -> None:
        """One JSON object per request, in send order."""
        with path.open("w", encoding="utf-8") as f:
            for r in sorted(self.records, key=lambda r: (r.sent_s is None, r.sent_s or 0.0)):
                f.write(json.dumps(r.to_dict()) + "\n")


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


def run_workload(
    spec: WorkloadSpec,
    target: Target,
    facts: ServerFacts,
    *,
    is_dead: Callable[[], str | None],
    slo: Slo | None = None,
    clock: Callable[[], float] = time.perf_counter,
    activity: Activity | None = None,
    headroom: Callable[[], float | None] | None = None,
) -> WorkloadResult:
    """Drive `spec` at `target` and return what users would have felt (see module docstring).
    With `activity`, the caller can ask at any moment how long the server has owed an answer.
    `headroom()` is the least free GPU memory seen so far under load (GiB, None before a
    reading): the early-end rule (`spec.end_early`, `loadgen.earlyend`) ends a phase only once
    it stopped falling."""
    executor = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="autotune-is-dead")
    try:
        return asyncio.run(
            _run(spec, target, facts, is_dead, slo, clock, executor, activity, headroom)
        )
    finally:
        executor.shutdown(wait=False, cancel_futures=True)
        if activity is not None:
            activity._rt = None


class _Watch:
    """Polls `is_dead()` every POLL_S, at once when poked (a request lost its connection)."""

    def __init__(self, is_dead: Callable[[], str | None], executor: Executor) -> None:
        self.is_dead = is_dead
        self.executor = executor
        self.polls = 0
        self.poked = asyncio.Event()
        self.polled = asyncio.Event()

    def poke(self) -> None:
        self.poked.set()

    async def run(self, limit_s: float) -> str:
        """Returns the reason once `is_dead()` reports one; bounded by limit_s of polling."""
        loop = asyncio.get_running_loop()
        for _ in range(int(limit_s / MIN_POLL_GAP_S) + 10):
            await asyncio.sleep(MIN_POLL_GAP_S)
            self.poked.clear()
            reason = await loop.run_in_executor(self.executor, self.is_dead)
            self.polls += 1
            self.polled.set()
            self.polled = asyncio.Event()
            if reason:
                return reason
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.poked.wait(), POLL_S)
        await asyncio.Event().wait()  # past every phase limit: the driver cancels us
        return ""

    async def confirm(self, task: asyncio.Task[str], timeout_s: float = 1.0) -> None:
        """Wait (up to timeout_s) for polls that start from now, to learn if the server died."""
        target = self.polls + 3
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self.polls < target and not task.done():
            left = deadline - asyncio.get_running_loop().time()
            if left <= 0:
                return
            self.poke()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.polled.wait(), left)


async def _model_name(client: Client, target: Target, api: str) -> str:
    if target.model is not None or not APIS[api].names_model:
        return target.model or "default"
    try:
        status, body = await client.get_json("/v1/models", 5.0)
        data = json.loads(body).get("data") if status == 200 else None
        if isinstance(data, list) and data and isinstance(data[0], dict):
            return str(data[0].get("id") or "default")
    except (HttpError, TimeoutError, ValueError, AttributeError):
        pass
    return "default"


async def _run(
    spec: WorkloadSpec,
    target: Target,
    facts: ServerFacts,
    is_dead: Callable[[], str | None],
    slo: Slo | None,
    clock: Callable[[], float],
    executor: concurrent.futures.Executor,
    activity: Activity | None = None,
    headroom: Callable[[], float | None] | None = None,
) -> WorkloadResult:
    api_key = target.api_key if target.api_key is not None else spec.api_key()
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    client = Client(target.base_url, headers=headers, clock=clock)
    t0 = clock()
    watch = _Watch(is_dead, executor)
    watcher = asyncio.create_task(watch.run(spec.max_wall_s() + 60.0))
    try:
        model = await _model_name(client, target, spec.api)
        options = RequestOptions(spec.api, model, spec.stream, spec.ignore_eos, spec.temperature)
        pool = TokenPool(random.Random(f"{spec.seed}/pool"))
        rt = ph.Runtime(client, pool, options, clock, t0, spec.request_timeout_s, watch.poke)
        if activity is not None:
            activity._rt = rt
        results: list[PhaseResult] = []
        died: Died | None = None
        for index, phase in enumerate(spec.phases):
            if died is not None or watcher.done():
                if died is None:
                    died = _died(rt, watcher.result(), phase.name)
                results.append(_skipped(phase, rt.rel(clock())))
                continue
            result, died = await _phase(
                spec, rt, facts, phase, index, watch, watcher, slo, headroom
            )
            results.append(result)
        measured = [p for p in results if p.kind != "warmup" and p.ended_by != "skipped"]
        keep = {p.name for p in measured}
        records = [r for p in results for r in _records_of(rt, p)]
        overall = summarize(
            [r for r in records if r.phase in keep],
            sum(p.duration_s for p in measured),
            slo,
            capped_arrivals=sum(p.summary.capped_arrivals for p in measured),
        )
        return WorkloadResult(tuple(results), overall, died, rt.rel(clock()), tuple(records))
    finally:
        watcher.cancel()
        client.close()


def _records_of(rt: ph.Runtime, p: PhaseResult) -> list[RequestRecord]:
    return rt.records.get(p.name, [])


def _skipped(phase: Phase, at_s: float) -> PhaseResult:
    return PhaseResult(phase.name, _kind(phase), at_s, 0.0, "skipped", summarize([], 0.0), {})


def _kind(phase: Phase) -> str:
    return {Warmup: "warmup", Steady: "steady", Poisson: "poisson", Stress: "stress"}[type(phase)]


def _died(rt: ph.Runtime, reason: str, phase: str) -> Died:
    now = rt.clock()
    live = list(rt.live.values())
    if rt.lost_at is not None:
        now, live = rt.lost_at, rt.lost_live
    return Died(
        reason=reason,
        at_s=rt.rel(rt.clock()),
        phase=phase,
        connections_lost_s=None if rt.lost_at is None else rt.rel(rt.lost_at),
        in_flight=len(live),
        in_flight_input_tokens=sum(x.plan.input_len for x in live),
        in_flight_output_tokens=sum(x.reader.output_tokens for x in live if x.reader is not None),
        oldest_in_flight_s=max((now - x.sent for x in live), default=None),
    )


@dataclass(frozen=True)
class _PhaseRun:
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
class _Started:
    """A phase's runner, its hard time limit (seconds from its start) and what it was sized to."""

    coro: Coroutine[object, object, None]
    limit_s: float
    plan: dict[str, object] = field(default_factory=dict)


async def _phase(
    spec: WorkloadSpec,
    rt: ph.Runtime,
    facts: ServerFacts,
    phase: Phase,
    index: int,
    watch: _Watch,
    watcher: asyncio.Task[str],
    slo: Slo | None,
    headroom: Callable[[], float | None] | None = None,
) -> tuple[PhaseResult, Died | None]:
    out: list[RequestRecord] = []
    rt.records[phase.name] = out
    rt.cut_by_time_limit = False
    rt.ended_early = None
    start = rt.clock()
    shaper = _shaper(spec, facts, phase, index)
    run = _PhaseRun(spec, rt, facts, index, out, shaper, start, [0], headroom)
    started = _start(phase, run)
    ender = _ender(phase, run)
    try:
        ended_by, died = await _until_end(rt, phase.name, started, out, watch, watcher, ender)
    finally:
        if ender is not None:
            ender.cancel()
    duration = rt.clock() - start
    if ended_by == "completed" and rt.ended_early is not None:
        ended_by = "ended_early"  # a stress phase that skipped its remaining rounds
    summary = summarize(out, duration, slo, capped_arrivals=run.capped[0])
    plan = started.plan
    early = rt.ended_early if ended_by == "ended_early" else None
    result = PhaseResult(
        phase.name, _kind(phase), rt.rel(start), duration, ended_by, summary, plan, early
    )
    if early is not None and any(r.error and r.error.startswith("unfinished") for r in out):
        await asyncio.sleep(ABORT_SETTLE_S)  # the server aborts what was cancelled
    return result, died


class _Sampler:
    """A steady or Poisson phase's windows for `earlyend.steady_end`: at each tick, the output
    tokens generated so far (those of requests still streaming included), the requests completed
    and the least free GPU memory so far; a window closes at the first tick past its end."""

    def __init__(self, run: _PhaseRun, window_s: float) -> None:
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


def _ender(phase: Phase, run: _PhaseRun) -> asyncio.Task[str] | None:
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


def _shaper(spec: WorkloadSpec, facts: ServerFacts, phase: Phase, index: int) -> Shaper:
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


def _start(phase: Phase, run: _PhaseRun) -> _Started:
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


def _start_warmup(phase: Warmup, run: _PhaseRun) -> _Started:
    """Closed loop for a few requests; its timeout is the whole limit."""
    stop_at = run.start + phase.timeout_s
    coro = ph.closed_loop(
        run.rt, run.out, phase.name, run.shaper, phase.concurrency, stop_at, phase.requests
    )
    return _Started(coro, phase.timeout_s)


def _start_steady(phase: Steady, run: _PhaseRun) -> _Started:
    """Closed loop sending for `duration_s`, then up to the drain timeout for the last replies."""
    stop_at = run.start + phase.duration_s
    coro = ph.closed_loop(
        run.rt, run.out, phase.name, run.shaper, phase.concurrency, stop_at, phase.max_requests
    )
    return _Started(coro, phase.duration_s + run.spec.drain_timeout_s)


def _start_poisson(phase: Poisson, run: _PhaseRun) -> _Started:
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
    return _Started(coro, phase.duration_s + run.spec.drain_timeout_s)


def _start_stress(phase: Stress, run: _PhaseRun) -> _Started:
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
    return _Started(coro, phase.timeout_s, plan)


def _enough(run: _PhaseRun, rounds: int) -> Callable[[list[RequestRecord]], bool] | None:
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


async def _until_end(
    rt: ph.Runtime,
    name: str,
    started: _Started,
    out: list[RequestRecord],
    watch: _Watch,
    watcher: asyncio.Task[str],
    ender: asyncio.Task[str] | None = None,
) -> tuple[str, Died | None]:
    """Run the phase until it completes, the server dies, its limit passes or it may end early
    (`ender`: requests not yet sent are not, those in flight are cancelled): how it ended."""
    task = asyncio.ensure_future(started.coro)
    waits = {task, watcher} if ender is None else {task, watcher, ender}
    done, _ = await asyncio.wait(
        waits, timeout=started.limit_s, return_when=asyncio.FIRST_COMPLETED
    )
    if ender is not None and ender in done and not done & {task, watcher}:
        rt.ended_early = ender.result()
        rt.cancel_reason = f"ended early (phase {name})"  # recorded as `metrics.ENDED_EARLY`
        task.cancel()
        await asyncio.wait({task}, timeout=1.0)
        return "ended_early", None
    if task in done and any(r.error and r.error.startswith("connection") for r in out):
        await watch.confirm(watcher)  # lost connections: did the server die in this phase?
        done = {task, watcher} if watcher.done() else done
    if task in done and watcher not in done:
        task.result()
        return "completed", None
    died: Died | None = None
    if watcher in done:
        ended_by = "server_died"
        died = _died(rt, watcher.result(), name)
        rt.cancel_reason = f"server died ({died.reason})"
    else:
        ended_by = "time_limit"
        rt.cancel_reason = f"phase {name} reached its {started.limit_s:g} s limit"
        rt.cut_by_time_limit = True
    task.cancel()
    await asyncio.wait({task}, timeout=1.0)
    return ended_by, died
