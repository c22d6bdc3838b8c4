"""Running a workload against one server: phases in order, the server watched throughout.

`run_workload` is synchronous (it runs its own event loop) for the study loop to call per trial.
It polls `is_dead()` every POLL_S in a worker thread (the check may touch files, processes or
HTTP); once it returns a reason, the running phase is cancelled at once, every in-flight request
is recorded as cancelled, what was running is kept in `Died`, and later phases are skipped.
Each phase has a hard time limit (duration + drain, or its timeout), so the whole run is bounded
by `WorkloadSpec.max_wall_s()` plus a few seconds, whatever the server does.

How each phase starts (its runner, its limit, what it is sized to, when it may end early) is
`loadgen.phasestart`'s; this module runs them in order and watches the server meanwhile.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import random
import time
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import asdict, dataclass
from pathlib import Path

from autotune.config.workload import Phase, Poisson, Steady, Stress, Warmup, WorkloadSpec
from autotune.loadgen import phases as ph
from autotune.loadgen import phasestart
from autotune.loadgen.apis import APIS, RequestOptions
from autotune.loadgen.client import Client, HttpError
from autotune.loadgen.metrics import RequestRecord, Slo, Summary, summarize
from autotune.loadgen.phasestart import ServerFacts
from autotune.loadgen.shapes import TokenPool

POLL_S = 0.15
MIN_POLL_GAP_S = 0.02  # pokes cannot make the watcher poll faster than this
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
    shaper = phasestart.shaper(spec, facts, phase, index)
    run = phasestart.PhaseRun(spec, rt, facts, index, out, shaper, start, [0], headroom)
    started = phasestart.start(phase, run)
    ender = phasestart.ender(phase, run)
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


async def _until_end(
    rt: ph.Runtime,
    name: str,
    started: phasestart.Started,
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
