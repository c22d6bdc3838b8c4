"""Plotly renderers and the self-contained HTML page.

The page embeds plotly.js once (so it works offline) and every figure as a `<div>` plus its
JSON. Anything that came from a log or a trial record is escaped: text in HTML with
`html.escape`, text inside figures (hovers, titles) too, because plotly renders a subset of HTML
in them; plotly's JSON itself is made safe for a `<script>` element by escaping `<`, `>` and `&`.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio
import plotly.offline

from autotune.review import style
from autotune.review.plotdata import (
    CapacityData,
    FeasibilityData,
    HistoryData,
    LoadData,
    ParetoData,
    Point,
    Row,
    WaterfallData,
)
from autotune.review.style import LINE_COLOR, LOOKS, WINNER_COLOR

_LAYOUT: dict[str, Any] = {
    "template": "plotly_white",
    "height": 420,
    "margin": {"l": 70, "r": 20, "t": 50, "b": 60},
    "legend": {"orientation": "h", "y": -0.2},
}


def _framed(frame: style.Frame) -> dict[str, Any]:
    """The layout of a one-axis figure: its frame's titles on the page's common layout."""
    return {"title": frame.title, "xaxis_title": frame.x, "yaxis_title": frame.y, **_LAYOUT}


def e(text: object) -> str:
    """Escape for HTML, and so for plotly's hover and title text."""
    return html.escape(str(text), quote=True)


def _scatter_by_kind(points: Sequence[Point], fmt: str, **kw: Any) -> list[go.Scatter]:
    traces = []
    for kind, look in LOOKS.items():
        pts = [p for p in points if p.kind == kind]
        if not pts:
            continue
        traces.append(
            go.Scatter(
                x=[p.x for p in pts],
                y=[p.y for p in pts],
                mode="markers",
                name=look.name,
                marker={"color": look.color, "symbol": look.plotly_symbol, "size": 11},
                text=[e(p.label) for p in pts],
                hovertemplate=fmt + "<extra>%{text}</extra>",
                **kw,
            )
        )
    return traces


def _line(x: Sequence[float], y: Sequence[float], name: str, line: dict[str, Any]) -> go.Scatter:
    """A line to read the points by (a front, a fit, a running best): no hover of its own."""
    return go.Scatter(x=list(x), y=list(y), mode="lines", name=name, line=line, hoverinfo="skip")


def fig_pareto(d: ParetoData) -> go.Figure:
    """The capacity × throughput scatter, with the feasible Pareto front and the exported point
    starred."""
    fig = go.Figure(_scatter_by_kind(d.points, "capacity %{x:,.0f} tok<br>%{y:,.1f} tok/s"))
    by = {p.number: p for p in d.points}
    front = [by[n] for n in d.front if n in by]
    if front:
        front_line = {"color": LINE_COLOR, "dash": "dot"}
        fig.add_trace(
            _line([p.x for p in front], [p.y for p in front], "Pareto front (feasible)", front_line)
        )
    if d.winner is not None and d.winner in by:
        w = by[d.winner]
        label = d.winner_label
        fig.add_trace(
            go.Scatter(
                x=[w.x],
                y=[w.y],
                mode="markers",
                name=label,
                marker={
                    "symbol": "star",
                    "size": 22,
                    "color": WINNER_COLOR,
                    "line": {"color": "black", "width": 1},
                },
                hovertemplate=f"{e(label)} {e(w.label)}<extra></extra>",
            )
        )
    fig.update_layout(**_framed(style.PARETO))
    return fig


def fig_feasibility(d: FeasibilityData) -> go.Figure:
    """The map of outcomes over `mem_fraction_static` × `max_running_requests`."""
    fig = go.Figure(_scatter_by_kind(d.points, "f=%{x}<br>max_running_requests=%{y}"))
    fig.update_layout(**_framed(style.FEASIBILITY))
    return fig


def fig_capacity(d: CapacityData) -> go.Figure:
    """The KV pool's tokens against `mem_fraction_static`, the model's (or a fitted) line through
    them and the first OOM and highest feasible fractions marked."""
    fig = go.Figure(_scatter_by_kind(d.points, "f=%{x}<br>%{y:,.0f} tokens"))
    if d.line_x:
        fig.add_trace(_line(d.line_x, d.line_y, e(d.line_source), {"color": LINE_COLOR}))
    if d.oom_edge is not None:
        fig.add_vline(
            x=d.oom_edge,
            line={"color": LOOKS["oom"].color, "dash": "dash"},
            annotation_text=f"first OOM at {d.oom_edge:g}",
        )
    if d.stable_edge is not None:
        fig.add_vline(
            x=d.stable_edge,
            line={"color": LOOKS["feasible"].color, "dash": "dot"},
            annotation_text=f"highest feasible {d.stable_edge:g}",
            annotation_position="bottom right",
        )
    fig.update_layout(**_framed(style.CAPACITY))
    return fig


def _waterfall_trace(d: WaterfallData, visible: bool) -> go.Waterfall:
    return go.Waterfall(
        x=[e(s.label) for s in d.steps],
        y=[s.value for s in d.steps],
        measure=[s.measure for s in d.steps],
        name=e(d.title),
        visible=visible,
        text=[f"{s.value:+.2f}" if s.measure == "relative" else f"{s.value:.2f}" for s in d.steps],
        textposition="outside",
        decreasing={"marker": {"color": "#8fa9c9"}},
        increasing={"marker": {"color": "#8fa9c9"}},
        totals={"marker": {"color": "#2a9d3f"}},
        connector={"line": {"color": "#999"}},
        hovertemplate="%{x}: %{y:.2f} GiB<extra></extra>",
    )


def fig_waterfalls(items: Sequence[WaterfallData], first: int = 0) -> go.Figure:
    """One waterfall per trial; a menu picks which one shows (the winner first)."""
    fig = go.Figure([_waterfall_trace(d, i == first) for i, d in enumerate(items)])
    buttons = []
    for i, d in enumerate(items):
        shapes = _waterfall_shapes(d)
        buttons.append(
            {
                "label": e(d.title),
                "method": "update",
                "args": [
                    {"visible": [j == i for j in range(len(items))]},
                    {"title": f"Memory per GPU, {e(d.title)}", "shapes": shapes},
                ],
            }
        )
    shown = items[first] if items else None
    fig.update_layout(
        title=f"Memory per GPU, {e(shown.title)}" if shown else "Memory per GPU",
        yaxis_title="GiB per GPU",
        shapes=_waterfall_shapes(shown) if shown else [],
        updatemenus=[*_zoom_menu(items), *_trial_menu(buttons)],
        yaxis_range=[0, _zoom_top(items)],
        showlegend=False,
        **{k: v for k, v in _LAYOUT.items() if k not in ("legend", "margin", "height")},
        height=480,
        margin={"l": 70, "r": 20, "t": 100, "b": 90},
    )
    return fig


def _zoom_top(items: Sequence[WaterfallData]) -> float:
    """A y range that shows the reserve P·(1−f) of every trial: where the decisions are."""
    tops = [d.reserve_gib for d in items if d.reserve_gib is not None]
    tops += [s.value for d in items for s in d.steps if s.measure == "total"]
    return 1.15 * max(tops, default=10.0)


def _zoom_menu(items: Sequence[WaterfallData]) -> list[dict[str, Any]]:
    buttons = [
        {"label": "the reserve P·(1−f)", "method": "relayout",
         "args": [{"yaxis.range": [0, _zoom_top(items)]}]},
        {"label": "the whole GPU", "method": "relayout", "args": [{"yaxis.autorange": True}]},
    ]  # fmt: skip
    return [{"type": "buttons", "direction": "right", "buttons": buttons, "x": 0.0,
             "xanchor": "left", "y": 1.02, "yanchor": "bottom"}]  # fmt: skip


def _trial_menu(buttons: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if len(buttons) < 2:
        return []
    return [{"buttons": buttons, "x": 1.0, "xanchor": "right", "y": 1.02, "yanchor": "bottom"}]


def _waterfall_shapes(d: WaterfallData) -> list[dict[str, Any]]:
    shapes = []
    lines = (
        (d.reserve_gib, "#555", "reserve P·(1−f)"),
        (d.min_headroom_gib, LOOKS["oom"].color, "required free at the worst moment"),
    )
    for y, color, text in lines:
        if y is not None:
            shapes.append(
                {
                    "type": "line",
                    "xref": "paper",
                    "x0": 0,
                    "x1": 1,
                    "y0": y,
                    "y1": y,
                    "line": {"color": color, "dash": "dash", "width": 1},
                    "label": {
                        "text": f"{text} {y:.2f} GiB",
                        "textposition": "end",
                        "font": {"size": 10, "color": color},
                    },
                }
            )
    return shapes


def fig_load(d: LoadData) -> go.Figure:
    """Throughput and p99 latencies against `max_running_requests` (latency alone when throughput
    did not vary beyond its noise)."""
    fig = go.Figure()
    pts = d.points
    if not d.flat:
        fig.add_trace(
            go.Scatter(
                x=[p.requests for p in pts],
                y=[p.throughput for p in pts],
                mode="markers",
                name="throughput (tok/s)",
                marker={"color": LOOKS["feasible"].color, "size": 10},
                text=[f"#{p.number}" for p in pts],
                hovertemplate="%{y:,.1f} tok/s<extra>%{text}</extra>",
            )
        )
    for attr, name, color in (("p99_ttft_ms", "p99 TTFT (ms)", "#9467bd"),
                              ("p99_itl_ms", "p99 ITL (ms)", "#8c564b")):  # fmt: skip
        fig.add_trace(
            go.Scatter(
                x=[p.requests for p in pts],
                y=[getattr(p, attr) for p in pts],
                mode="markers",
                name=name,
                yaxis="y2",
                marker={"color": color, "symbol": "triangle-up", "size": 9},
                text=[f"#{p.number}" for p in pts],
                hovertemplate="%{y:,.0f} ms<extra>%{text}</extra>",
            )
        )
    fig.update_layout(
        title=style.LOAD.title
        + (f"<br><sup>{e(d.flat)}; only latency is drawn</sup>" if d.flat else ""),
        xaxis_title=style.LOAD.x,
        yaxis={"title": style.LOAD.y},
        yaxis2={"title": "latency (ms)", "overlaying": "y", "side": "right"},
        **_LAYOUT,
    )
    return fig


def fig_history(d: HistoryData) -> go.Figure:
    """Each trial's capacity in trial order, with the best feasible capacity so far as a step
    line."""
    fig = go.Figure(_scatter_by_kind(d.points, "trial %{x}<br>%{y:,.0f} tokens"))
    if d.best_x:
        best_line = {"shape": "hv", "color": LINE_COLOR}
        fig.add_trace(_line(d.best_x, d.best_y, "best feasible so far", best_line))
    fig.update_layout(**_framed(style.HISTORY))
    return fig


def figure_div(fig: go.Figure, div_id: str) -> str:
    """A `<div>` and the `<script>` that draws it, safe inside HTML whatever the text."""
    payload = _script_safe(pio.to_json(fig, validate=False, pretty=False))
    return (
        f'<div id="{div_id}" class="fig"></div>\n'
        f"<script>(function(){{var f={payload};"
        f'Plotly.newPlot("{div_id}",f.data,f.layout,{{responsive:true,displaylogo:false}});}})();'
        "</script>"
    )


def _script_safe(text: str) -> str:
    return text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def plotly_js() -> str:
    """plotly.js itself, made safe inside a `<script>` element, so the page works offline."""
    return _script_safe_js(plotly.offline.get_plotlyjs())


def _script_safe_js(js: str) -> str:
    # plotly.js is embedded verbatim; it must not close the script element early
    return js.replace("</script", "<\\/script")


def table_html(rows: Sequence[Row], log_href: dict[int, str], winner: int | None) -> str:
    """The trials table as HTML, every cell escaped, the winner's row marked and each trial's log
    linked."""
    head = (
        "<tr><th>#</th><th>state</th><th>outcome</th><th>parameters</th><th>capacity</th>"
        "<th>tok/s</th><th>free after startup GiB</th><th>stress peak GiB</th>"
        "<th>free at the worst moment GiB</th><th>p99 TTFT ms</th>"
        "<th>p99 ITL ms</th><th>s</th><th>reason</th><th>log</th></tr>"
    )
    body = []
    for r in rows:
        href = log_href.get(r.number)
        link = f'<a href="{e(href)}">server.log</a>' if href else ""
        cls = f"k-{e(r.kind)}" + (" winner" if r.number == winner else "")
        cells = [str(r.number), r.state, r.outcome, r.params, r.capacity, r.throughput,
                 r.free, r.peak, r.headroom, r.p99_ttft, r.p99_itl, r.seconds,
                 r.reason]  # fmt: skip
        tds = "".join(f"<td>{e(c)}</td>" for c in cells)
        body.append(f'<tr class="{cls}">{tds}<td>{link}</td></tr>')
    return f"<table>{head}{''.join(body)}</table>"
