"""The memory model: SGLang's own arithmetic as the values a forecast speaks in, and the model
that answers a candidate's forecast once `autotune.memory.fit` fitted it to the launches' ledgers.

It owns what the model says and how it predicts, not how it learns: the values (`Estimate`,
`Setting`, `Observation`, `Forecast`, `Line`), the model (`MemoryModel`, its stress peak
`PeakModel`), the chances a forecast is read by (`phi`, `p_above_floor`, `peak_fall_gib`) and the
priors both the forecast and the fit use. In the rules of the SGLang version the logs show
(`autotune.logparse.semantics`):

* The KV pool is `N(f) = ⌊(f·P − W)·2^30 / cell⌋`, linear in `mem_fraction_static` f; `cell` is
  the *sizing* cell, what SGLang divides the budget by: the target's KV line up to 0.5.9, that
  plus the folded EAGLE draft from 0.5.18 (`cell.sizing_cell`).
* Each pool token takes `kv_cell_bytes` of GPU memory: the target's and the draft's KV lines
  together, so the draft is counted once in either version (up to 0.5.9 it is outside the
  sizing cell, from 0.5.18 inside it).
* Everything allocated after the pool (request table, workspaces, CUDA graphs, and up to 0.5.9
  the draft's weights and graphs) is the *overhead* O. It does not depend on f; it grows with
  the request slots (max_running_requests) through the request table (slots × context × 4 B) and
  the captured CUDA-graph batch sizes. Static free memory after startup is `A − N·kv_cell − O(r)`.
* Under load a transient peak comes on top (prefill activations, decode batches), a function of
  max_running_requests and the prefill chunk. A runtime OOM says the peak exceeded the static
  free memory of that launch.
* Host RAM for HiCache follows the version's rule: up to 0.5.18 "only have Y GB free" is the
  machine's (all ranks share it) and a host pool not larger than the GPU pool stops the start
  (0.5.9); in 0.5.23 Y is one rank's budget and a small pool is only a warning. The draft's host
  pool (0.5.18+) holds as many tokens as the target's and is counted with it.
* A setting is stable when `static free − stress peak ≥ required headroom`; every figure carries
  a standard deviation, so the OOM edge comes with its uncertainty.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from autotune.logparse.events import POOL_OOM_KINDS
from autotune.logparse.ledger import Ledger
from autotune.logparse.outcome import Outcome, cause_of
from autotune.logparse.semantics import Semantics, rules
from autotune.memory.arithmetic import free_after_capture_gib
from autotune.memory.pool import GIB, kv_gib, stress_peak_gib

GiB = GIB
MAX_GRAPH_BATCH = 512
PEAK_TOKENS_PER_REQUEST = 8.0
"""Prior: one decode sequence weighs at most this many prefill tokens in a forward's peak."""
CHUNK_SLOPE_REL_SD = 0.3
"""Prior: the peak is proportional to the prefill chunk, its slope uncertain by this share until
launches of two chunks measured it."""
_HOST_FREE = re.compile(r"only have ([0-9.]+) GB free")


def phi(z: float) -> float:
    """The standard normal CDF."""
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


@dataclass(frozen=True)
class Estimate:
    """A value with its standard deviation."""

    mean: float
    sd: float

    def __str__(self) -> str:
        return f"{self.mean:.2f} ± {self.sd:.2f}"

    def plus(self, other: Estimate) -> Estimate:
        """The sum of two independent estimates: means add, standard deviations in quadrature."""
        return Estimate(self.mean + other.mean, math.hypot(self.sd, other.sd))

    def minus(self, other: Estimate) -> Estimate:
        """The difference of two independent estimates: means subtract, standard deviations in
        quadrature."""
        return Estimate(self.mean - other.mean, math.hypot(self.sd, other.sd))

    def p_at_least(self, threshold: float) -> float:
        """Probability that the true value is ≥ threshold."""
        if self.sd <= 0:
            return 1.0 if self.mean >= threshold else 0.0
        return phi((self.mean - threshold) / self.sd)


@dataclass(frozen=True)
class Setting:
    """The memory-relevant settings of one launch; None = the server's default."""

    mem_fraction: float
    max_running_requests: int | None = None
    chunked_prefill_size: int | None = None
    hicache_gb: float = 0.0


@dataclass(frozen=True)
class Observation:
    """What one finished launch recorded."""

    setting: Setting
    ledger: Ledger
    outcome: str  # ok | startup_oom | startup_error | runtime_oom | crash | ...
    stress_peak_gib: float | None = None
    headroom_gib: float | None = None
    feasible: bool = False
    reason: str = ""
    growth_gib: float | None = None
    """What the allocator kept once the workload was over (GPU use after it minus before it,
    each read right after `/flush_cache`); the model takes free memory as static, so growth is
    evidence against it (`search.doubt`), never fitted."""

    @property
    def tokens(self) -> int | None:
        """The KV pool's tokens the launch's log showed (`max_total_num_tokens`), None when it never
        got that far."""
        return self.ledger.max_total_num_tokens

    @property
    def gpu_oom_under_load(self) -> bool:
        """Whether the launch ran out of GPU memory while serving: a runtime OOM, not one of the
        KV pool's own token slots (`logparse.events.POOL_OOM_KINDS`) nor a crash of another
        kind. Only such a death says the peak reached the static free memory."""
        return self.outcome == Outcome.RUNTIME_OOM and cause_of(self.reason) not in POOL_OOM_KINDS

    @property
    def started(self) -> bool:
        """Whether the launch came up (no startup ending) and the log shows its free memory after
        startup: only those say what the static free memory is."""
        return not Outcome.of(self.outcome).fails_at_startup and self.static_free_gib is not None

    @property
    def static_free_gib(self) -> float | None:
        """Free GPU memory once startup allocated everything (the last figure the log shows)."""
        return free_after_capture_gib(self.ledger)

    @property
    def slots(self) -> int | None:
        """Request slots: the requested max_running_requests, else what the server reported."""
        return self.setting.max_running_requests or self.ledger.max_running_requests

    @property
    def chunk(self) -> int | None:
        """The prefill chunk the launch ran with: the requested `chunked_prefill_size`, else what
        the server reported choosing."""
        return self.setting.chunked_prefill_size or self.ledger.chunked_prefill_size

    @property
    def measured_peak_gib(self) -> float | None:
        """The stress peak: recorded, or static free minus the least free seen under load."""
        if self.stress_peak_gib is not None:
            return self.stress_peak_gib
        free = self.static_free_gib
        if self.outcome == "ok" and free is not None and self.headroom_gib is not None:
            return stress_peak_gib(free, self.headroom_gib)
        return None

    @property
    def host_free_gb(self) -> float | None:
        """Host RAM SGLang said it had, from a failed host-cache allocation ("only have Y GB
        free": the ledger's figure, else the failure text)."""
        if self.ledger.host_free_gb is not None:
            return self.ledger.host_free_gb
        m = _HOST_FREE.search(self.reason)
        return float(m.group(1)) if m else None

    @property
    def semantics(self) -> Semantics:
        """The SGLang memory rules the launch's log follows (`logparse.semantics`)."""
        return rules(self.ledger.semantics)

    @property
    def host_budget_gb(self) -> float | None:
        """One rank's host budget in 0.5.23's terms, `(available − 10 GiB) ÷ ranks`: the
        auto-sizing line's figure, or a failure's Y plus the host pools that launch had already
        booked on the rank (a draft pool checks after the target's pool took its share)."""
        led = self.ledger
        if led.host_budget_gb is not None:
            return led.host_budget_gb
        free = self.host_free_gb
        if free is None or not self.semantics.host_free_per_rank:
            return None
        return free + (led.host_cache_gb or 0.0) + (led.draft_host_cache_gb or 0.0)


def peak_fall_gib(peak_gib: float, growth_gib: float | None, was: int, to: int) -> float:
    """How far a stress peak of `peak_gib` should fall with the prefill chunk cut from `was` to
    `to` tokens, counted at the low end of the chunk prior: the peak less the server's growth
    over the trial is a prefill's transient, taken as proportional to the chunk, and the fall is
    two spreads of `CHUNK_SLOPE_REL_SD` below the proportional one (part of a peak, a base and
    the decode batch, does not shrink with the chunk)."""
    transient = max(peak_gib - max(growth_gib or 0.0, 0.0), 0.0)
    least = transient * (1.0 - 2.0 * CHUNK_SLOPE_REL_SD)
    return least * (1.0 - to / was)


def p_above_floor(room_gib: float, floor_gib: float) -> float:
    """The chance that a peak known only to exceed `floor_gib` (it ran out of that much free
    memory) fits in `room_gib`. How far past the floor it went is unknown; the prior puts the
    excess on the scale of the floor itself (exponential, mean the floor: the median peak is
    1.7 times the floor), so a setting with barely more room than the launch that ran out is
    no coin toss, and one with twice the room is a fair bet."""
    if room_gib <= floor_gib:
        return 0.0
    scale = max(floor_gib, 0.05)
    return 1.0 - math.exp(-(room_gib - floor_gib) / scale)


@dataclass(frozen=True)
class Forecast:
    """The model's view of one candidate before launching it."""

    setting: Setting
    tokens: Estimate | None
    static_free: Estimate | None
    stress_peak: Estimate | None
    blocked: str | None = None
    """Why the model says it cannot start (no room for KV, host RAM), or None."""
    peak_floor: float | None = None
    """A lower bound on the stress peak from a runtime OOM, used while no peak was measured."""

    @property
    def headroom(self) -> Estimate | None:
        """Free memory left at the stress peak (static free minus the peak), None until both are
        known."""
        if self.static_free is None or self.stress_peak is None:
            return None
        return self.static_free.minus(self.stress_peak)

    def p_start(self) -> float:
        """The probability that the candidate starts: 0 when blocked, a coin toss with no static
        figure, else the chance its static free memory is not negative."""
        if self.blocked is not None:
            return 0.0
        return self.static_free.p_at_least(0.0) if self.static_free is not None else 0.5

    def p_stable(self, min_headroom_gib: float) -> float:
        """Probability that it starts and keeps `min_headroom_gib` free through the stress peak."""
        head = self.headroom
        if self.blocked is not None:
            return 0.0
        if head is None:
            # nothing measured: a coin toss, unless an OOM showed the peak exceeds a floor
            free, floor = self.static_free, self.peak_floor
            if free is None or floor is None:
                return 0.5 * self.p_start()
            return min(p_above_floor(free.mean - min_headroom_gib, floor), self.p_start())
        return min(head.p_at_least(min_headroom_gib), self.p_start())

    def describe(self) -> str:
        """One line: 'predicted 201,900 tokens, headroom 3.1 GiB, stress peak 2.4 ± 0.2 GiB'."""
        if self.blocked is not None:
            return f"cannot start: {self.blocked}"
        parts = []
        if self.tokens is not None:
            parts.append(f"predicted {round(self.tokens.mean):,} tokens")
        if self.static_free is not None:
            parts.append(f"static free {self.static_free} GiB")
        if self.stress_peak is not None:
            parts.append(f"stress peak {self.stress_peak} GiB")
        head = self.headroom
        if head is not None:
            parts.append(f"headroom {head} GiB")
        return ", ".join(parts) if parts else "no prediction yet"


@dataclass(frozen=True)
class Line:
    """y = intercept + slope·x with the residual sd and the x values it was fitted on."""

    intercept: float
    slope: float
    sd: float
    slope_sd: float
    xs: tuple[float, ...]

    def at(self, x: float) -> Estimate:
        """The line's value at `x`, its sd widened by the slope's uncertainty the farther `x` is
        from the nearest x it was fitted on."""
        nearest = min(self.xs, key=lambda v: abs(v - x)) if self.xs else x
        extra = self.slope_sd * abs(x - nearest)
        return Estimate(self.intercept + self.slope * x, math.hypot(self.sd, extra))


@dataclass(frozen=True)
class MemoryModel:
    """SGLang's sizes fitted to observations; `forecast` predicts any candidate."""

    p_gib: Estimate | None = None
    weights_gib: float | None = None
    avail_after_weights: Estimate | None = None
    cell_bytes: float | None = None
    """The sizing cell: bytes per token SGLang divides the KV budget by (0.5.18+: with the EAGLE
    draft folded in)."""
    tokens_slope: float | None = None
    """Tokens per unit of mem_fraction_static (P·2^30/cell)."""
    tokens_offset: float | None = None
    tokens_sd: float = 0.0
    tokens_cap: int | None = None
    """`--max-total-tokens` where the launches set it: SGLang holds the pool to it whatever the
    fraction (`min(capacity, max_total_tokens)`), so the predicted pool stops there."""
    draft_ratio: float = 0.0
    """Draft KV bytes per target KV byte (same token count), as the KV lines show it."""
    kv_cell_bytes: float | None = None
    """GPU bytes each pool token takes, target and draft pools together (the KV lines): what
    the static free memory loses per token. None: `cell_bytes` (no draft)."""
    semantics: str = "0.5.9"
    """The SGLang rule set the observations follow (`logparse.semantics`)."""
    slot_gib: float = 0.0
    """Request-table GiB per request slot."""
    graph: Line | None = None
    """CUDA-graph GiB (target + draft) against the largest captured batch."""
    other_overhead: Estimate | None = None
    """Workspaces, draft weights and the like: overhead that depends on nothing searched."""
    peak: PeakModel | None = None
    peak_floors: tuple[tuple[Setting, float], ...] = ()
    """Runtime OOMs: (setting, static free) — that setting's peak exceeded that free memory."""
    host_bytes_per_token: float | None = None
    host_draft_ratio: float = 0.0
    """Draft host pool GB per target host pool GB (0.5.18+; same token count)."""
    host_free_gb: float | None = None
    """The least "only have Y GB free" a host-cache failure reported."""
    host_budget_gb: float | None = None
    """0.5.23: one rank's host budget, the least seen."""
    ranks: int = 1
    observations: int = 0
    probe_offset: Estimate = Estimate(0.0, 0.0)
    """How much less free memory the GPU probe shows than the log at the same moment; the
    headroom constraint is judged on the probe."""

    # ---- predictions -----------------------------------------------------------------------

    def tokens(self, fraction: float) -> Estimate | None:
        """The KV pool's tokens at `fraction`: `⌊slope·f − offset⌋`, SGLang's linear sizing; None
        until a launch showed its pool."""
        if self.tokens_slope is None or self.tokens_offset is None:
            return None
        n = math.floor(self.tokens_slope * fraction - self.tokens_offset)
        if self.tokens_cap is not None and n >= self.tokens_cap:
            return Estimate(float(self.tokens_cap), 0.0)
        return Estimate(float(n), self.tokens_sd)

    def overhead(self, slots: int | None) -> Estimate | None:
        """What startup allocates after the pool at `slots` request slots: the fixed part, the CUDA
        graphs at the largest captured batch (capped at `MAX_GRAPH_BATCH`) and the request table."""
        if self.graph is None or self.other_overhead is None or slots is None:
            return None
        batch = float(min(slots, MAX_GRAPH_BATCH))
        return self.other_overhead.plus(self.graph.at(batch)).plus(
            Estimate(self.slot_gib * slots, 0.0)
        )

    def graph_gib(self, slots: int) -> Estimate | None:
        """CUDA-graph memory (target + draft) with `slots` request slots."""
        return self.graph.at(float(min(slots, MAX_GRAPH_BATCH))) if self.graph else None

    def static_free(self, s: Setting, slots: int | None) -> Estimate | None:
        """Free GPU memory once startup is done, as the GPU probe will see it."""
        n = self.tokens(s.mem_fraction)
        o = self.overhead(slots)
        a = self.avail_after_weights
        if n is None or o is None or a is None or self.cell_bytes is None:
            return None
        kv_cell = self.kv_cell_bytes or self.cell_bytes
        kv = Estimate(kv_gib(n.mean, kv_cell), n.sd * kv_cell / GiB)
        return a.minus(kv).minus(o).minus(self.probe_offset)

    def stress_peak(
        self, s: Setting, slots: int | None, chunk: int | None, pool: float | None = None
    ) -> Estimate | None:
        """The fitted peak for a pool of `pool` tokens, raised to what an OOM showed; None while
        no peak was measured."""
        if self.peak is None:
            return None
        est = self.peak.at(slots, chunk, pool)
        floor = self.peak_floor(s, slots, chunk)
        if floor is not None and est.mean < floor + 0.05:
            est = Estimate(floor + 0.05, max(est.sd, 0.05 * floor, 0.05))
        return est

    def peak_floor(self, s: Setting, slots: int | None, chunk: int | None) -> float | None:
        """The peak is known to exceed this: a launch needing no more transient memory OOMed
        above it. While no peak was measured, a launch with more requests (and no smaller
        chunk) bounds a setting with fewer too, scaled down by what those requests can weigh at
        most: the peak grows with the chunk and at most PEAK_TOKENS_PER_REQUEST chunk tokens per
        request. Once peaks are measured they say what fewer requests take; an OOM with more
        says only that more requests weigh more than the fit thought."""
        floors = []
        for other, free in self.peak_floors:
            if _dominates(s, slots, chunk, other):
                floors.append(free)
            elif self.peak is None and _dominates(s, other.max_running_requests, chunk, other):
                c = float(chunk or other.chunked_prefill_size or 0)
                if c > 0:
                    fewer = c + PEAK_TOKENS_PER_REQUEST * (slots or 0)
                    more = c + PEAK_TOKENS_PER_REQUEST * (other.max_running_requests or 0)
                    floors.append(free * fewer / more)
        return max(floors, default=None)

    def oom_edge(self, fc: Forecast, min_headroom_gib: float) -> Estimate | None:
        """The mem_fraction_static at which the stress headroom falls to `min_headroom_gib`, for
        the other settings of `fc`: free memory shrinks by P·(GPU bytes per token ÷ sizing
        cell) GiB per unit of f, the draft counted once."""
        head = fc.headroom
        if head is None or self.p_gib is None:
            return None
        per_unit = self.p_gib.mean * self.free_per_budget
        f = fc.setting.mem_fraction + (head.mean - min_headroom_gib) / per_unit
        return Estimate(f, head.sd / per_unit)

    @property
    def free_per_budget(self) -> float:
        """GiB of free GPU memory lost per GiB of KV budget: 1 + the draft up to 0.5.9 (its pool
        is outside the budget), about 1 from 0.5.18 (it is inside)."""
        if self.cell_bytes and self.kv_cell_bytes:
            return self.kv_cell_bytes / self.cell_bytes
        return 1.0

    def forecast(
        self, s: Setting, *, default_slots: int | None, default_chunk: int | None
    ) -> Forecast:
        """The model's view of setting `s` before it is launched, the server's defaults standing in
        for the slots and chunk it leaves unset."""
        slots = s.max_running_requests or default_slots
        chunk = s.chunked_prefill_size or default_chunk
        tokens = self.tokens(s.mem_fraction)
        blocked = self._blocked(s, tokens)
        return Forecast(
            setting=s,
            tokens=tokens,
            static_free=self.static_free(s, slots),
            stress_peak=self.stress_peak(s, slots, chunk, tokens.mean if tokens else None),
            blocked=blocked,
            peak_floor=self.peak_floor(s, slots, chunk),
        )

    def _blocked(self, s: Setting, tokens: Estimate | None) -> str | None:
        if tokens is not None and tokens.mean <= 0:
            return (
                f"no room for KV: mem_fraction_static {s.mem_fraction:g} × P "
                f"{self.p_gib.mean if self.p_gib else 0:.2f} GiB is below the weights"
            )
        if s.hicache_gb > 0:
            return self._host_blocked(s, tokens)
        return None

    def _host_blocked(self, s: Setting, tokens: Estimate | None) -> str | None:
        """The version's host rules for `--hicache-size` GB per rank (and the draft's pool of the
        same tokens beside it)."""
        sem = rules(self.semantics)
        per_token = self.host_bytes_per_token or self.cell_bytes
        if sem.host_smaller_fatal and per_token and tokens is not None:
            host_tokens = s.hicache_gb * 1e9 / per_token
            if host_tokens <= tokens.mean:
                return (
                    f"host cache {s.hicache_gb:g} GB holds {host_tokens:,.0f} tokens, "
                    f"not more than the GPU pool's {tokens.mean:,.0f}"
                )
        need = s.hicache_gb * (1.0 + self.host_draft_ratio)
        draft = " (with the draft's pool)" if self.host_draft_ratio else ""
        if sem.host_free_per_rank:
            if self.host_budget_gb is not None and need > self.host_budget_gb:
                return (
                    f"host RAM: {need:g} GB per rank{draft} > {self.host_budget_gb:g} GB per "
                    f"rank free"
                )
            return None
        if self.host_free_gb is not None and need * self.ranks > self.host_free_gb:
            return f"host RAM: {self.ranks} × {need:g} GB{draft} > {self.host_free_gb:g} GB free"
        return None

    def describe(self) -> str:
        """What the model has learnt, in one line."""
        parts = []
        if self.p_gib is not None:
            parts.append(f"P {self.p_gib.mean:.2f} GiB")
        if self.weights_gib is not None:
            parts.append(f"weights {self.weights_gib:.2f} GiB")
        if self.cell_bytes is not None:
            parts.append(f"{self.cell_bytes:,.0f} B/token")
        if self.graph is not None:
            x = self.graph.xs[0]
            parts.append(f"graphs {self.graph.at(x).mean:.2f} GiB at {x:.0f} requests")
        if self.peak is not None:
            parts.append(f"stress peak {self.peak.describe()}")
        return ", ".join(parts) + f" (from {self.observations} launches)"


def _dominates(s: Setting, slots: int | None, chunk: int | None, other: Setting) -> bool:
    """True when s needs at least as much transient memory as `other`."""
    if (slots or 0) < (other.max_running_requests or 0):
        return False
    return not (
        chunk is not None
        and other.chunked_prefill_size is not None
        and chunk < other.chunked_prefill_size
    )


@dataclass(frozen=True)
class PeakModel:
    """Stress peak GiB = base + per_request·slots + per_chunk_token·chunk + per_pool_token·pool,
    with an sd. The pool term is the transient that grows with the live context of the batch
    (a stress phase fills the KV pool): fitted only once launches of different pool sizes
    measured peaks, and uncertain by its slope's standard error away from their mean."""

    base: float
    per_request: float
    per_request_sd: float
    per_chunk_token: float
    per_chunk_token_sd: float
    sd: float
    slots_seen: tuple[int, ...]
    chunks_seen: tuple[int, ...]
    per_pool_token: float = 0.0
    per_pool_token_sd: float = 0.0
    pool_mean: float = 0.0
    """The mean pool size (tokens) of the launches the pool term was fitted on."""

    def at(self, slots: int | None, chunk: int | None, pool: float | None = None) -> Estimate:
        """The stress peak at `slots`, `chunk` and a pool of `pool` tokens (the first seen where
        unset), its sd widened by each slope's uncertainty away from what was measured."""
        r = slots if slots is not None else (self.slots_seen[0] if self.slots_seen else 0)
        c = chunk if chunk is not None else (self.chunks_seen[0] if self.chunks_seen else 0)
        dt = (pool - self.pool_mean) if pool is not None and self.per_pool_token else 0.0
        mean = self.base + self.per_request * r + self.per_chunk_token * c
        mean += self.per_pool_token * dt
        dr = min((abs(r - x) for x in self.slots_seen), default=0)
        dc = min((abs(c - x) for x in self.chunks_seen), default=0)
        sd = math.sqrt(
            self.sd**2
            + (self.per_request_sd * dr) ** 2
            + (self.per_chunk_token_sd * dc) ** 2
            + (self.per_pool_token_sd * dt) ** 2
        )
        return Estimate(max(mean, 0.0), sd)

    def describe(self) -> str:
        """The peak at the first slots and chunk seen, for the model's one-line description."""
        r = self.slots_seen[0] if self.slots_seen else None
        c = self.chunks_seen[0] if self.chunks_seen else None
        return f"{self.at(r, c)} GiB"
