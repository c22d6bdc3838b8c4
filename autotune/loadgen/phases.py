"""How each phase sends its requests: closed loop, open loop (Poisson) and stress bursts.

Every runner appends one `RequestRecord` per request to the list it is given, also when it is
cancelled (the driver cancels a phase when the server dies or the phase's time limit passes), so
no request goes unrecorded. Every loop is bounded: closed loops by a send deadline and a request
count, open loops by the arrival schedule, bursts by their rounds, all by MAX_REQUESTS_PER_PHASE; a
client pauses after a failed request, so a dead or failing server does not become a busy loop.
"""

from __future__ import annotations

import asyncio
import itertools
import random
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field

from autotune.config.workload import BurstOrder
from autotune.loadgen.apis import APIS, RequestOptions, ResponseReader
from autotune.loadgen.client import Client, HttpError
from autotune.loadgen.metrics import UNFINISHED, RequestRecord
from autotune.loadgen.shapes import RequestPlan, Shaper, TokenPool, ordered_burst

ERROR_PAUSE_S = 0.1  # a client pauses after a failed request, so errors cannot spin
MAX_REQUESTS_PER_PHASE = 1_000_000  # bounds memory whatever the server does
MAX_BURST = 8192  # stays well inside the process's file-descriptor limit
ORDER_GAP_S = 0.5
"""How long after a burst's short prompts its long ones follow (`shortest-first`): the short
ones are then decoding, so the long prefill meets a running batch."""


@dataclass
class Live:
    """A request in flight, for the record of what was running when the server died."""

    plan: RequestPlan
    sent: float
    reader: ResponseReader | None = None


@dataclass
class Runtime:
    """What every request of a workload shares (mutable: the live set and the cancel reason)."""

    client: Client
    pool: TokenPool
    options: RequestOptions
    clock: Callable[[], float]
    t0: float
    request_timeout_s: float
    on_connection_error: Callable[[], None] = lambda: None  # asks the watcher to check now
    cancel_reason: str = "cancelled"
    cut_by_time_limit: bool = False  # the phase ran out of time (not: the server died)
    # Why the running phase ended early (`loadgen.earlyend`): no request is sent after it, and
    # requests it cancels are recorded as unfinished, not as failures.
    ended_early: str | None = None
    live: dict[int, Live] = field(default_factory=dict)
    # What was in flight when connections first failed after the last success: a crashed
    # server resets every connection before anyone notices it died.
    lost_at: float | None = None
    lost_live: list[Live] = field(default_factory=list)
    records: dict[str, list[RequestRecord]] = field(default_factory=dict)
    # Since when the server owes an answer: set by the first request sent while nothing was
    # owed, moved on by every byte the server sends, cleared when the last request in flight
    # ends well. A request that failed (timeout, lost connection) leaves it standing: the
    # server still has not answered. Read by the hang watchdog (`owed_s`) from another thread.
    owed_since: float | None = None
    _ids: itertools.count[int] = field(default_factory=itertools.count)

    def rel(self, t: float) -> float:
        """Clock time `t` as seconds since the workload started, the time base of every record."""
        return t - self.t0

    def owed_s(self) -> float | None:
        """Seconds for which requests were out and nothing came back; None when nothing is
        owed (no request in flight since the last one ended well)."""
        since = self.owed_since
        if since is None:
            return None
        return self.clock() - max(since, self.client.heard.at)


async def send_one(
    rt: Runtime, out: list[RequestRecord], phase: str, plan: RequestPlan, scheduled: float
) -> RequestRecord:
    """Send one request and append its record to `out` (also when cancelled)."""
    key = next(rt._ids)
    api = APIS[rt.options.api]
    body = api.body(plan, rt.pool, rt.options)
    path = api.path
    sent: float | None = None
    end: float | None = None
    error: str | None = None
    reader = ResponseReader(rt.options.api, rt.options.stream, 0.0, plan.output_len)

    def on_send(ts: float) -> None:
        nonlocal sent
        sent = reader.start = ts
        rt.live[key] = Live(plan, ts, reader)
        if rt.owed_since is None:
            rt.owed_since = ts

    try:
        async with asyncio.timeout(rt.request_timeout_s):
            sent, end = await rt.client.send("POST", path, body, reader, on_send)
        reader.finish(end)
        error = reader.error
        rt.lost_at = None
        rt.live.pop(key, None)
        rt.owed_since = None if not rt.live else max(end, rt.owed_since or end)
    except TimeoutError:
        error = f"timeout: no complete response within {rt.request_timeout_s:g} s"
        end = rt.clock()
    except HttpError as exc:
        error = f"connection: {exc}"
        end = rt.clock()
        if rt.lost_at is None:
            rt.lost_at, rt.lost_live = end, list(rt.live.values())
        rt.on_connection_error()
    except asyncio.CancelledError:
        streaming = rt.cut_by_time_limit and reader.first_ts is not None
        streaming = streaming or rt.ended_early is not None
        error = f"{UNFINISHED if streaming else 'cancelled'}: {rt.cancel_reason}"
        end = rt.clock()
        raise
    finally:
        rt.live.pop(key, None)
        record = _record(rt, phase, key, plan, scheduled, sent, end, reader, error)
        out.append(record)
    return record


def _record(
    rt: Runtime,
    phase: str,
    key: int,
    plan: RequestPlan,
    scheduled: float,
    sent: float | None,
    end: float | None,
    reader: ResponseReader,
    error: str | None,
) -> RequestRecord:
    ok = error is None and sent is not None and end is not None
    return RequestRecord(
        phase=phase,
        index=key,
        scheduled_s=rt.rel(scheduled),
        sent_s=None if sent is None else rt.rel(sent),
        end_s=None if end is None else rt.rel(end),
        ttft=reader.ttft,
        itl=array("d", reader.itl),
        e2e=(end - sent) if ok and end is not None and sent is not None else None,
        input_tokens=reader.prompt_tokens if reader.prompt_tokens is not None else plan.input_len,
        output_tokens=reader.output_tokens,
        error=error,
        session=plan.session,
        turn=plan.turn,
    )


async def _session(
    rt: Runtime,
    out: list[RequestRecord],
    phase: str,
    plans: list[RequestPlan],
    scheduled: float,
    stop_at: float,
) -> None:
    """Turns of one session in order; later turns wait for earlier ones and stop on a failure."""
    for i, plan in enumerate(plans):
        if i > 0 and (rt.clock() >= stop_at or rt.ended_early is not None):
            return
        record = await send_one(rt, out, phase, plan, scheduled)
        if not record.ok:
            await asyncio.sleep(ERROR_PAUSE_S)
            return
        scheduled = rt.clock()


async def _cancel_all(tasks: set[asyncio.Task[None]], grace_s: float = 0.5) -> None:
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=grace_s)


async def closed_loop(
    rt: Runtime,
    out: list[RequestRecord],
    phase: str,
    shaper: Shaper,
    concurrency: int,
    stop_sending_at: float,
    max_requests: int | None,
) -> None:
    """`concurrency` clients; each sends its next request as soon as its last one ends.

    Each request is scheduled at the moment its client became free, so the lag is pure client
    overhead. Sessions run on one client turn after turn.
    """
    budget = min(max_requests or MAX_REQUESTS_PER_PHASE, MAX_REQUESTS_PER_PHASE)
    issued = 0

    async def client_loop() -> None:
        nonlocal issued
        scheduled = rt.clock()
        while issued < budget and rt.clock() < stop_sending_at and rt.ended_early is None:
            plans = shaper.session()
            for plan in plans:
                if issued >= budget or rt.clock() >= stop_sending_at or rt.ended_early:
                    return
                issued += 1
                record = await send_one(rt, out, phase, plan, scheduled)
                if not record.ok:
                    await asyncio.sleep(ERROR_PAUSE_S)
                    scheduled = rt.clock()
                    break
                scheduled = rt.clock()

    tasks = {asyncio.create_task(client_loop()) for _ in range(concurrency)}
    try:
        await asyncio.gather(*tasks)
    finally:
        await _cancel_all({t for t in tasks if not t.done()})


async def open_loop(
    rt: Runtime,
    out: list[RequestRecord],
    phase: str,
    shaper: Shaper,
    arrivals: random.Random,
    rate: float,
    duration_s: float,
    max_in_flight: int,
    capped: list[int],
) -> None:
    """Poisson arrivals at `rate`/s for `duration_s`, sent on schedule whatever the server does.

    Each session's first request is scheduled at its arrival time. When `max_in_flight` requests
    are already out, the arrival waits for a slot; `capped[0]` counts those arrivals.
    """
    start = rt.clock()
    end = start + duration_s
    slots = asyncio.Semaphore(max_in_flight)
    tasks: set[asyncio.Task[None]] = set()

    async def run(plans: list[RequestPlan], scheduled: float) -> None:
        try:
            await _session(rt, out, phase, plans, scheduled, end)
        finally:
            slots.release()

    t_next = start
    try:
        for _ in range(min(int(rate * duration_s * 4) + 100, MAX_REQUESTS_PER_PHASE)):
            t_next += arrivals.expovariate(rate)
            if t_next >= end:
                break
            delay = t_next - rt.clock()
            if delay > 0:
                await asyncio.sleep(delay)
            if rt.ended_early is not None:
                break
            if slots.locked():
                capped[0] += 1
            await slots.acquire()
            task = asyncio.create_task(run(shaper.session(), t_next))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.gather(*list(tasks))
    finally:
        await _cancel_all({t for t in tasks if not t.done()})


async def bursts(
    rt: Runtime,
    out: list[RequestRecord],
    phase: str,
    shaper: Shaper,
    rounds: int,
    requests: int,
    input_len: int,
    output_len: int,
    *,
    order: BurstOrder = BurstOrder.SAME,
    short_len: int | None = None,
    order_seed: int = 0,
    enough: Callable[[list[RequestRecord]], bool] | None = None,
) -> None:
    """`rounds` bursts of `requests` prompts sent at once; each round waits for the last. With an
    `order` (`shapes.ordered_burst`), the prompts of a group are sent in that order, and a second
    group (`shortest-first`'s long prompts) follows `ORDER_GAP_S` after the first, while the
    first still runs. `enough(records)`, asked after each round but the last with that round's
    records, skips the remaining rounds when it says so (`loadgen.earlyend.stress_end`)."""
    tasks: set[asyncio.Task[RequestRecord]] = set()
    try:
        for r in range(rounds):
            groups = ordered_burst(
                shaper,
                min(requests, MAX_BURST),
                input_len,
                output_len,
                order=order,
                short_len=short_len,
                seed=order_seed + r,
            )
            sent: list[asyncio.Task[RequestRecord]] = []
            for g, plans in enumerate(groups):
                if g:
                    await asyncio.sleep(ORDER_GAP_S)
                now = rt.clock()
                # created in order: the event loop opens their connections in this order
                sent += [asyncio.create_task(send_one(rt, out, phase, p, now)) for p in plans]
                tasks = set(sent)
            records = await asyncio.gather(*sent)
            if any(not r.ok for r in records):
                await asyncio.sleep(ERROR_PAUSE_S)  # time for the watcher to see a crash
            elif r + 1 < rounds and enough is not None and enough(list(records)):
                return
    finally:
        pending = {t for t in tasks if not t.done()}
        for t in pending:
            t.cancel()
        if pending:
            await asyncio.wait(pending, timeout=0.5)
