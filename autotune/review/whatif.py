"""What other settings would give, read from one log: the pool SGLang would size and the memory
left after startup at other `mem_fraction_static` values, the lowest fraction that can hold a
pool, what `max_running_requests` and the CUDA-graph batch limit cost, in plain words.

The arithmetic is the same one the search and `explain` use (`autotune.memory.arithmetic`), with
the release's rules the log shows (0.5.9's order, or 0.5.18+'s draft weights before the sizing
and the draft folded into the cell). Pure: a ledger in, rows and sentences out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from autotune.config.space import FIXED_FRACTION_STEP
from autotune.logparse.ledger import Ledger
from autotune.memory.arithmetic import Arithmetic, arithmetic
from autotune.memory.ceiling import Ceiling, ceiling
from autotune.memory.cell import implied_fraction
from autotune.memory.pool import lowest_fraction

SPAN = 4
"""Fractions shown each side of the log's own, one step apart (more with --fraction)."""


@dataclass(frozen=True)
class Row:
    """One fraction's figures by SGLang's arithmetic: pool tokens and GiB, the reserve `P·(1 − f)`,
    the free memory after startup and at the log's peak."""

    fraction: float
    tokens: int
    kv_gib: float
    reserve_gib: float
    free_after_startup_gib: float | None
    free_at_peak_gib: float | None
    measured: bool
    """This row is the log's own launch (its figures as printed, not predicted)."""


@dataclass(frozen=True)
class WhatIf:
    """What other fractions would give for one log's launch, with the lowest fraction that holds a
    pool, the highest whose reserve covers the peak, and the costs of the request table and the
    graphs."""

    fraction: float
    semantics: str
    rows: tuple[Row, ...]
    lowest_fraction: float
    """Below this SGLang finds no room for a pool ("Not enough memory")."""
    highest_covering_peak: float | None
    """The highest fraction whose reserve still covers the log's transient peak, if it shows one."""
    request_table_gib: float | None
    graphs_gib: float | None
    words: tuple[str, ...]
    ceiling_tokens: int | None = None
    """The pool the box would hold if the reserve held only what this launch shows it needs,
    its stress peak included (`memory.ceiling.ceiling`, no margin); None when not known."""
    ceiling_missing: tuple[str, ...] = ()
    """What the ceiling needs that this log does not show (`the stress peak`)."""

    def to_dict(self) -> dict[str, object]:
        """The table as JSON values, the `what_if` field of `autotune ledger --json`."""
        d = asdict(self)
        d["rows"] = [asdict(r) for r in self.rows]
        d["words"] = list(self.words)
        d["ceiling_missing"] = list(self.ceiling_missing)
        return d


def what_if(
    ledger: Ledger,
    *,
    fraction: float | None = None,
    extra: Sequence[float] = (),
    stress_peak_gib: float | None = None,
) -> WhatIf | None:
    """Other settings for the launch `ledger` describes; None when the log lacks P, A or the
    pool (a fragment, a start that died before the KV pool)."""
    f = fraction if fraction is not None else ledger.mem_fraction_static
    if f is None:
        f = implied_fraction(ledger)
    if f is None:
        return None
    a = arithmetic(ledger, f, stress_peak_gib=stress_peak_gib)
    if a is None:
        return None
    grid = {round(f + k * FIXED_FRACTION_STEP, 4) for k in range(-SPAN, SPAN + 1)}
    grid |= {round(x, 4) for x in extra}
    lowest = _lowest(a)
    rows = tuple(_row(a, x) for x in sorted(grid) if 0.0 < x < 1.0 and x > lowest)
    highest = (
        a.highest_fraction(0.0, FIXED_FRACTION_STEP) if a.stress_peak_gib is not None else None
    )
    h = a.headroom
    table = h.request_table if h is not None else None
    graphs = h.graphs if h is not None else None
    top = ceiling(a, 0.0)
    missing = _ceiling_missing(a)
    return WhatIf(
        fraction=f,
        semantics=a.semantics,
        rows=rows,
        lowest_fraction=lowest,
        highest_covering_peak=highest,
        request_table_gib=table,
        graphs_gib=graphs,
        words=(
            *_words(a, lowest, highest, table, graphs, bool(ledger.mamba_gib)),
            _ceiling_words(a, top, missing),
        ),
        ceiling_tokens=top.tokens if top is not None else None,
        ceiling_missing=missing,
    )


def as_text(w: WhatIf) -> str:
    """The table and its sentences as `autotune ledger` prints them below the ledger."""
    lines = [
        f"What other mem_fraction_static values would give (SGLang {w.semantics} rules, from "
        f"this log's launch at {w.fraction:g}):",
        f"  {'fraction':>8}  {'KV tokens':>10}  {'KV GiB':>7}  {'reserve':>8}  "
        f"{'free after startup':>18}  {'free at the peak':>16}",
    ]
    # a launch at 0.831 steps from there: its rows need the third decimal
    places = 3 if any(abs(round(r.fraction, 2) - r.fraction) > 1e-9 for r in w.rows) else 2
    for r in w.rows:
        free = (
            f"{r.free_after_startup_gib:.2f} GiB" if r.free_after_startup_gib is not None else "-"
        )
        peak = f"{r.free_at_peak_gib:.2f} GiB" if r.free_at_peak_gib is not None else "-"
        mark = "  (this log)" if r.measured else ""
        lines.append(
            f"  {r.fraction:>8.{places}f}  {r.tokens:>10,}  {r.kv_gib:>7.2f}  "
            f"{r.reserve_gib:>4.2f} GiB  {free:>18}  {peak:>16}{mark}"
        )
    lines += [f"  {s}" for s in w.words]
    return "\n".join(lines) + "\n"


def _row(a: Arithmetic, fraction: float) -> Row:
    at = a.at(fraction)
    if math.isclose(fraction, a.fraction, abs_tol=1e-9) and a.tokens is not None:
        return Row(  # the log's own launch: its figures as printed
            fraction=fraction,
            tokens=a.tokens,
            kv_gib=round(a.kv_logged_gib if a.kv_logged_gib is not None else at.kv_gib, 4),
            reserve_gib=round(at.reserve_gib, 4),
            free_after_startup_gib=_r(a.headroom.free if a.headroom is not None else None),
            free_at_peak_gib=_r(a.free_at_peak_gib),
            measured=True,
        )
    return Row(
        fraction=fraction,
        tokens=at.tokens,
        kv_gib=round(at.kv_gib, 4),
        reserve_gib=round(at.reserve_gib, 4),
        free_after_startup_gib=_r(at.static_free_gib),
        free_at_peak_gib=_r(at.free_at_peak_gib),
        measured=False,
    )


def _lowest(a: Arithmetic) -> float:
    """The pool is A − P·(1 − f): it has room only above f = 1 − A/P."""
    return max(0.0, lowest_fraction(a.p_gib, a.avail_after_weights_gib)) if a.p_gib > 0 else 0.0


def _words(
    a: Arithmetic,
    lowest: float,
    highest: float | None,
    table: float | None,
    graphs: float | None,
    state: bool = False,
) -> tuple[str, ...]:
    pool = "The KV pool is" if not state else "The KV pool and the Mamba state pool share"
    out = [
        f"{pool} what is free after the weights less the reserve: "
        f"{a.avail_after_weights_gib:.2f} − {a.p_gib:.2f} × (1 − f) GiB, at "
        f"{a.cell_bytes:,.0f} bytes per token; each {FIXED_FRACTION_STEP:g} of f is "
        f"{a.budget_per_step_gib(FIXED_FRACTION_STEP):.2f} GiB, about "
        f"{a.tokens_per_step(FIXED_FRACTION_STEP):,} tokens.",
        f"Below f = {lowest:.3f} there is no room for a pool: SGLang stops at startup with "
        "'Not enough memory' (raise the fraction).",
        *_cap_words(a),
        "max_running_requests does not size the pool: it sizes the request table"
        + (f" ({table:.2f} GiB here, growing with it)" if table is not None else "")
        + " and the CUDA graphs"
        + (f" ({graphs:.2f} GiB here, growing with the graph batch limit)" if graphs else "")
        + ", both paid from the reserve.",
    ]
    if highest is not None and a.stress_peak_gib is not None:
        out.append(
            f"The log's transient peak ({a.stress_peak_gib:.2f} GiB above the static allocations) "
            f"fits the reserve up to f = {highest:.2f}; above it a big prefill batch runs out of "
            "memory."
        )
    else:
        out.append(
            "The log shows no transient peak under load, so where a large prefill batch would "
            "run out of memory is not known from it: run a study with a stress phase."
        )
    return tuple(out)


def _cap_words(a: Arithmetic) -> tuple[str, ...]:
    """The `--max-total-tokens` cap the log's launch ran with, where it holds the pool: from
    the fraction whose budget reaches it, a higher fraction grows only the reserve."""
    if a.tokens_cap is None:
        return ()
    reach = a.fraction_for_tokens(a.tokens_cap)
    return (
        f"--max-total-tokens {a.tokens_cap:,} caps the pool: from f = {reach:.3f}, where the "
        "budget reaches it, a higher fraction adds no tokens and only grows the reserve.",
    )


def _ceiling_missing(a: Arithmetic) -> tuple[str, ...]:
    """What the ceiling needs that the log does not show."""
    out = []
    if a.headroom is None:
        out.append("the free memory after startup")
    if a.stress_peak_gib is None:
        out.append("the stress peak")
    return tuple(out)


def _ceiling_words(a: Arithmetic, top: Ceiling | None, missing: Sequence[str]) -> str:
    """The ceiling in one sentence, or which of its figures the log does not show."""
    if top is None:
        said = " and ".join(missing) or "the bytes per token"
        return (
            "The ceiling (the pool this box would hold if the reserve held only what it needs) "
            f"is not known from this log: {said} {'was' if len(missing) <= 1 else 'were'} not "
            "measured; `autotune run` with a stress phase measures it, and every review surface "
            "prints the winner's share of it."
        )
    share = top.share(a.tokens) if a.tokens is not None else None
    part = f" (this log's pool is {share:.0%} of it)" if share is not None else ""
    return (
        f"The ceiling, the pool this box would hold if the reserve held only what this launch "
        f"shows it needs (its stress peak included, no margin): {top.tokens:,} tokens{part}."
    )


def _r(v: float | None) -> float | None:
    return round(v, 4) if v is not None else None
