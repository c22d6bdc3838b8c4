"""Continuous batching over a finite token pool, in real time, as SGLang schedules.

One asyncio task runs the loop: form a prefill batch if the PrefillAdder rules admit anything
(max running requests, free + evictable − reserved tokens, chunked prefill, max prefill tokens),
otherwise run one decode step for every running request. Each forward sleeps its profile step time
and may OOM (transient peak > free memory after startup, less what the allocator grew by while
serving when the profile's `[mismatch]` says it grows; the peak grows with the live context and
has heavy tails or rare spikes when it says so). After each step the new tokens are
handed to the waiting HTTP handlers in one pass (one wake-up per request per step, no per-token
tasks). When decode runs out of pool, requests are retracted back to the queue and the line SGLang
prints is logged. Prefill/Decode lines are logged at SGLang's cadence in the release's text
(`loglines.Lines`); under 0.5.23 a prefill that fits a captured prefill graph says so.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from autotune.sim import tokens
from autotune.sim.loglines import DecodeBatch, Lines, PrefillBatch, fmt_retract
from autotune.sim.logwriter import LogWriter
from autotune.sim.prefixcache import Match, PrefixCache
from autotune.sim.profiles import Profile
from autotune.sim.runtime import (
    CLIP_MAX_NEW_TOKENS,
    decode_time_s,
    forward_ooms,
    growth_gib,
    prefill_time_s,
    transient_peak_gib,
)
from autotune.sim.startupplan import StartupPlan

RETRACT_DECODE_STEPS = 20
NEW_TOKEN_RATIO_DECAY_STEPS = 600
INIT_NEW_TOKEN_RATIO = 0.7
CATCH_UP_S = 0.05


@dataclass(eq=False)
class Request:
    """One generation request as the scheduler tracks it."""

    rid: str
    input_ids: list[int]
    max_new: int
    ignore_eos: bool = True
    health: bool = False
    created: float = field(default_factory=time.perf_counter)
    seed: int = 0
    output_ids: list[int] = field(default_factory=list)
    text_parts: list[str] = field(default_factory=list)
    cached_tokens: int = 0
    retractions: int = 0
    verify_ct: int = 0
    correct_drafts: int = 0
    drafts_histogram: list[int] = field(default_factory=list)
    finished: bool = False
    finish_reason: str | None = None
    error: str | None = None
    first_token_at: float | None = None
    admitted_at: float | None = None
    finished_at: float | None = None
    event: asyncio.Event = field(default_factory=asyncio.Event)
    # pool state
    match: Match | None = None
    own: int = 0
    filled: int = 0  # tokens of the fill target already in the pool (cached + extended)

    @property
    def fill_target(self) -> int:
        """Tokens the request must have in the pool before it decodes: its prompt and what it
        generated (a retracted request refills both)."""
        return len(self.input_ids) + len(self.output_ids)

    @property
    def remaining(self) -> int:
        """Tokens still to generate before `max_new` is reached."""
        return self.max_new - len(self.output_ids)

    def notify(self) -> None:
        """Wake the HTTP handler waiting on this request (once per step, whatever the step
        produced)."""
        self.event.set()


LATENCY_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0)


@dataclass
class Histogram:
    """Cumulative-bucket histogram (Prometheus style) with constant memory."""

    buckets: tuple[float, ...] = LATENCY_BUCKETS
    counts: list[int] = field(default_factory=lambda: [0] * len(LATENCY_BUCKETS))
    total: float = 0.0
    n: int = 0

    def observe(self, value: float) -> None:
        """Count one value into its bucket and every larger one (Prometheus' cumulative buckets)."""
        self.n += 1
        self.total += value
        for i, edge in enumerate(self.buckets):
            if value <= edge:
                self.counts[i] += 1


@dataclass
class _PrefillBudget:
    """What one prefill batch may still take (PrefillAdder's remaining budgets): pool tokens
    (free + evictable − reserved for the running requests), input tokens (max prefill tokens)
    and, with chunked prefill, the chunk's tokens."""

    total: float
    input: int
    chunk: int | None

    def spend(self, extend: int, total: int) -> None:
        """Admit `extend` new input tokens that hold `total` pool tokens (the extension, plus
        the new tokens reserved for a request that joins the batch)."""
        self.total -= total
        self.input -= extend
        if self.chunk is not None:
            self.chunk -= extend


@dataclass
class Stats:
    """Counters and the gauges SGLang updates at log cadence (for /metrics)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests: int = 0
    cached_tokens: int = 0
    aborted: int = 0
    retracted: int = 0
    running: int = 0
    queued: int = 0
    used_tokens: int = 0
    token_usage: float = 0.0
    gen_throughput: float = 0.0
    cache_hit_rate: float = 0.0
    new_token_ratio: float = 0.0
    spec_accept_length: float = 0.0
    spec_forward_total: int = 0
    spec_accept_total: int = 0
    cuda_graph: bool = False
    ttft: Histogram = field(default_factory=Histogram)
    e2e: Histogram = field(default_factory=Histogram)
    queue_time: Histogram = field(default_factory=Histogram)


FatalHandler = Callable[[str, float, float], None]


class Scheduler:
    """The serving loop around a StartupPlan."""

    def __init__(
        self,
        profile: Profile,
        plan: StartupPlan,
        *,
        seed: int,
        log: LogWriter,
        decode_log_interval: int = 40,
        schedule_conservativeness: float = 1.0,
        radix_cache: bool = True,
        on_oom: FatalHandler | None = None,
        on_peak: Callable[[float], None] | None = None,
        foreign_gib: Callable[[], float] | None = None,
        lines: Lines | None = None,
    ) -> None:
        assert plan.max_total_num_tokens is not None and plan.max_running_requests is not None
        self.profile = profile
        self.lines = lines if lines is not None else Lines()
        self.max_prefill_graph = max(plan.prefill_capture_tokens, default=0)
        self.plan = plan
        self.log = log
        self.pool = plan.max_total_num_tokens
        self.max_running = plan.max_running_requests
        self.chunk = plan.chunked_prefill_size if plan.chunked_prefill_size > 0 else 0
        self.max_prefill = plan.max_prefill_tokens
        self.max_req_len = min(plan.context_len - 1, self.pool - 1)
        self.decode_log_interval = max(1, decode_log_interval)
        self.cache = PrefixCache(radix_cache, plan.host_cache_tokens or 0)
        self.peak_rng = random.Random(seed * 1_000_003 + 1)
        self.spec_rng = random.Random(seed * 1_000_003 + 2)
        self.time_rng = random.Random(seed * 1_000_003 + 3)
        self.on_oom = on_oom
        self.foreign_gib = foreign_gib
        """What other processes took on the server's GPUs since its startup planned (GiB): a
        forward whose peak does not fit beside it runs out of memory as on a real GPU."""
        self.on_peak = on_peak
        """Told what the allocator holds above the static memory whenever that changes: a new
        high-water mark (a forward's peak), or what a flush left (the growth so far)."""
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.chunked: Request | None = None
        self.own_total = 0
        self.init_ratio = min(INIT_NEW_TOKEN_RATIO * schedule_conservativeness, 1.0)
        self.min_ratio = self.init_ratio * 0.14
        self.ratio = self.init_ratio
        self.stats = Stats(new_token_ratio=self.ratio)
        self.max_captured = max(plan.capture_bs) if plan.capture_bs else 0
        self.last_receive = 0.0
        self.max_peak = 0.0
        self.served = 0
        """Requests completed since startup (the allocator's growth counts them)."""
        self._wake = asyncio.Event()
        self._stopped = False
        self._t = 0.0
        self._decode_steps = 0
        self._last_decode_log = time.perf_counter()
        self._tokens_since_log = 0
        self._accept_sum = 0.0
        self._accept_n = 0
        self._last_prefill_log = time.perf_counter()
        self._last_prefill_tokens = 0
        self._forward_ct = 0

    # ---- intake -------------------------------------------------------------------------------

    def submit(self, req: Request) -> None:
        """Queue a request, its `max_new` cut to what the context length leaves; one with no room to
        generate finishes at once with `length`."""
        budget = self.max_req_len - len(req.input_ids) - 1
        req.max_new = max(0, min(req.max_new, budget))
        if req.max_new == 0:
            self._finish(req, "length")
            return
        self.waiting.append(req)
        self._wake.set()

    def abort(self, req: Request) -> None:
        """Abort a request (the client went away): dropped from the queue or finished with `abort`,
        counted."""
        if req.finished:
            return
        if req in self.waiting:
            self.waiting.remove(req)
            self._release(req)
        req.error = req.error or "aborted"
        self.stats.aborted += 1
        self._finish(req, "abort")

    @property
    def queued(self) -> int:
        """Requests waiting to be admitted (`#queue-req`)."""
        return len(self.waiting)

    @property
    def busy(self) -> bool:
        """Whether anything is queued, running or part-way through a chunked prefill."""
        return bool(self.waiting or self.running or self.chunked)

    @property
    def free_tokens(self) -> int:
        """Pool tokens neither requests nor the prefix cache hold."""
        return self.pool - self.own_total - self.cache.gpu_tokens

    @property
    def used_tokens(self) -> int:
        """Pool tokens in use: the requests' own and the cached prefixes they lock (`token
        usage`)."""
        return self.own_total + self.cache.locked_tokens

    def flush(self) -> bool:
        """`/flush_cache`: only when idle, empty the radix cache and give the allocator's cached
        blocks back, as `torch.cuda.empty_cache()` does. What stays held is the footprint the
        allocator grew by while serving (`growth_gib`); the high-water mark falls to it, so the
        next forward raises the memory in use again."""
        if self.busy:
            return False
        self.cache.clear()
        self.max_peak = growth_gib(self.profile, self.served)
        if self.on_peak is not None:
            self.on_peak(self.max_peak)
        return True

    def stop(self) -> None:
        """Stop the serving loop after the current step."""
        self._stopped = True
        self._wake.set()

    # ---- pool ---------------------------------------------------------------------------------

    def _ensure_free(self, tokens_needed: int) -> bool:
        short = tokens_needed - self.free_tokens
        if short > 0:
            self.cache.evict(short)
        return self.free_tokens >= tokens_needed

    def _alloc(self, req: Request, n: int) -> None:
        req.own += n
        self.own_total += n

    def _release(self, req: Request) -> None:
        self.own_total -= req.own
        req.own = 0
        if req.match is not None:
            self.cache.unlock(req.match.nodes, time.perf_counter())
            req.match = None
        req.filled = 0

    def _finish(self, req: Request, reason: str) -> None:
        req.finished = True
        req.finish_reason = reason
        req.finished_at = time.perf_counter()
        req.notify()

    def _complete(self, req: Request) -> None:
        """Cache the finished sequence and give its tokens back."""
        now = time.perf_counter()
        if req.match is not None:
            ids = req.input_ids + req.output_ids
            taken = self.cache.insert(ids, req.match.nodes, now)
            taken = min(taken, req.own)
            req.own -= taken
            self.own_total -= taken
        self._release(req)
        self.served += 1
        if not req.health:
            self.stats.requests += 1
            self.stats.e2e.observe(now - req.created)
        self._finish(req, "length")

    # ---- admission (PrefillAdder) ---------------------------------------------------------------

    def _reserved(self) -> float:
        return sum(min(r.remaining, CLIP_MAX_NEW_TOKENS) * self.ratio for r in self.running)

    def _form_prefill(self) -> list[tuple[Request, int]]:
        if self.chunked is None and not self.waiting:
            return []
        budget = _PrefillBudget(
            total=self.free_tokens + self.cache.evictable_tokens - self._reserved(),
            input=self.max_prefill,
            chunk=self.chunk if self.chunk else None,
        )
        batch: list[tuple[Request, int]] = []
        now = time.perf_counter()
        if self.chunked is not None and self.chunked.finished:
            self._release(self.chunked)
            self.chunked = None
        if self.chunked is not None:
            req = self.chunked
            left = req.fill_target - req.filled
            take = min(left, budget.chunk) if budget.chunk else left
            if not self._ensure_free(take):
                return []
            batch.append((req, take))
            budget.spend(take, take)
            if take < left:
                return batch
            self.chunked = None
        while self.waiting:
            if len(self.running) + len(batch) >= self.max_running:
                break
            if budget.input <= 0 or (budget.chunk is not None and budget.chunk <= 0):
                break
            req = self.waiting[0]
            ids = req.input_ids + req.output_ids
            match = self.cache.match(ids, len(ids) - 1, now)
            extend = len(ids) - match.tokens
            need = extend + min(req.remaining, CLIP_MAX_NEW_TOKENS)
            if need > budget.total and (self.running or batch):
                break
            limit = min(budget.input, budget.chunk) if budget.chunk is not None else budget.input
            take = min(extend, limit) if (budget.chunk is not None or not batch) else extend
            if take < extend and budget.chunk is None and batch:
                break
            if not self._ensure_free(take + match.host_tokens):
                break
            self.waiting.popleft()
            self.cache.load_back(match)
            self.cache.lock(match.nodes)
            req.match = match
            req.cached_tokens = match.tokens
            req.filled = match.tokens
            req.admitted_at = req.admitted_at or now
            batch.append((req, take))
            budget.spend(take, need)
            if take < extend:
                self.chunked = req
                break
        return batch

    # ---- forwards -----------------------------------------------------------------------------

    async def _sleep_step(self, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        jitter = 1.0 + self.time_rng.gauss(0.0, self.profile.timing.variation)
        # Small lags (handlers running between steps) are caught up; idle gaps are not.
        start = max(self._t, loop.time() - CATCH_UP_S)
        self._t = start + seconds * max(jitter, 0.5)
        delay = self._t - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)

    def _check_oom(self, prefill_tokens: int, decode_seqs: int) -> float | None:
        """One forward's transient on top of the static memory (and of what the allocator grew
        by while serving, `mismatch.growth_mib_per_request`); the peak when it does not fit."""
        peak = transient_peak_gib(
            self.profile, prefill_tokens, decode_seqs, self.peak_rng, self.used_tokens
        )
        peak += growth_gib(self.profile, self.served)
        taken = self.foreign_gib() if self.foreign_gib is not None else 0.0
        if forward_ooms(self.plan, peak + taken):
            return peak + taken
        if peak > self.max_peak:
            self.max_peak = peak
            if self.on_peak is not None:
                self.on_peak(peak)
        return None

    async def _run_prefill(self, batch: list[tuple[Request, int]]) -> None:
        new_tokens = sum(take for _, take in batch)
        loaded = sum(r.match.host_tokens if r.match else 0 for r, _ in batch)
        cached = sum(r.cached_tokens for r, take in batch if r.filled == r.cached_tokens)
        for req, take in batch:
            self._alloc(req, take)
        running_before = len(self.running)
        seconds = prefill_time_s(self.profile, new_tokens)
        seconds += loaded * self.plan.cell_bytes / (self.profile.hardware.host_to_device_gbps * 1e9)
        now = await self._forward(seconds, new_tokens, 0)
        if now is None:
            return
        newly_running = []
        for req, take in batch:
            req.filled += take
            if req.finished:  # aborted while in flight
                self._release(req)
                continue
            if req.filled >= req.fill_target:
                if not req.health:
                    self.stats.prompt_tokens += len(req.input_ids)
                    self.stats.cached_tokens += req.cached_tokens
                newly_running.append(req)
        for req in newly_running:
            self._emit(req, 1, now)
            if req.remaining <= 0:
                self._complete(req)
            else:
                self.running.append(req)
        self.last_receive = now
        self._log_prefill(len(batch), new_tokens, cached, running_before)

    def _log_prefill(self, n: int, new_tokens: int, cached: int, running_before: int) -> None:
        now = time.perf_counter()
        gap = max(now - self._last_prefill_log, 1e-6)
        tput = self._last_prefill_tokens / gap
        self._last_prefill_log = now
        self._last_prefill_tokens = new_tokens
        usage = self.used_tokens / self.pool
        pending = sum(r.fill_target for r in self.waiting)
        if self.chunked is not None:
            pending += self.chunked.fill_target - self.chunked.filled
        graph = 0 < new_tokens <= self.max_prefill_graph
        self.log.rank(
            0,
            self.lines.prefill(
                PrefillBatch(
                    n,
                    new_tokens,
                    cached,
                    usage,
                    running_before,
                    len(self.waiting),
                    tput,
                    graph,
                    pending,
                )
            ),
        )
        self._gauges(usage)
        total = self.stats.prompt_tokens or 1
        self.stats.cache_hit_rate = self.stats.cached_tokens / total

    def _gauges(self, usage: float) -> None:
        s = self.stats
        s.running = len(self.running)
        s.queued = len(self.waiting)
        s.used_tokens = self.used_tokens
        s.token_usage = usage
        s.new_token_ratio = self.ratio

    def _tokens_this_step(self, req: Request) -> int:
        if not self.plan.spec or self.profile.draft is None:
            return 1
        draft = self.plan.spec_draft_tokens
        mean = self.profile.draft.accept_length
        p = (mean - 1.0) / max(draft - 1, 1)
        k = 1 + sum(1 for _ in range(draft - 1) if self.spec_rng.random() < p)
        return min(k, req.remaining)

    def _count_verify(self, req: Request, k: int) -> None:
        """Per-request speculative counts (0.5.23's meta_info spec_* fields)."""
        req.verify_ct += 1
        req.correct_drafts += k - 1
        width = max(self.plan.spec_draft_tokens, 1)
        if len(req.drafts_histogram) < width:
            req.drafts_histogram.extend([0] * (width - len(req.drafts_histogram)))
        req.drafts_histogram[min(k - 1, width - 1)] += 1

    def _retract(self, need: int) -> None:
        order = sorted(
            self.running, key=lambda r: (len(r.output_ids), -len(r.input_ids)), reverse=True
        )
        retracted: list[Request] = []
        gained = 0
        while (
            order and len(order) > 1 and not self._ensure_free(need - self._per_req_need(retracted))
        ):
            req = order.pop()
            gained += req.own
            self._release(req)
            req.retractions += 1
            self.running.remove(req)
            retracted.append(req)
        for req in reversed(retracted):
            self.waiting.appendleft(req)
        if retracted:
            old = self.ratio
            decoded = sum(len(r.output_ids) for r in self.running)
            max_new = sum(r.max_new for r in self.running) or 1
            self.ratio = min(1.0, (decoded + RETRACT_DECODE_STEPS * len(self.running)) / max_new)
            self.stats.retracted += len(retracted)
            self.log.rank(0, fmt_retract(len(retracted), gained, old, self.ratio))

    def _per_req_need(self, retracted: list[Request]) -> int:
        per = self.plan.spec_draft_tokens if self.plan.spec else 1
        return per * len(retracted)

    async def _run_decode(self) -> None:
        per = self.plan.spec_draft_tokens if self.plan.spec else 1
        need = per * len(self.running)
        if not self._ensure_free(need):
            self._retract(need)
        bs = len(self.running)
        if bs == 0:
            return
        graph = bs <= self.max_captured
        kv = sum(r.filled + len(r.output_ids) for r in self.running)
        seconds = decode_time_s(self.profile, bs, kv, graph)
        now = await self._forward(seconds, 0, bs)
        if now is None:
            return
        self._decode_steps += 1
        if self.ratio > self.min_ratio:
            step = (self.init_ratio - self.min_ratio) / NEW_TOKEN_RATIO_DECAY_STEPS
            self.ratio = max(self.min_ratio, self.ratio - step)
        done = []
        produced = 0
        for req in self.running:
            if req.finished:
                done.append(req)
                continue
            k = self._tokens_this_step(req)
            if self.plan.spec:
                self._count_verify(req, k)
            produced += k
            self._accept_sum += k
            self._accept_n += 1
            if self.plan.spec:
                self.stats.spec_forward_total += 1
                self.stats.spec_accept_total += k
            self._emit(req, k, now)
            if req.remaining <= 0:
                done.append(req)
        for req in done:
            self.running.remove(req)
            if req.finished:
                self._release(req)
            else:
                self._complete(req)
        self._tokens_since_log += produced
        self.last_receive = now
        if self._decode_steps % self.decode_log_interval == 0:
            self._log_decode(bs, graph)

    def _log_decode(self, bs: int, graph: bool) -> None:
        now = time.perf_counter()
        gap = max(now - self._last_decode_log, 1e-6)
        tput = self._tokens_since_log / gap
        self._last_decode_log = now
        self._tokens_since_log = 0
        accept = None
        if self.plan.spec and self._accept_n:
            mean = self._accept_sum / self._accept_n
            accept = (mean, (mean - 1) / max(self.plan.spec_draft_tokens - 1, 1))
            self.stats.spec_accept_length = mean
        self._accept_sum = 0.0
        self._accept_n = 0
        usage = self.used_tokens / self.pool
        self.log.rank(
            0,
            self.lines.decode(
                DecodeBatch(bs, self.used_tokens, usage, graph, tput, len(self.waiting), accept)
            ),
        )
        self._gauges(usage)
        self.stats.gen_throughput = tput
        self.stats.cuda_graph = graph

    def _emit(self, req: Request, k: int, now: float) -> None:
        for _ in range(k):
            tid = tokens.generated_id(req.seed, len(req.output_ids))
            req.output_ids.append(tid)
            req.text_parts.append(tokens.decode_piece(tid))
        self._alloc(req, k)
        if req.first_token_at is None:
            req.first_token_at = now
            if not req.health:
                self.stats.ttft.observe(now - req.created)
                if req.admitted_at is not None:
                    self.stats.queue_time.observe(req.admitted_at - req.created)
        if not req.health:
            self.stats.generation_tokens += k
        req.notify()

    def _fatal_oom(self, peak: float) -> None:
        self._stopped = True
        if self.on_oom is not None:
            self.on_oom("oom", peak, self.plan.avail_final_gib or 0.0)

    async def _forward(self, seconds: float, prefill_tokens: int, decode_seqs: int) -> float | None:
        """One forward of `seconds`: when its peak does not fit, the server dies of it halfway
        through (None); otherwise the clock once it is done, the forward counted."""
        oom = self._check_oom(prefill_tokens, decode_seqs)
        if oom is not None:
            await self._sleep_step(seconds / 2)
            self._fatal_oom(oom)
            return None
        await self._sleep_step(seconds)
        now = time.perf_counter()
        self._forward_ct += 1
        return now

    # ---- loop ---------------------------------------------------------------------------------

    async def run(self) -> None:
        """The serving loop: a prefill when anything is admissible, else a decode step for the
        running requests, else wait for a request; until `stop`."""
        self._t = asyncio.get_running_loop().time()
        while not self._stopped:
            batch = self._form_prefill()
            if batch:
                await self._run_prefill(batch)
                continue
            if self.running:
                await self._run_decode()
                continue
            self._wake.clear()
            if self.waiting or self.chunked:
                # Nothing admissible now: wait for a change rather than spin.
                await asyncio.sleep(0.005)
                continue
            await self._wake.wait()
            self._t = asyncio.get_running_loop().time()
