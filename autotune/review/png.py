"""Matplotlib renderers: the same plot data as the HTML page, drawn to PNG files.

Uses the non-interactive Agg backend through `matplotlib.figure.Figure` (no pyplot state), so
it runs headless and leaks no figures.
"""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from pathlib import Path

from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from autotune.review import style
from autotune.review.plotdata import (
    CapacityData,
    FeasibilityData,
    HistoryData,
    LoadData,
    ParetoData,
    Point,
    WaterfallData,
)
from autotune.review.style import LINE_COLOR, LOOKS, WINNER_COLOR

SIZE = (8.0, 5.0)
DPI = 110


def _new(points: Sequence[Point] = ()) -> tuple[Figure, Axes]:
    """A figure of one gridded axes, with `points` scattered on it by kind (`_scatter`): every
    trial figure starts with its trials."""
    fig = Figure(figsize=SIZE, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.grid(True, alpha=0.3)
    _scatter(ax, points)
    return fig, ax


def _save(fig: Figure, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp.png")
    fig.savefig(tmp, format="png")
    tmp.replace(path)
    return path


def _scatter(ax: Axes, points: Sequence[Point]) -> None:
    for kind, look in LOOKS.items():
        pts = [p for p in points if p.kind == kind]
        if not pts:
            continue
        open_marker = kind == "running"
        ax.scatter(
            [p.x for p in pts],
            [p.y for p in pts],
            marker=look.mpl_marker,
            s=55,
            label=look.name,
            facecolors="none" if open_marker else look.color,
            edgecolors=look.color,
            zorder=3,
        )


def _numbers(ax: Axes, points: Sequence[Point]) -> None:
    """Trial numbers next to their points; trials within 1 % of the axes share one label."""
    if not points:
        return
    xr = (max(p.x for p in points) - min(p.x for p in points)) or 1.0
    yr = (max(p.y for p in points) - min(p.y for p in points)) or 1.0
    at: dict[tuple[int, int], list[Point]] = {}
    for p in points:
        at.setdefault((round(p.x / xr * 100), round(p.y / yr * 100)), []).append(p)
    for group in at.values():
        label = ",".join(f"#{n}" for n in sorted(p.number for p in group))
        first = group[0]
        ax.annotate(label, (first.x, first.y), textcoords="offset points", xytext=(5, 5),
                    fontsize=7)  # fmt: skip


def _legend(ax: Axes) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=8, loc="best")


def _finish(fig: Figure, ax: Axes, frame: style.Frame, path: Path) -> Path:
    """`frame`'s titles and the legend on `ax`, then `fig` saved to `path`."""
    ax.set_title(frame.title)
    ax.set_xlabel(frame.x)
    ax.set_ylabel(frame.y)
    _legend(ax)
    return _save(fig, path)


def note_png(title: str, note: str, path: Path) -> Path:
    """A figure that would say nothing, drawn as the sentence that says why."""
    fig = Figure(figsize=SIZE, dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    ax.set_axis_off()
    ax.set_title(title)
    ax.text(0.5, 0.5, textwrap.fill(note, 70), ha="center", va="center", fontsize=10,
            transform=ax.transAxes, wrap=True)  # fmt: skip
    return _save(fig, path)


def pareto_png(d: ParetoData, path: Path) -> Path:
    """The capacity × throughput figure as a PNG at `path` (the note's text instead when it has
    one)."""
    if d.note:
        return note_png(style.PARETO.title, d.note, path)
    fig, ax = _new(d.points)
    by = {p.number: p for p in d.points}
    front = [by[n] for n in d.front if n in by]
    if front:
        ax.plot([p.x for p in front], [p.y for p in front], ":", color=LINE_COLOR,
                label="Pareto front (feasible)")  # fmt: skip
    if d.winner is not None and d.winner in by:
        w = by[d.winner]
        label = d.winner_label
        ax.scatter([w.x], [w.y], marker="*", s=380, color=WINNER_COLOR, edgecolors="black",
                   zorder=4, label=label)  # fmt: skip
    _numbers(ax, d.points)
    ax.xaxis.set_major_formatter(_thousands)
    return _finish(fig, ax, style.PARETO, path)


def feasibility_png(d: FeasibilityData, path: Path) -> Path:
    """The outcome map as a PNG at `path` (the note's text instead when it has one)."""
    if d.note:
        return note_png(style.FEASIBILITY.title, d.note, path)
    fig, ax = _new(d.points)
    _numbers(ax, d.points)
    return _finish(fig, ax, style.FEASIBILITY, path)


def capacity_png(d: CapacityData, path: Path) -> Path:
    """The capacity figure as a PNG at `path` (the note's text instead when it has one)."""
    if d.note:
        return note_png(style.CAPACITY.title, d.note, path)
    fig, ax = _new(d.points)
    if d.line_x:
        ax.plot(d.line_x, d.line_y, "-", color=LINE_COLOR, lw=1, label=d.line_source)
    if d.oom_edge is not None:
        ax.axvline(d.oom_edge, color=LOOKS["oom"].color, ls="--", lw=1,
                   label=f"first OOM at {d.oom_edge:g}")  # fmt: skip
    if d.stable_edge is not None:
        ax.axvline(d.stable_edge, color=LOOKS["feasible"].color, ls=":", lw=1,
                   label=f"highest feasible {d.stable_edge:g}")  # fmt: skip
    ax.yaxis.set_major_formatter(_thousands)
    return _finish(fig, ax, style.CAPACITY, path)


def waterfall_png(d: WaterfallData, path: Path) -> Path:
    """The whole GPU on the left; on the right the reserve P·(1−f), zoomed, where the small
    allocations and the stress peak decide whether the server survives."""
    fig = Figure(figsize=(11.0, 5.0), dpi=DPI, layout="constrained")
    FigureCanvasAgg(fig)
    whole, zoom = fig.subplots(1, 2, width_ratios=(1, 1.4))
    for ax in (whole, zoom):
        ax.grid(True, axis="y", alpha=0.3)
        _waterfall_bars(ax, d)
    top = max(
        [v for v in (d.reserve_gib, d.min_headroom_gib) if v is not None]
        + [s.value for s in d.steps if s.measure == "total"]
        + [0.5]
    )
    zoom.set_ylim(0, top * 1.15)
    if d.reserve_gib is not None:
        zoom.axhline(d.reserve_gib, color="#555", ls="--", lw=1,
                     label=f"reserve P·(1−f) = {d.reserve_gib:.2f} GiB")  # fmt: skip
    if d.min_headroom_gib is not None:
        need = f"required free at the worst moment {d.min_headroom_gib:.2f} GiB"
        zoom.axhline(d.min_headroom_gib, color=LOOKS["oom"].color, ls="--", lw=1, label=need)
    whole.set_ylabel("GiB per GPU")
    whole.set_title("the whole GPU", fontsize=9)
    zoom.set_title("the reserve P·(1−f), zoomed", fontsize=9)
    fig.suptitle(f"Memory per GPU, {d.title}")
    _legend(zoom)
    return _save(fig, path)


def _waterfall_bars(ax: Axes, d: WaterfallData) -> None:
    level = 0.0
    labels = []
    for i, s in enumerate(d.steps):
        if s.measure == "relative":
            bottom, height = level + min(s.value, 0.0), abs(s.value)
            level += s.value
            color = "#d98c8c" if s.label == "stress peak" else "#8fa9c9"
            text = f"{s.value:+.2f}"
        else:
            bottom, height = 0.0, s.value
            level = s.value
            color = "#2a9d3f" if s.measure == "total" else "#5b7fa8"
            text = f"{s.value:.2f}"
        ax.bar(i, height, bottom=bottom, color=color, edgecolor="#444", width=0.7, zorder=3)
        ax.annotate(text, (i, bottom + height), textcoords="offset points", xytext=(0, 3),
                    ha="center", fontsize=7, annotation_clip=True)  # fmt: skip
        labels.append(s.label)
    ax.set_xticks(range(len(labels)), labels, rotation=35, ha="right", fontsize=8)


def load_png(d: LoadData, path: Path) -> Path:
    """The load figure as a PNG at `path`, latency on a second axis (the note's text instead when it
    has one)."""
    if d.note:
        return note_png(style.LOAD.title, d.note, path)
    fig, ax = _new()
    pts = d.points
    served = [p for p in pts if p.throughput is not None and not d.flat]
    ax.scatter(
        [p.requests for p in served],
        [float(p.throughput or 0.0) for p in served],
        color=LOOKS["feasible"].color,
        label="throughput (tok/s)",
        zorder=3,
    )
    ax.set_xlabel(style.LOAD.x)
    ax.set_ylabel(style.LOAD.y)
    ax2 = ax.twinx()
    for attr, name, color in (("p99_ttft_ms", "p99 TTFT (ms)", "#9467bd"),
                              ("p99_itl_ms", "p99 ITL (ms)", "#8c564b")):  # fmt: skip
        xs = [p.requests for p in pts if getattr(p, attr) is not None]
        ys = [getattr(p, attr) for p in pts if getattr(p, attr) is not None]
        ax2.scatter(xs, ys, marker="^", color=color, label=name, zorder=3)
    ax2.set_ylabel("latency (ms)")
    flat = textwrap.fill(f"{d.flat}; only latency is drawn", 90) if d.flat else ""
    ax.set_title(style.LOAD.title + (f"\n{flat}" if flat else ""), fontsize=10 if not flat else 8)
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    if h1 or h2:
        ax.legend(h1 + h2, l1 + l2, fontsize=8, loc="best")
    return _save(fig, path)


def history_png(d: HistoryData, path: Path) -> Path:
    """The search history as a PNG at `path`."""
    fig, ax = _new(d.points)
    if d.best_x:
        ax.step(d.best_x, d.best_y, where="post", color=LINE_COLOR, label="best feasible so far")
    ax.yaxis.set_major_formatter(_thousands)
    return _finish(fig, ax, style.HISTORY, path)


def _thousands_fmt(x: float, pos: int | None = None) -> str:
    return f"{x:,.0f}"


_thousands = FuncFormatter(_thousands_fmt)
