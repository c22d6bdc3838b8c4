"""How each kind of trial is drawn, shared by the HTML and PNG renderers."""

from __future__ import annotations

from typing import NamedTuple


class Look(NamedTuple):
    """How one kind of trial is drawn: its legend name, colour, and marker in plotly and
    matplotlib."""

    name: str
    color: str
    plotly_symbol: str
    mpl_marker: str


LOOKS = {
    "feasible": Look("feasible", "#2a9d3f", "circle", "o"),
    "infeasible": Look("infeasible (constraint broken)", "#e69500", "diamond", "D"),
    "oom": Look("out of memory", "#d62728", "x", "X"),
    "failed": Look("failed (not the parameters)", "#7f7f7f", "square", "s"),
    "running": Look("running", "#1f77b4", "circle-open", "o"),
}
WINNER_COLOR = "#f2b705"
LINE_COLOR = "#4a4a4a"


class Frame(NamedTuple):
    """A figure's title and axis titles, the same on the HTML page and in the PNG."""

    title: str
    x: str
    y: str


PARETO = Frame("Capacity vs throughput", "KV capacity (tokens)", "output throughput (tok/s)")
FEASIBILITY = Frame(
    "Feasibility: mem_fraction_static × max_running_requests",
    "mem_fraction_static",
    "max_running_requests",
)
CAPACITY = Frame(
    "KV capacity vs mem_fraction_static", "mem_fraction_static", "max_total_num_tokens"
)
LOAD = Frame(
    "Throughput and latency vs max_running_requests",
    "max_running_requests",
    "output throughput (tok/s)",
)
HISTORY = Frame("Search history", "trial", "KV capacity (tokens)")
