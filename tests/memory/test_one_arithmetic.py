"""The memory arithmetic once: one trial's figures (its KV pool, the reserve P·(1 − f), the free
memory after CUDA-graph capture, the stress peak and the free memory at it, and what another
fraction would give) read the same on every surface that prints or decides by them: the run's
progress line, `autotune status`, `autotune explain`, `autotune export`, the report, `autotune
ledger` and the search's records; so does the winner's share of the box's ceiling (status,
explain, export, the report; `ledger` names the stress peak a log alone lacks). Each surface
asks `autotune.memory` for them, so none can drift.

The end-to-end test runs one trial of a small study through the simulator (`autotune run` as a
real process, its stress phase on an EAGLE draft) and reads each surface as the operator would.
The last tests look for the reserve's formula outside `autotune.memory`: a package that works
`P·(1 − f)`, `1 − A/P`, the free memory after startup or the fraction steps that cover missing
headroom out again fails them.
"""

from __future__ import annotations

import ast
import json
import re
from html.parser import HTMLParser
from pathlib import Path

import optuna
import pytest

from autotune.config.studyfile import load_study
from autotune.memory.arithmetic import arithmetic, free_after_capture_gib
from autotune.memory.ceiling import ceiling as memory_ceiling
from autotune.memory.pool import reserve_gib, stress_peak_gib
from autotune.record.view import view
from autotune.review import ceiling, page
from autotune.review import figures as fig
from autotune.review.source import build_review
from autotune.search.records import point_of
from tests import figures
from tests.reliability.helpers import EAGLE, NAME, STRESS, Done, World

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "autotune"
OTHER = 0.86
"""A fraction no trial runs: explain's predicted row and the trial view's prediction for it."""


def _ok(done: Done) -> str:
    assert done.rc == 0, done.out[-2000:] + done.err[-2000:]
    return done.out


def _cli(world: World, *args: str) -> str:
    config = str(world.folder / f"{NAME}.toml")
    return _ok(world.autotune(*args, "--config", config, "--results-dir", str(world.results)))


def _match(pattern: str, text: str) -> re.Match[str]:
    m = re.search(pattern, text)
    assert m is not None, f"{pattern!r} not in:\n{text}"
    return m


class _Rows(HTMLParser):
    """The cells of every row of the report page's trials table."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[list[str]] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "tr":
            self.rows.append([])
        elif tag in ("td", "th"):
            self._cell = []

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self.rows:
            self.rows[-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)


def _report_row(html: str, number: int) -> dict[str, str]:
    parser = _Rows()
    parser.feed(html)
    head = next(r for r in parser.rows if r and r[0] == "#")
    row = next(r for r in parser.rows if r and r[0] == str(number))
    return dict(zip(head, row, strict=True))


def _status_row(text: str, number: int) -> dict[str, str]:
    lines = text.splitlines()
    head = next(line for line in lines if line.lstrip().startswith("#  "))
    row = next(line for line in lines if re.match(rf"\s*{number}\s", line))
    names = re.split(r"\s{2,}", head.strip())
    cells = re.split(r"\s{2,}", row.strip())
    return dict(zip(names, cells, strict=True))


def _explain_row(text: str, fraction: float) -> list[str]:
    """The cells of explain's "Other fractions" row for `fraction` (the mark `*` dropped)."""
    for line in text.split("Other fractions")[1].splitlines()[2:]:
        cells = line.replace("*", " ").split()
        if cells and cells[0] == f"{fraction:.3g}":
            return cells
    raise AssertionError(f"no row for {fraction} in:\n{text}")


@pytest.mark.e2e
def test_one_trials_figures_agree_on_every_surface(world: World) -> None:
    world.study(flags=EAGLE, phases=STRESS, n_trials=1, stall_s=10)  # not about stalls
    run = world.run(timeout=240)
    progress = _ok(run) + run.err
    trials = optuna.load_study(study_name=NAME, storage=world.url).get_trials()
    t = view(trials[0])
    assert t.outcome == "ok" and t.fraction == 0.88, (t.outcome, t.reason)
    led = t.ledger

    # the view's figures are memory's functions of what the trial recorded
    assert t.capacity_tokens == led.max_total_num_tokens
    assert led.p_gib is not None and t.reserve_gib == reserve_gib(led.p_gib, 0.88)
    assert t.static_free_gib == free_after_capture_gib(led)
    assert t.free_at_peak_gib is not None and t.static_free_gib is not None
    assert t.stress_peak_gib == stress_peak_gib(t.static_free_gib, t.free_at_peak_gib)
    a = t.arithmetic()
    assert a is not None and a.headroom is not None
    assert a.reserve_gib == t.reserve_gib and a.headroom.free == t.static_free_gib
    assert a.free_at_peak_gib == pytest.approx(t.free_at_peak_gib, abs=1e-12)
    at = t.predict(OTHER)
    assert at is not None and at.static_free_gib is not None and at.free_at_peak_gib is not None
    want = figures.printed(t)

    # the progress line of the run
    line = _match(r"trial 1/1 \(#0\) ok \[\w+\]: capacity ([\d,]+) tok, .*?([\d.]+) GiB free at "
                  r"the worst moment", progress)  # fmt: skip
    assert (line[1], line[2]) == (want["capacity"], want["worst"])

    # autotune status
    status = _cli(world, "status")
    row = _status_row(status, 0)
    assert (row["capacity"], row["free after startup"], row["free at worst"]) == (
        want["capacity"], want["free"], want["worst"])  # fmt: skip

    # autotune explain: the trial's own lines, its row and a predicted one
    text = _cli(world, "explain", "--trial", "0", "--fraction", str(OTHER))
    said = {
        "capacity": _match(r"the log says ([\d,]+) tokens", text)[1],
        "reserve": _match(r"Reserve P × \(1 − f\) = ([\d.]+) GiB", text)[1],
        "free": _match(r"free after startup ([\d.]+)", text)[1],
        "peak": _match(r"Stress peak ([\d.]+) GiB", text)[1],
        "worst": _match(r"→ ([\d.]+) GiB free at the worst moment", text)[1],
    }
    assert said == want
    own = _explain_row(text, 0.88)
    assert own[2:6] == [want["capacity"], want["reserve"], want["free"], want["worst"]]
    other = _explain_row(text, OTHER)
    assert other[1:6] == [f"{at.kv_gib:.2f}", f"{at.tokens:,}", f"{at.reserve_gib:.2f}",
                          fig.gib(at.static_free_gib), fig.gib(at.free_at_peak_gib)]  # fmt: skip
    assert at.reserve_gib == reserve_gib(led.p_gib, OTHER)

    # autotune export: the trial as it ran, and backed off to a fraction no trial ran
    measured = json.loads(_cli(world, "export", "--format", "json", "--margin", "0"))
    assert measured["trial"] == 0 and measured["predicted"] is False
    assert f"{measured['capacity_tokens']:,}" == want["capacity"]
    assert measured["headroom_gib"] == t.free_at_peak_gib
    backed = json.loads(_cli(world, "export", "--format", "json", "--margin", "1step"))
    f_back = backed["params"]["mem_fraction_static"]
    review = build_review(NAME, world.url, trials, cfg=None, study_attrs={})
    back = t.predict(f_back, review.cell_bytes)
    assert backed["predicted"] is True and back is not None
    assert backed["capacity_tokens"] == back.tokens
    assert backed["headroom_gib"] == back.free_at_peak_gib
    explained = _cli(world, "explain", "--trial", "0", "--fraction", str(f_back))
    cells = _explain_row(explained, f_back)
    assert cells[2] == f"{backed['capacity_tokens']:,}"
    assert cells[5] == fig.gib(backed["headroom_gib"])

    # the report: its page's trials table and explanation, and the data its charts are drawn from
    summary = _cli(world, "report")
    html = (world.study_dir / "report.html").read_text()
    cells_html = _report_row(html, 0)
    assert (cells_html["capacity"], cells_html["free after startup GiB"],
            cells_html["stress peak GiB"], cells_html["free at the worst moment GiB"]) == (
        want["capacity"], want["free"], want["peak"], want["worst"])  # fmt: skip
    assert f"Reserve P × (1 − f) = {want['reserve']} GiB" in html
    figs = page.figures(review)
    table = next(r for r in figs.rows if r.number == 0)
    assert (table.capacity, table.free, table.peak, table.headroom) == (
        want["capacity"], want["free"], want["peak"], want["worst"])  # fmt: skip
    wf = next(w for w in figs.waterfalls if w.number == 0)
    steps = {s.label: s.value for s in wf.steps}
    assert wf.reserve_gib == t.reserve_gib
    assert steps["free after startup"] == t.static_free_gib
    assert -steps["stress peak"] == t.stress_peak_gib
    assert steps[fig.FREE_AT_WORST] == t.free_at_peak_gib

    # the winner's share of the box's ceiling: memory's function of the trial's figures at the
    # margin the export keeps, one line on every surface (and the same figures in the json)
    cfg = load_study(world.folder / f"{NAME}.toml", NAME)
    review = build_review(NAME, world.url, trials, cfg=cfg, study_attrs={})
    share = ceiling.of_winner(review)
    assert share.basis == 0 and share.missing == () and share.ceiling is not None
    assert share.ceiling == memory_ceiling(
        t.arithmetic(review.cell_bytes), ceiling.winner_margin_gib(review)
    )
    assert share.tokens == backed["capacity_tokens"] and share.share is not None
    line = share.line()
    assert f"= {share.share:.0%} of the ceiling {share.ceiling.tokens:,} tokens" in line
    assert line in status.splitlines() and line in text.splitlines()
    assert f"# {line}" in _cli(world, "export", "--format", "shell").splitlines()
    exported = json.loads(_cli(world, "export", "--format", "json"))["ceiling"]
    assert (exported["line"], exported["tokens"], exported["share"]) == (
        line, share.ceiling.tokens, share.share)  # fmt: skip
    assert line in summary.splitlines() and f'<p class="ceiling">{line}</p>' in html
    assert re.search(r"ceiling: winner [\d,]+ tokens = \d+% of the ceiling [\d,]+ tokens; "
                     r"[\d.]+ GiB/GPU of its reserve", line)  # fmt: skip

    # autotune ledger on the trial's own log: the log's row of its what-if table
    assert t.log_path is not None
    doc = json.loads(_ok(world.autotune("ledger", t.log_path, "--json")))
    logged = next(r for r in doc["what_if"]["rows"] if r["measured"])
    # a log alone has no stress peak: the ceiling says so instead of a number
    assert doc["what_if"]["ceiling_tokens"] is None
    assert doc["what_if"]["ceiling_missing"] == ["the stress peak"]
    assert logged["tokens"] == t.capacity_tokens
    assert logged["reserve_gib"] == round(t.reserve_gib, 4)
    assert logged["free_after_startup_gib"] == round(t.static_free_gib, 4)

    # the search's records: what the capacity sampler and the walk-down read of the trial
    point = point_of(trials[0])
    assert point is not None and point.observation is not None
    o = point.observation
    assert o.tokens == t.capacity_tokens
    assert o.static_free_gib == t.static_free_gib
    assert o.headroom_gib == t.free_at_peak_gib
    assert o.setting.mem_fraction == t.fraction
    peak = stress_peak_gib(o.static_free_gib, o.headroom_gib)
    assert peak == t.stress_peak_gib
    searched = arithmetic(o.ledger, o.setting.mem_fraction, stress_peak_gib=peak)
    assert searched is not None and searched.reserve_gib == t.reserve_gib
    assert searched.at(OTHER) == at


# ---- the reserve is worked out in `autotune.memory` only --------------------------------------

GPU_TOTAL = re.compile(r"^(p|pre|p_gib|.*_gib|avail|gpu_.*)$")
"""Names that hold a GPU total: P (`p`, `p_gib`, SGLang's `pre`), A and the other GiB figures."""
FREE_AFTER_CAPTURE = {"available_gpu_mem_gib", "avail_after_graphs_gib"}
PER_STEP = re.compile(r"^(per_step|.*step_gib)$")
"""Names that hold what one fraction step hands back, GiB (`Arithmetic.per_step_gib`)."""
EXEMPT = ("memory", "sim")
"""`autotune.memory` owns the arithmetic; `autotune.sim` plays SGLang itself (it computes the
pool the way SGLang does and imports nothing of autotune, `.importlinter`)."""


def _names(node: ast.AST) -> set[str]:
    out: set[str] = set()
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            out.add(n.id)
        elif isinstance(n, ast.Attribute):
            out.add(n.attr)
    return out


def _one_minus(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.BinOp)
        and isinstance(node.op, ast.Sub)
        and isinstance(node.left, ast.Constant)
        and node.left.value in (1, 1.0)
    )


def _gpu(node: ast.AST) -> bool:
    return any(GPU_TOTAL.match(n) for n in _names(node))


def _per_step(node: ast.AST) -> bool:
    return any(PER_STEP.match(n) for n in _names(node))


def memory_arithmetic(source: str) -> list[str]:
    """The memory arithmetic a module works out itself, one line each: `X·(1 − f)` on a GPU
    total (the reserve), `1 − A/P` or `1 − (A − budget)/P` (a fraction from a budget), the
    free memory after startup picked from the log's two figures, a fraction step's worth of
    free memory from the draft's ratio, and the steps back that cover missing headroom (a GiB
    figure over a step's worth) or the headroom some steps leave missing."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        what = None
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
            if any(_one_minus(side) for side in (node.left, node.right)) and _gpu(node):
                what = "the reserve P·(1 − f)"
            elif "draft_ratio" in _names(node) and _gpu(node):
                what = "free memory per fraction step"
            elif _per_step(node.left) or _per_step(node.right):
                what = "the free memory some fraction steps hand back"
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div) and _per_step(node.right):
            what = "the fraction steps that cover missing headroom"
        elif _one_minus(node):
            assert isinstance(node, ast.BinOp)
            right = node.right
            if isinstance(right, ast.BinOp) and isinstance(right.op, ast.Div) and _gpu(right):
                what = "a fraction from a budget, 1 − (A − budget)/P"
        elif isinstance(node, ast.IfExp) and _names(node) >= FREE_AFTER_CAPTURE:
            what = "the free memory after CUDA-graph capture"
        if what is not None:
            line = getattr(node, "lineno", 0)
            found.append((line, f"line {line}: {what}: {ast.unparse(node)}"))
    return [text for _, text in sorted(found)]


def test_the_memory_arithmetic_is_worked_out_only_in_memory() -> None:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        if rel.parts[0] in EXEMPT:
            continue
        found += [f"autotune/{rel}: {x}" for x in memory_arithmetic(path.read_text())]
    assert found == [], "call autotune.memory instead:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "code",
    [
        "r = p * (1.0 - f)",
        "budget = ledger.avail_after_weights_gib - ledger.p_gib * (1 - fraction)",
        "floor = 1.0 - a / p",
        "floor = 1.0 - ledger.avail_after_weights_gib / ledger.p_gib",
        "f = 1.0 - (a - kv) / p",
        "per_step = a.p_gib * step * (1.0 + a.draft_ratio)",
        "free = led.available_gpu_mem_gib if led.available_gpu_mem_gib is not None"
        " else led.avail_after_graphs_gib",
        "n = max(1, math.ceil((need - headroom_gib) / step_gib - 1e-9))",
        "n = math.ceil(missing / per_step - 1e-9)",
        "n = math.ceil(missing / a.per_step_gib(step) - 1e-9)",
        "short = max(0.0, plan.need_gib - plan.headroom_gib - room * plan.step_gib)",
    ],
)
def test_the_check_finds_the_arithmetic_as_it_was_written_before(code: str) -> None:
    assert memory_arithmetic(code), code


@pytest.mark.parametrize(
    "code",
    [
        "z = heavy_tail_z(1.0 - SOAK_RISK / max(factor, 1.0)) + 1.0",
        "a = 4.0 * q * (1.0 - q)",
        "close = throughput >= (1 - tolerance) * best_tp",
        "target = floor + FLOOR_SHARE * (1.0 - floor)",
        "saving = least * (1.0 - size / was)",
        "level = tokens >= top * (1 - SAME_CAPACITY)",
        "room = max(0, math.floor((t.fraction - lowest) / step + 1e-9))",
        "per_step = a.per_step_gib(step)",
    ],
)
def test_the_check_leaves_other_arithmetic_alone(code: str) -> None:
    assert memory_arithmetic(code) == [], code
