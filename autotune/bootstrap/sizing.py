"""The search space and the baseline: the current memory settings, and the ranges a log's ledger
allows.

With a log that shows the pool (P, A, the KV line, the free memory after startup) the
`mem_fraction_static` range runs from the lowest fraction whose pool holds one prefill chunk to
the highest whose reserve `P·(1 − f)` still holds what the log shows came after the pool: the
request table, the CUDA graphs, the draft (up to 0.5.9 its weights, KV and graphs) and the
workspaces, i.e. where the predicted free memory after startup reaches 0
(`memory.arithmetic.Arithmetic.at`). The transient peak under load comes on top; the search
finds it. Without such a log the ranges are set around the current values and say so. The grid
is anchored on the baseline, so a fraction SGLang chose itself (0.827) stays on it. A fraction
with more decimals than a grid point keeps (SGLang 0.5.8's `adjust_mem_fraction_for_vlm` in
`server_args.py` scales its own choice for a vision tower: 0.8260405859375) is the baseline as it
ran, and the range around it has no step: its ends are on the hundredths and the capacity sampler
walks its own lattice (`config.space.CONTINUOUS_FRACTION_STEP`); a step from a round low would
leave the baseline off the grid, one anchored on it would make every point as long.

`max_running_requests` is sized from the pool: the choices are at most what the baseline's pool
holds at the workload's sketched prompt + answer length (or the most the log's serving lines ran
at once, when that is more), spread below it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.bootstrap.traffic import MAX_CONCURRENCY
from autotune.config.schema import Scalar
from autotune.logparse.ledger import Ledger
from autotune.logparse.semantics import rules
from autotune.memory.arithmetic import Arithmetic, arithmetic, free_after_capture_gib
from autotune.memory.pool import lowest_fraction
from autotune.server.hostmem import HostBound, Limit

STEP = 0.01
LOWEST, HIGHEST = 0.05, 0.99
SPAN = 0.30
"""The widest fraction range: further below the top a launch only gives up capacity."""
MAX_SLOTS = MAX_CONCURRENCY
NEAR = 0.02
"""A request-slot choice within this share of the current value is the same choice."""
MRR_FACTORS = (2 / 3, 1.0, 4 / 3, 2.0, 8 / 3)
"""max_running_requests choices around the current value (48 → 32, 48, 64, 96, 128)."""
BELOW_FACTORS = (1 / 4, 1 / 3, 1 / 2, 2 / 3)
"""Choices below the most the pool holds, when the current value is not below it."""
GRID_DECIMALS = 4
"""The decimals a fraction on the step's grid keeps (`config.space._snap`: the step's + 2)."""


@dataclass(frozen=True)
class Current:
    """The operator's memory settings and where each came from."""

    fraction: float | None = None
    fraction_from: str = ""
    max_running_requests: int | None = None
    mrr_from: str = ""
    mrr_by_command: bool = False
    """The command (`--from-cmd`, `--from-unit`) sets it: the operator's own choice."""
    hicache_on: bool = False
    hicache_size: int | float | None = None
    """GB per rank; None (with `hicache_on`) when the cache is sized by --hicache-ratio."""
    hicache_from: str = ""


@dataclass(frozen=True)
class Knob:
    """One `[search]` entry: its TOML value, the comments above it and its baseline."""

    name: str
    value: str
    comments: tuple[str, ...] = ()
    baseline: Scalar | None = None
    baseline_note: str = ""
    top: int | None = None
    """The largest value searched, for a knob whose values the workload must be able to fill."""


def _gib(x: float) -> str:
    return f"{0.0 if round(x, 2) == 0 else x:.2f} GiB"  # never "-0.00"


def _on_grid(x: float, anchor: float, up: bool) -> float:
    k = (x - anchor) / STEP
    n = math.ceil(k - 1e-6) if up else math.floor(k + 1e-6)
    return round(anchor + n * STEP, 4)


def grid_anchor(b: float | None) -> float | None:
    """What the fraction's grid is anchored on: the baseline when a grid point can be it (its
    decimals fit the grid's), else None: the range has no step, its ends on the hundredths."""
    if b is None or round(b, GRID_DECIMALS) == b:
        return b
    return None


def _fraction_text(low: float, high: float, stepped: bool = True) -> str:
    if not stepped:
        return f"{{ low = {low:g}, high = {high:g} }}"
    return f"{{ low = {low:g}, high = {high:g}, step = {STEP:g} }}"


def _stepless_note(b: float) -> str:
    return (
        f"no step: the baseline {b!r} (as SGLang computed it) is on no 0.01 grid with round "
        "ends; the capacity sampler walks its own lattice between low and high"
    )


def _bounded(low: float, high: float, anchor: float) -> tuple[float, float]:
    low = max(low, _on_grid(LOWEST, anchor, up=True))
    high = min(high, _on_grid(HIGHEST, anchor, up=False))
    if high <= low:
        high = round(low + STEP, 4)
    return low, high


Failure = tuple[float, str]
"""A run the log shows failing for its fraction: (f, "lower") ran out of GPU memory after the
pool, (f, "raise") had no room for one, (f, "at_most") ran out of GPU memory under load,
(f, "at_least") ran out of the KV pool's own token slots under load (a bigger pool helps)."""


def _exclude(
    low: float, high: float, b: float | None, failed: Failure | None, anchor: float
) -> tuple[float, float, float | None, str | None]:
    """The range (and baseline) without the side of a failed start."""
    if failed is None:
        return low, high, b, None
    f, way = failed
    if way == "lower":
        high = min(high, _on_grid(f - STEP / 2, anchor, up=False))
        why = f"the log's start at {f:g} ran out of GPU memory: the range stays below it"
    elif way == "at_least":
        low = max(low, _on_grid(f - STEP / 2, anchor, up=True))
        why = (
            f"the log's server ran out of KV pool token slots under load at {f:g} (SGLang's "
            "allocator, not GPU memory; the pool grows with the fraction): the range starts there"
        )
    elif way == "at_most":
        high = min(high, _on_grid(f + STEP / 2, anchor, up=False))
        why = (
            f"the log's server ran out of GPU memory under load at {f:g}: the range tops out there"
        )
    else:
        low = max(low, _on_grid(f + STEP / 2, anchor, up=True))
        why = f"the log's start at {f:g} had no room for a KV pool: the range stays above it"
    if high <= low:
        high = round(low + STEP, 4)
    if b is not None and not low <= b <= high:
        b = None
        why += ", so the baseline is left to the sampler"
    return low, high, b, why


def fraction_knob(
    current: Current,
    ledger: Ledger | None,
    log_fraction: float | None,
    failed: Failure | None = None,
) -> Knob:
    """The `mem_fraction_static` range and baseline: sized from the ledger's arithmetic when the log
    shows the pool, else from P and A alone, else around the current value, else the usual
    0.80–0.94; a fraction the log failed at (`failed`) is excluded from the side it failed on."""
    b = current.fraction
    arith = (
        arithmetic(ledger, log_fraction)
        if ledger is not None and log_fraction is not None
        else None
    )
    if arith is not None and arith.tokens:
        return _fraction_from_ledger(current, arith, ledger, failed)  # type: ignore[arg-type]
    comments: list[str] = []
    around = False
    if ledger is not None and ledger.p_gib and ledger.avail_after_weights_gib is not None:
        floor = lowest_fraction(ledger.p_gib, ledger.avail_after_weights_gib)
        anchor = grid_anchor(b) or 0.0
        low = _on_grid(floor + STEP / 2, anchor, up=True)
        high = _on_grid(max(low + 0.1, 0.94, (b or low) + 0.04), anchor, up=False)
        comments.append(
            f"the log shows P = {_gib(ledger.p_gib)} and A = "
            f"{_gib(ledger.avail_after_weights_gib)} but no KV pool: below f = {floor:.3f} "
            "nothing is left for one; the top is the usual 0.94, not sized from the log"
        )
    elif b is not None:
        a = grid_anchor(b) or 0.0
        low = _on_grid(max(0.5, b - 0.08), a, up=True)
        high = _on_grid(min(0.97, b + 0.06), a, up=False)
        around = True
    else:
        low, high = 0.80, 0.94
        comments.append(
            "the command leaves mem_fraction_static to SGLang and there is no log to show what "
            "it chose: the usual range for large models (--from-log sizes it)"
        )
    stepped = b is None or grid_anchor(b) is not None
    anchor = (grid_anchor(b) or 0.0) if b is not None else low
    low, high = _bounded(low, high, anchor)
    if b is not None:
        low, high = min(low, b), max(high, b)
    if around and b is not None:
        comments.append(
            f"no log to size it from: {low:g}–{high:g} around the current {b:g} (0.08 below to "
            "0.06 above it within 0.5–0.97, and the current value itself; autotune init "
            "--from-log server.log sizes it from the memory ledger)"
        )
    low, high, b, why = _exclude(low, high, b, failed, anchor)
    if why:
        comments.append(why)
    if not stepped and current.fraction is not None:
        comments.append(_stepless_note(current.fraction))
    return Knob(
        name="mem_fraction_static",
        value=_fraction_text(low, high, stepped),
        comments=(
            "fraction of the free GPU memory measured before the weights load (P); the KV pool "
            "is A − P·(1 − f), A being what the weights left (docs/sglang-memory.md)",
            *comments,
        ),
        baseline=b,
        baseline_note=current.fraction_from,
    )


def _lowest_pool(arith: Arithmetic, ledger: Ledger, b: float) -> tuple[float, int]:
    """The lowest fraction on `b`'s grid whose pool holds one prefill chunk, and that chunk."""
    chunk = ledger.chunked_prefill_size if (ledger.chunked_prefill_size or 0) > 0 else None
    need = chunk or 1
    floor = arith.fraction_for_tokens(need)
    low = _on_grid(floor, b, up=True)
    while arith.at(low).tokens < need and low < HIGHEST:
        low = round(low + STEP, 4)
    return low, need


def _high_end(arith: Arithmetic, b: float, low: float, anchor: float) -> tuple[float, str]:
    """The top of the fraction range on `anchor`'s grid, and the comment (a template) saying
    why."""
    f0, headroom = arith.fraction, arith.headroom
    if headroom is None:
        high = _on_grid(min(HIGHEST, max(b, f0) + 0.05), anchor, up=False)
        return high, (
            "high {high}: the log shows no free memory after the CUDA graphs, so the reserve "
            "they need is unknown: 0.05 above the log's fraction"
        )
    top = arith.fraction_for_free(0.0)
    high = _on_grid(HIGHEST if top is None else top, anchor, up=False)
    while (arith.at(high).static_free_gib or 0.0) < 0 and high > low:
        high = round(high - STEP, 4)
    held = [f"the request table ({_gib(headroom.request_table)})"]
    held.append(f"the CUDA graphs ({_gib(headroom.graphs)})")
    if headroom.draft:
        held.append(f"the draft ({_gib(headroom.draft)})")
    held.append(f"workspaces ({_gib(max(headroom.other, 0.0))})")
    return high, (
        "high {high}: the highest fraction whose reserve P·(1 − f) still holds "
        + ", ".join(held)
        + ": {high_free} predicted free after startup; the load's transient peak comes on "
        "top, and the search finds how much of it the traffic needs"
    )


def _fraction_baseline_line(arith: Arithmetic, b: float, high: float) -> str:
    """What the baseline fraction holds, next to the top of the range."""
    f0, headroom = arith.fraction, arith.headroom
    at_b = arith.at(b)
    tokens_b = arith.tokens if b == f0 and arith.tokens else at_b.tokens
    free_b = headroom.free if b == f0 and headroom is not None else at_b.static_free_gib
    at_high = "" if math.isclose(b, high) else f"; at {high:g}: {arith.at(high).tokens:,} tokens"
    return (
        f"at the baseline {b:.15g}: {tokens_b:,} tokens"
        + (f", {_gib(free_b)} free after startup" if free_b is not None else "")
        + at_high
    )


def _fill_fraction_comments(
    comments: list[str], arith: Arithmetic, low: float, high: float
) -> list[str]:
    """The comment templates with the range's ends and what they hold filled in."""
    at_low, at_high = arith.at(low), arith.at(high)
    free_high = at_high.static_free_gib
    return [
        c.format(
            low=f"{low:g}",
            high=f"{high:g}",
            low_tokens=at_low.tokens,
            high_free=_gib(free_high) if free_high is not None else "?",
        )
        for c in comments
    ]


def _fraction_from_ledger(
    current: Current, arith: Arithmetic, ledger: Ledger, failed: Failure | None
) -> Knob:
    f0 = arith.fraction
    b = current.fraction if current.fraction is not None else f0
    stepped = grid_anchor(b) is not None
    anchor = grid_anchor(b) or 0.0
    low, need = _lowest_pool(arith, ledger, anchor)
    lowest_pool = low
    comments = [
        "fraction of the free GPU memory measured before the weights load (P); the KV pool "
        "is A − P·(1 − f), A being what the weights left (docs/sglang-memory.md)",
        f"low {{low}}: the lowest fraction whose pool holds one prefill chunk "
        f"({need:,} tokens): {{low_tokens:,}} tokens",
    ]
    high, high_comment = _high_end(arith, b, low, anchor)
    comments.append(high_comment)
    low, high = _bounded(low, high, anchor)
    if high - low > SPAN + 1e-9:
        low = _on_grid(high - SPAN, anchor, up=True)
        comments[1] = (
            f"low {{low}}: {SPAN:g} below the top; the pool holds one prefill chunk ({need:,} "
            f"tokens) from {lowest_pool:g} up, but lower fractions only give up capacity"
        )
    low, high = min(low, b), max(high, b)
    low, high, kept, why = _exclude(low, high, b, failed, anchor)
    if why:
        comments.append(why)
    if not stepped:
        comments.append(_stepless_note(b))
    text = _fill_fraction_comments(comments, arith, low, high)
    note = current.fraction_from
    if b != f0:
        note += f"; the log's start used {f0:.15g}"
    if kept is not None:
        text.append(_fraction_baseline_line(arith, b, high))
    return Knob(
        name="mem_fraction_static",
        value=_fraction_text(low, high, stepped),
        comments=tuple(text),
        baseline=kept,
        baseline_note=note,
    )


def _nice(x: float) -> int:
    return max(round(x / 8.0) * 8, 8) if x >= 16 else max(round(x), 1)


def pool_holds(pool_tokens: int | None, per_request: int | None) -> int | None:
    """The requests the pool holds at once, each at its full length (prompt + answer)."""
    if not pool_tokens or not per_request or per_request <= 0:
        return None
    return max(pool_tokens // per_request, 1)


def _mrr_choices(c: int | None, cap: int) -> list[int]:
    """Choices up to `cap`: around the current value when it is below it (⅔× … 8⁄3×, cut at the
    cap, the cap itself the top), else spread below the cap (¼× … 1×); at least four where there
    is room."""
    if c is not None and c <= cap:
        # a round value next to the current one (2048 beside SGLang's own 2049) is no other
        # choice; above `MAX_SLOTS` (the most clients the workload runs) only the current one
        top = min(cap, max(MAX_SLOTS, c))
        near = {v for m in MRR_FACTORS if abs((v := _nice(c * m)) - c) > NEAR * c}
        values = {v for v in near | {c} if v <= top}
        if max(values) < min(_nice(c * MRR_FACTORS[-1]), top):
            values.add(top)
        for m in reversed(BELOW_FACTORS[:-1]):
            if len(values) >= 4:
                break
            values.add(max(_nice(c * m), 1))
    else:
        values = {max(_nice(cap * m), 1) for m in BELOW_FACTORS} | {cap}
        values = {min(v, cap) for v in values}
    return sorted(values)


def mrr_knob(
    current: Current,
    peak_running: int | None,
    pool_tokens: int | None,
    per_request: int | None = None,
) -> Knob:
    """The request-slot choices: at most what the pool holds at `per_request` tokens a request
    (the sketched prompt + answer) or the most the log ran at once, whichever is more. A
    current value above that stays the baseline (and a choice) when the command sets it; one
    the log shows (SGLang's own, sized from its request table) is left to the sampler."""
    c = current.max_running_requests
    baseline = c
    comments = [
        "request slots: they size the request table and the captured CUDA-graph batches, "
        "not the KV pool"
    ]
    holds = pool_holds(pool_tokens, per_request)
    fill: int | None = None  # the most slots the workload fills: the cap, not a value past it
    if holds is not None:
        cap = fill = max(holds, peak_running or 0)
        choices = _mrr_choices(c, cap)
        comments.append(
            f"the pool ({pool_tokens:,} tokens at the baseline) holds {holds:,} requests of "
            f"{per_request:,} tokens (the workload's prompt + answer below)"
            + (
                f"; the log ran {peak_running} at once"
                if peak_running and peak_running > holds
                else ""
            )
            + f": choices up to {cap:,}"
        )
        if c is not None and c > cap:
            if current.mrr_by_command:
                choices.append(c)
                comments.append(
                    f"the command's {c} stays the baseline: more than the pool holds at that "
                    "length (SGLang queues or retracts the rest)"
                )
            else:
                baseline = None
                comments.append(
                    f"{c} request slots, {current.mrr_from or 'what the log shows'}, are more "
                    "than the pool holds at that length: not searched, the baseline leaves it "
                    "to the sampler"
                )
    elif c is None:
        choices = [32, 64, 128, 256]
        comments.append(
            "the command leaves it to SGLang (it derives it from the pool) and no log shows "
            "the value: common choices, no baseline"
        )
    else:
        choices = sorted({_nice(c * m) for m in MRR_FACTORS if m != 1.0} | {c})
        choices = [v for v in choices if v <= max(MAX_SLOTS, c)]
        comments.append(f"around the current {c}: ⅔×, 1×, 4⁄3×, 2×, 8⁄3×")
    if peak_running is not None:
        filled = (
            "" if c is None or peak_running >= c else "; more slots only matter under more load"
        )
        plural = "s" if peak_running != 1 else ""
        comments.append(
            f"the log's serving lines ran at most {peak_running} request{plural} at once{filled}"
        )
    if pool_tokens and holds is None:
        comments.append(
            f"the pool ({pool_tokens:,} tokens at the baseline) holds the context of every "
            "running request"
        )
    return Knob(
        name="max_running_requests",
        value="{ choices = [" + ", ".join(str(v) for v in choices) + "] }",
        comments=tuple(comments),
        baseline=baseline,
        baseline_note=current.mrr_from,
        top=max(v for v in choices if fill is None or v <= fill),
    )


def _host_failure_options(
    options: set[int | float], size: int | float, host_failed: str | None, comments: list[str]
) -> tuple[set[int | float], int | float | None]:
    """The sizes left after a start the log shows failing for its host cache, and the
    baseline (None when the current size failed)."""
    if host_failed == "shrink":
        comments.append(
            f"the log's start with {size:g} GB ran out of host memory: only smaller sizes, and "
            "the baseline is left to the sampler"
        )
        return {v for v in options if v < size}, None
    if host_failed == "grow":
        comments.append(
            f"the log's start with {size:g} GB had a host pool no larger than the GPU pool: "
            "only larger sizes (or off), and the baseline is left to the sampler"
        )
        return {v for v in options if v == 0 or v > size}, None
    return options, size


def _device_pool_limits(
    options: set[int | float],
    comments: list[str],
    current: Current,
    ledger: Ledger | None,
    high_fraction: float | None,
    arith: Arithmetic | None,
) -> set[int | float]:
    """Leave out the sizes a release refusing a host pool not larger than the GPU pool fails."""
    sem = rules(ledger.semantics if ledger is not None else None)
    if arith is None or not sem.host_smaller_fatal or current.fraction is None:
        return options
    device_gb = arith.at(current.fraction).kv_gb
    small = sorted(v for v in options if 0 < v <= device_gb)
    if small:
        options -= set(small)
        comments.append(
            f"left out {', '.join(f'{v:g}' for v in small)}: SGLang {sem.name} refuses a "
            f"host pool not larger than the GPU pool ({device_gb:.1f} GB at the baseline)"
        )
    if high_fraction is not None:
        top_gb = arith.at(high_fraction).kv_gb
        if any(0 < v <= top_gb for v in options):
            comments.append(
                f"at f = {high_fraction:g} the GPU pool is {top_gb:.1f} GB: a host cache "
                "no larger fails to start there"
            )
    return options


def log_host_budget_gb(ledger: Ledger | None) -> float | None:
    """The host budget per rank the log shows, GB: 0.5.23's auto-sizing line states it; else
    its `HiCache memory headroom: host H GiB, cgroup C GiB` line gives what the budget is
    worked out from (`HostBound`: (min(H, C) − 10 GiB) ÷ the ranks on the host)."""
    if ledger is None:
        return None
    if ledger.host_budget_gb:
        return ledger.host_budget_gb
    host, cgroup = ledger.host_available_gib, ledger.cgroup_headroom_gib
    # a log without rank tags is a single GPU's (a count it cannot tell leaves fewer out)
    ranks = ledger.host_ranks or ledger.ranks or ledger.tp_size or 1
    if host is None:
        return None
    limit = Limit("the log's cgroup headroom", int(cgroup * 2**30)) if cgroup else None
    bound = HostBound(int(host * 2**30), "the log's", limit, ranks, ledger.semantics)
    return bound.per_rank_gb


def _host_budget_limit(
    options: set[int | float], comments: list[str], ledger: Ledger | None
) -> set[int | float]:
    """Leave out the sizes above the host budget per rank the log shows."""
    budget = log_host_budget_gb(ledger)
    if budget:
        over = sorted(v for v in options if v > budget)
        if over:
            options -= set(over)
            comments.append(
                f"left out {', '.join(f'{v:g}' for v in over)}: above the host budget of "
                f"{budget:.0f} GB per rank"
            )
    return options


def hicache_knob(
    current: Current,
    ledger: Ledger | None,
    high_fraction: float | None,
    arith: Arithmetic | None,
    host_failed: str | None = None,
) -> Knob | None:
    """`host_failed`: the log's start failed for its host cache, "shrink" (host RAM) or "grow"
    (0.5.9: not larger than the GPU pool)."""
    h = current.hicache_size
    if not current.hicache_on or not h:
        return None
    size = int(h) if float(h).is_integer() else h
    options: set[int | float] = {0, size, size * 2}
    half = size / 2
    options.add(int(half) if float(half).is_integer() else half)
    comments = [
        "host GB per rank for the hierarchical cache; 0 turns it off",
        f"around the current {size:g}: off, ½×, 1×, 2×",
    ]
    options, baseline = _host_failure_options(options, size, host_failed, comments)
    options = _device_pool_limits(options, comments, current, ledger, high_fraction, arith)
    options = _host_budget_limit(options, comments, ledger)
    if baseline is not None:
        options.add(size)
    ranks = (ledger.ranks or ledger.tp_size) if ledger is not None else None
    if ranks and ranks > 1:
        comments.append(
            f"each of the {ranks} ranks pins its own: {max(options) * ranks:g} GB of host RAM at "
            "the top; drop values the host cannot hold"
        )
    return Knob(
        name="hicache_size",
        value="{ choices = [" + ", ".join(f"{v:g}" for v in sorted(options)) + "] }",
        comments=tuple(comments),
        baseline=baseline,
        baseline_note=current.hicache_from,
    )


def memory_notes(ledger: Ledger, arith: Arithmetic | None) -> tuple[str, ...]:
    """The ledger in a few comment lines."""
    out: list[str] = []
    if ledger.p_gib is not None:
        line = f"P = {_gib(ledger.p_gib)} free per GPU before the weights"
        if ledger.weights_gib is not None:
            line += f", weights {_gib(ledger.weights_gib)}"
        if ledger.avail_after_weights_gib is not None:
            line += f", A = {_gib(ledger.avail_after_weights_gib)} after them"
        out.append(line)
    if ledger.max_total_num_tokens and ledger.kv_gib is not None:
        line = f"KV pool {ledger.max_total_num_tokens:,} tokens in {_gib(ledger.kv_gib)}"
        if ledger.mamba_gib:
            line += f", Mamba state pool {_gib(ledger.mamba_gib)} from the same budget"
        if arith is not None:
            line += f": {arith.cell_bytes:,.0f} bytes per token"
        if ledger.draft_kv_gib:
            line += f" (+ the draft's {_gib(ledger.draft_kv_gib)})"
        out.append(line)
    parts = []
    if ledger.graph_gib is not None:
        parts.append(f"CUDA graphs {_gib(ledger.graph_gib)}")
    if ledger.draft_weights_gib:
        parts.append(f"draft weights {_gib(ledger.draft_weights_gib)}")
    if ledger.draft_graph_gib:
        parts.append(f"draft graphs {_gib(ledger.draft_graph_gib)}")
    free = free_after_capture_gib(ledger)
    if free is not None:
        parts.append(f"free after startup {_gib(free)}")
    if parts:
        out.append(", ".join(parts))
    if arith is not None:
        out.append(
            f"at f = {arith.fraction:.15g} the reserve P·(1 − f) is {_gib(arith.reserve_gib)}; "
            f"each 0.01 of f moves {_gib(arith.free_per_fraction_gib * STEP)} from it into the pool"
        )
    if ledger.semantics:
        out.append(f"memory rules of SGLang {ledger.semantics} ({ledger.semantics_from})")
    return tuple(out)
