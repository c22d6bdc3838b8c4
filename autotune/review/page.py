"""The report on disk: `report.html` (self-contained) and one PNG per figure, and the terminal
summary. Files are written atomically, so a report regenerated while a study runs is never
seen half written.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autotune.record.view import TrialView
from autotune.review import figures as fig
from autotune.review import html as h
from autotune.review import plotdata as pd
from autotune.review import png
from autotune.review.ceiling import line as ceiling_line
from autotune.review.headline import headline
from autotune.review.source import Review
from autotune.review.style import CAPACITY, LOAD, PARETO
from autotune.review.winner import DEFAULT_TOLERANCE

MAX_LEDGER_PNGS = 200


@dataclass(frozen=True)
class Figures:
    """Every figure's plot data for one review."""

    pareto: pd.ParetoData
    feasibility: pd.FeasibilityData
    capacity: pd.CapacityData
    waterfalls: tuple[pd.WaterfallData, ...]
    """The winner's first, then every other trial with a ledger."""
    load: pd.LoadData
    history: pd.HistoryData
    rows: tuple[pd.Row, ...]


def figures(review: Review) -> Figures:
    """All plot data of a review (pure)."""
    w = review.winner
    exported = w.trial if w is not None else None
    tolerance = w.tolerance if w is not None else DEFAULT_TOLERANCE
    trials = review.trials
    first = [t for t in trials if t.number == exported]
    rest = [t for t in trials if t.number != exported and t.ledger.p_gib is not None]
    return Figures(
        pareto=pd.pareto(
            trials,
            winner=exported,
            chosen=w.chosen.number if w is not None else None,
            confirmed=review.confirmed,
            predicted=w is not None and w.predicted,
            tolerance=tolerance,
        ),
        feasibility=pd.feasibility(trials),
        capacity=pd.capacity(trials),
        waterfalls=tuple(
            pd.waterfall(t, cell_bytes=review.cell_bytes, min_headroom_gib=review.min_headroom_gib)
            for t in [*first, *rest]
        ),
        load=pd.load(trials, tolerance=tolerance),
        history=pd.history(trials),
        rows=pd.table(trials),
    )


@dataclass(frozen=True)
class Written:
    """What `write_report` wrote: the HTML page and the PNGs, for the summary to list."""

    html: Path
    pngs: tuple[Path, ...]


def write_report(
    review: Review,
    out_dir: Path,
    *,
    explanation: str,
    generated_at: str,
    warnings: Sequence[str] = (),
) -> Written:
    """report.html in `out_dir`, PNGs in `out_dir/report/`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    figs = figures(review)
    pngs = write_pngs(figs, out_dir / "report")
    page = render_page(
        review, figs, out_dir, explanation=explanation, generated_at=generated_at,
        warnings=warnings,
    )  # fmt: skip
    path = out_dir / "report.html"
    tmp = path.with_suffix(".html.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(path)
    return Written(path, tuple(pngs))


def write_pngs(figs: Figures, folder: Path) -> list[Path]:
    """One PNG per figure in `folder`, and the ledger waterfalls (the winner's named
    `ledger-winner.png`) up to `MAX_LEDGER_PNGS`; the paths written."""
    out = [
        png.pareto_png(figs.pareto, folder / "pareto.png"),
        png.feasibility_png(figs.feasibility, folder / "feasibility.png"),
        png.capacity_png(figs.capacity, folder / "capacity.png"),
        png.load_png(figs.load, folder / "load.png"),
        png.history_png(figs.history, folder / "history.png"),
    ]
    for i, w in enumerate(figs.waterfalls[:MAX_LEDGER_PNGS]):
        name = "ledger-winner.png" if i == 0 and figs.pareto.winner == w.number else None
        out.append(png.waterfall_png(w, folder / (name or f"ledger-trial-{w.number:04d}.png")))
    return out


_CSS = """
body{font-family:system-ui,sans-serif;margin:1.5em;color:#222;max-width:1300px}
h1{font-size:1.5em}h2{font-size:1.2em;margin-top:1.6em}
.box{border:1px solid #ccc;border-radius:6px;padding:.8em 1em;background:#fafafa}
.unconfirmed{color:#b35c00;font-weight:bold}.confirmed{color:#2a7d2f;font-weight:bold}
.failed{color:#b00;font-weight:bold}
pre{background:#f4f4f4;padding:.8em;overflow-x:auto;font-size:.85em}
table{border-collapse:collapse;font-size:.82em}td,th{border:1px solid #ddd;padding:3px 6px}
th{background:#eee}tr.k-oom td{background:#fde8e8}tr.k-infeasible td{background:#fff4e0}
tr.k-failed td{background:#eee}tr.winner td{font-weight:bold}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:10px}.fig{min-height:420px}
.nofig{min-height:0;align-self:start;border:1px dashed #bbb;border-radius:6px;padding:1em;
color:#444}
.nofig h3{font-size:1em;margin:0 0 .4em 0}
.headline{font-size:1.15em;font-weight:bold;padding:.6em 1em;border-left:6px solid #f2b705;
background:#fffbea}
td:last-child,td:nth-child(13){max-width:420px;overflow-wrap:anywhere}
"""


def render_page(
    review: Review,
    figs: Figures,
    out_dir: Path,
    *,
    explanation: str,
    generated_at: str,
    warnings: Sequence[str] = (),
) -> str:
    """The whole HTML page (pure, apart from reading plotly.js from the installed package)."""
    e = h.e
    oom = sum(1 for t in review.trials if t.kind == "oom")
    feas = sum(1 for t in review.trials if t.feasible)
    done = sum(1 for t in review.trials if t.kind not in ("running", "skipped"))
    skipped = _skipped(review)
    head = (
        f"<h1>autotune study {e(review.name)}</h1>"
        f'<p class="headline">{e(headline(review))}</p>'
        f'<p class="ceiling">{e(ceiling_line(review))}</p>'
        f"<p>storage {e(review.storage)} · generated {e(generated_at)} · {done} trials finished"
        f" ({feas} feasible, {oom} out of memory), {review.running} running, "
        f"{review.queued} queued{skipped}</p>"
    )
    if review.search_end is not None:
        head += f"<p>{e(review.search_end.line())}</p>"
    if review.running:
        head += "<p><b>The study is still running</b>; regenerate the report for newer trials.</p>"
    hrefs = {t.number: _href(t, out_dir) for t in review.trials if t.log_path}
    parts = [head, _winner_box(review)]
    if warnings:
        items = "".join(f"<li>{e(w)}</li>" for w in warnings)
        parts.append(f'<div class="box failed"><p>Flag check:</p><ul>{items}</ul></div>')
    parts.append("<h2>Why: the memory arithmetic</h2>")
    parts.append(f"<pre>{e(explanation)}</pre>" if explanation else "<p>no feasible trial</p>")
    parts.append('<h2>Figures</h2><div class="grid">')
    parts.append(_figure(h.fig_pareto, figs.pareto, "pareto", PARETO.title))
    parts.append(_figure(h.fig_capacity, figs.capacity, "capacity", CAPACITY.title))
    parts.append(_figure(h.fig_feasibility, figs.feasibility, "feasibility", "Feasibility map"))
    parts.append(h.figure_div(h.fig_history(figs.history), "history"))
    parts.append("</div>")
    if figs.waterfalls:
        parts.append(h.figure_div(h.fig_waterfalls(figs.waterfalls), "ledger"))
    parts.append(_figure(h.fig_load, figs.load, "load", LOAD.title))
    parts.append("<h2>Trials</h2>")
    parts.append(h.table_html(figs.rows, {k: v for k, v in hrefs.items() if v}, _winner_no(review)))
    body = "\n".join(parts)
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>autotune: {e(review.name)}</title><style>{_CSS}</style>"
        f"<script>{h.plotly_js()}</script></head>\n<body>\n{review.scrub(body)}\n</body></html>\n"
    )


def _figure(draw: Callable[[Any], Any], data: Any, div_id: str, title: str) -> str:
    """The figure, or the sentence that says why it would say nothing."""
    note = getattr(data, "note", "")
    if note:
        return f'<div id="{div_id}" class="fig nofig"><h3>{h.e(title)}</h3><p>{h.e(note)}</p></div>'
    return h.figure_div(draw(data), div_id)


def _skipped(review: Review) -> str:
    n = sum(1 for t in review.trials if t.kind == "skipped")
    return f", {n} never launched" if n else ""


def _winner_no(review: Review) -> int | None:
    return review.winner.trial if review.winner is not None else None


def _winner_box(review: Review) -> str:
    e = h.e
    w = review.winner
    if w is None:
        return '<div class="box">No feasible trial yet: nothing to export.</div>'
    c = review.confirmed
    cls = "confirmed" if c else ("failed" if c is False else "unconfirmed")
    params = " ".join(f"{k}={v}" for k, v in w.params.items())
    figures_ = [
        f"{fig.tokens(w.capacity_tokens)} tokens" if w.capacity_tokens is not None else None,
        f"{w.throughput_tok_s:,.1f} tok/s" if w.throughput_tok_s is not None else None,
        f"{fig.gib(w.free_at_peak_gib)} GiB {fig.FREE_AT_WORST}"
        if w.free_at_peak_gib is not None
        else None,
    ]
    shown = ", ".join(f for f in figures_ if f)
    notes = "".join(f"<li>{e(n)}</li>" for n in w.notes)
    return (
        '<div class="box"><h2 style="margin-top:0">Export</h2>'
        f"<p><b>{e(params)}</b>: {e(shown)}{' (predicted)' if w.predicted else ''}</p>"
        f'<p class="{cls}">{e(review.confirmed_label())}</p>'
        f"<p>{e(w.describe())}; margin {e(w.margin.describe())}.</p>"
        + (f"<ul>{notes}</ul>" if notes else "")
        + f"<pre>autotune export --study {e(review.name)} --format shell</pre></div>"
    )


def _href(t: TrialView, out_dir: Path) -> str:
    assert t.log_path is not None
    try:
        rel = os.path.relpath(t.log_path, out_dir)
    except ValueError:
        rel = t.log_path
    return urllib.parse.quote(Path(rel).as_posix())


def summary(review: Review, written: Written | None = None) -> str:
    """The terminal summary (pure)."""
    trials = review.trials
    oom = sum(1 for t in trials if t.kind == "oom")
    feas = sum(1 for t in trials if t.feasible)
    done = sum(1 for t in trials if t.kind not in ("running", "skipped"))
    lines = [
        headline(review),
        ceiling_line(review),
        f"study {review.name} ({review.storage}): {done} trials finished, {feas} feasible, "
        f"{oom} out of memory, {review.running} running, {review.queued} queued"
        f"{_skipped(review)}",
        *([review.search_end.line()] if review.search_end is not None else []),
    ]
    w = review.winner
    if w is None:
        lines.append("no feasible trial yet: nothing to export")
    else:
        params = " ".join(f"{k}={v}" for k, v in w.params.items())
        cap = f"{fig.tokens(w.capacity_tokens)} tokens"
        tp = f"{w.throughput_tok_s:,.1f} tok/s" if w.throughput_tok_s is not None else "? tok/s"
        head = f"{fig.gib(w.free_at_peak_gib, '?')} GiB"
        lines.append(f"export: {params} → {cap}, {tp}, {head} {fig.FREE_AT_WORST}")
        lines.append(f"  {w.describe()}")
        lines.extend(f"  note: {n}" for n in w.notes)
        lines.append(f"  {review.confirmed_label()}")
    if written is not None:
        where = f" and {len(written.pngs)} PNGs in {written.pngs[0].parent}" if written.pngs else ""
        lines.append(f"wrote {written.html}{where}")
    return "\n".join(lines) + "\n"


Clock = Callable[[], str]
