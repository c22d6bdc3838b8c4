"""The worst cases a confirmation runs, planned from the study and the winner's ledger, and the
export's margin covering what they found (`autotune.review.worstcase`, `review.soak`)."""

from __future__ import annotations

import dataclasses
import json
import tomllib
from pathlib import Path

import pytest

from autotune.config.schema import StudyConfig
from autotune.config.studyfile import parse_study
from autotune.config.workload import BurstOrder
from autotune.logparse.ledger import Ledger
from autotune.record.view import views
from autotune.review.confirm import case_config
from autotune.review.source import REFUTED_FLOOR, build_review
from autotune.review.verdict import CaseResult, Verdict
from autotune.review.winner import choose
from autotune.review.worstcase import (
    CASE_MAX_OUTPUT,
    CASE_NAMES,
    case_plan,
    run_order,
    workload_lengths,
)
from tests.review.conftest import STUDY
from tests.review.fakes import P, trial


def _study(tmp_path: Path, search: str, workload: str = "") -> StudyConfig:
    text = STUDY.replace(
        "max_running_requests = { choices = [32, 48, 64] }",
        f"max_running_requests = {{ choices = [32, 48, 64] }}\n{search}",
    )
    if workload:
        text = text.replace("input_len = 512\noutput_len = 64\n", workload)
    return parse_study(tomllib.loads(text), name="t", path=tmp_path / "t.toml")


@pytest.fixture
def long_cfg(tmp_path: Path) -> StudyConfig:
    """A study whose chunk is searched (2048 to 8192) and whose prompts run up to 30,000 tokens."""
    return _study(
        tmp_path,
        "chunked_prefill_size = { choices = [2048, 4096, 8192] }",
        'input_len = { dist = "uniform", min = 100, max = 30000 }\noutput_len = 600\n',
    )


LEDGER = Ledger(
    max_running_requests=40,  # asked 48; SGLang ran 40
    chunked_prefill_size=4096,
    context_len=20_000,
    max_total_num_tokens=400_000,
)


def test_the_cases_take_the_largest_chunk_the_longest_context_and_the_effective_requests(
    long_cfg: StudyConfig,
) -> None:
    cfg = long_cfg
    cases = {c.name: c for c in case_plan(cfg, LEDGER)}
    assert tuple(cases) == CASE_NAMES
    chunk = cases["largest-chunk"].burst
    # the largest chunk in the space, not the one this launch ran (4096)
    assert chunk.input_len == 8192 and chunk.requests == 40
    # the longest request (30,000 + 600) capped by the longest the server serves: SGLang's
    # max_req_len, min(context 20,000, pool 400,000) - 1, less the 5 it keeps off the input
    ctx = cases["longest-context"].burst
    assert ctx.output_len == CASE_MAX_OUTPUT
    assert (ctx.input_len or 0) + ctx.output_len == 20_000 - 1 - 5
    assert ctx.requests == 400_000 // 19_994 + 1  # one more than the pool holds at once
    # a pool smaller than the context caps the request instead
    small = {
        c.name: c for c in case_plan(cfg, dataclasses.replace(LEDGER, max_total_num_tokens=9000))
    }
    assert (small["longest-context"].burst.input_len or 0) + CASE_MAX_OUTPUT == 9000 - 1 - 5
    # the effective max running requests from the ledger, each fitting the pool
    mr = cases["max-running"].burst
    assert mr.requests == 40 and ((mr.input_len or 0) + mr.output_len) * 40 <= 400_000
    orders = [cases[n].burst for n in ("longest-first", "shortest-first", "random-1", "random-2")]
    assert [b.order for b in orders] == [BurstOrder.LONGEST_FIRST, BurstOrder.SHORTEST_FIRST,
                                         BurstOrder.RANDOM, BurstOrder.RANDOM]  # fmt: skip
    assert {b.order_seed for b in orders[2:]} == {1, 2}
    assert all(b.short_len == 100 and b.input_len == ctx.input_len for b in orders)
    assert "long 19,738 / short 100" in cases["random-1"].sent()
    assert cases["largest-chunk"].sent() == "40 × 8,192+64 tokens at once"


def test_a_fixed_chunk_and_no_ledger_figures_fall_back_in_order(tmp_path: Path) -> None:
    cfg = _study(tmp_path, "chunked_prefill_size = 16384")
    cases = {c.name: c for c in case_plan(cfg, Ledger(chunked_prefill_size=2048))}
    assert cases["largest-chunk"].burst.input_len == 16384
    assert cases["max-running"].burst.requests == 32  # no ledger figure: the default burst
    no_chunk = {
        c.name: c for c in case_plan(_study(tmp_path, ""), Ledger(chunked_prefill_size=6000))
    }
    assert no_chunk["largest-chunk"].burst.input_len == 6000  # the effective one
    assert workload_lengths(cfg).max_input == 512


CASES = (
    CaseResult("largest-chunk", "40 × 8,192+64 tokens at once", True, "ok", 2.6, 1.9),
    CaseResult("longest-context", "11 × 19,743+256 tokens at once", True, "ok", 3.4, 1.1),
    CaseResult("random-1", "8 × (long / short)", True, "ok", 2.4, 2.1),
)


def test_a_verdict_keeps_its_cases_and_an_older_one_reads_without_them() -> None:
    v = Verdict(params={"mem_fraction_static": 0.9}, passed=True, outcome="ok", cases=CASES)
    stored = json.loads(json.dumps(v.to_attr()))
    assert Verdict.from_attr(stored) == v
    assert v.worst_case is CASES[1]
    assert v.worst_line() == "worst case longest-context: peak 3.40 GiB, 1.10 GiB free (ok)"
    table = v.case_table().splitlines()
    assert table[0].split() == ["case", "sent", "peak", "GiB", "least", "free", "GiB", "verdict",
                                "launch"]  # fmt: skip
    # a case from before cases shared launches names none
    assert (
        "longest-context" in table[2]
        and "3.40" in table[2]
        and table[2].split()[-2:] == ["ok", "-"]
    )
    old = Verdict.from_attr({"params": {"mem_fraction_static": 0.9}, "passed": True})
    assert old is not None and old.cases == () and old.worst_line() == ""
    # a stored case without a launch (each case had its own then) reads back with none
    older = Verdict.from_attr({"params": {}, "passed": True, "cases": [
        {"name": "max-running", "sent": "x", "passed": True, "outcome": "ok", "folder": "c/0003"}
    ]})  # fmt: skip
    assert older is not None and older.cases[0].launch is None and older.launches == ()
    assert "launch" not in older.describe().splitlines()[2]
    oom = CaseResult("longest-context", "x", False, "runtime_oom", 1.0, 0.0)
    failed = Verdict(params={}, passed=False, outcome="ok", cases=(CASES[0], oom))
    assert failed.worst_case is oom and "(runtime_oom)" in failed.worst_line()


def _trials() -> list:  # type: ignore[type-arg]
    # three trials at the chosen demand, stress peak 2.5 GiB each
    return [trial(0, 0.88, peak=2.5), trial(1, 0.89, peak=2.5), trial(2, 0.90, peak=2.5)]


def _review(confirmations: list[Verdict]) -> object:
    return build_review(
        "t",
        "sqlite://",
        _trials(),
        cfg=None,
        study_attrs={"confirmations": [c.to_attr() for c in confirmations]},
    )


@pytest.mark.parametrize("peak", [3.4, 4.5])
def test_the_margin_covers_the_worst_cases_rise_and_names_the_case(peak: float) -> None:
    seen = views(_trials())
    before = choose(seen, fraction_step=0.01)
    assert before is not None and before.soak is not None and before.soak.worst is None
    case = CaseResult("longest-context", "11 × 19,743+256", True, "ok", peak, 1.0)
    soaked = Verdict(params=dict(before.params), passed=True, outcome="ok",
                     cases=(CASES[0], case, CASES[2]))  # fmt: skip
    w = _review([soaked]).winner  # type: ignore[attr-defined]
    assert w is not None and w.soak is not None and w.soak.worst is not None
    found = w.soak.worst
    # the longest-context case peaked above the study's 2.5 GiB stress peak
    assert found.case == "longest-context"
    assert found.case_rise_gib == pytest.approx(peak - 2.5)
    assert found.rise_before_gib == pytest.approx(before.soak.rise_gib)
    assert found.steps_before == before.steps_back
    assert w.soak.rise_gib == pytest.approx(max(peak - 2.5, before.soak.rise_gib))
    # the margin covers the rise: the headroom kept plus the steps backed off hold the need
    assert w.soak.headroom_gib + w.steps_back * w.soak.step_gib >= w.soak.need_gib - 1e-9
    assert w.soak.need_gib >= w.soak.required_gib + peak - 2.5 - 1e-9
    if found.set_rise:  # 2.0 GiB of rise against the soak's ~0.97: more steps
        assert peak == 4.5 and w.steps_back > before.steps_back
        assert "set by the worst case longest-context" in w.soak.describe()
        assert any("peaked 2.00 GiB above the study's stress peak" in n for n in w.notes)
    else:  # within what the soak allowed: the margin stands
        assert peak == 3.4 and w.params == before.params
        assert any("stayed within the soak's margin" in n for n in w.notes)


def test_a_case_that_failed_at_the_winner_backs_off_a_step_more_and_says_so() -> None:
    seen = views(_trials())
    before = choose(seen, fraction_step=0.01)
    assert before is not None
    oom = CaseResult("longest-context", "11 × 19,743+256", False, "runtime_oom", 1.2, 0.0)
    failed = Verdict(params=dict(before.params), passed=False, outcome="ok", cases=(oom,))
    w = _review([failed]).winner  # type: ignore[attr-defined]
    assert w is not None and w.soak is not None and w.soak.worst is not None
    assert w.soak.worst.uncovered == ("longest-context",)
    assert w.steps_back == before.steps_back + 1
    assert w.params["mem_fraction_static"] == pytest.approx(
        before.params["mem_fraction_static"] - 0.01
    )
    assert "not covered: worst case longest-context failed" in w.soak.describe()
    assert any("longest-context failed at the confirmed setting" in n for n in w.notes)
    assert P > 0


def test_a_case_runs_alone_and_its_queued_requests_may_wait_as_long_as_the_burst(
    tmp_path: Path,
) -> None:
    cfg = _study(tmp_path, "")
    case = case_plan(cfg, LEDGER)[1]
    alone = case_config(cfg, case)
    assert alone.workload.phases == (case.burst,)
    assert alone.workload.request_timeout_s == max(cfg.workload.request_timeout_s, 600.0)
    assert alone.server.limits.workload_s >= case.burst.timeout_s
    assert alone.search == cfg.search and alone.constraints == cfg.constraints


def test_cases_that_never_served_are_named_but_do_not_back_off() -> None:
    seen = views(_trials())
    before = choose(seen, fraction_step=0.01)
    assert before is not None
    down = CaseResult("max-running", "40 × 8,192+64", False, "startup_error")
    cut = CaseResult("random-2", "8 × (long / short)", False, "interrupted")
    v = Verdict(params=dict(before.params), passed=False, outcome="ok", cases=(CASES[0], down, cut))
    w = _review([v]).winner  # type: ignore[attr-defined]
    assert w is not None and w.soak is not None and w.soak.worst is not None
    assert w.soak.worst.uncovered == () and w.soak.worst.unrun == ("max-running", "random-2")
    assert w.params == before.params  # nothing measured above the soak's rise
    assert "not covered: worst case max-running, random-2 did not serve" in w.soak.describe()
    assert w.soak.worst.to_dict()["not_served"] == ["max-running", "random-2"]


def test_the_cases_run_from_the_least_to_the_most_likely_to_fail_by_their_planned_peak(
    long_cfg: StudyConfig,
) -> None:
    cfg = long_cfg
    planned = case_plan(cfg, LEDGER)
    cases = {c.name: c for c in planned}
    # the largest prefill forward: the prompts running at once, at most the chunk SGLang ran
    assert all(c.forward_tokens == 4096 for c in planned)  # each burst fills a 4,096 chunk
    # the live context the running requests ask for: 40 at most, each its whole length
    assert cases["largest-chunk"].held_tokens == 40 * (8192 + 64)
    assert cases["max-running"].held_tokens == 40 * (8192 + 256)
    # 21 requests of 19,994 tokens: one more than the 400,000-token pool holds at once
    assert cases["longest-context"].held_tokens == 21 * 19_994
    # a mixed burst: its long prompts first, the worst its arrival order can make it
    assert cases["longest-first"].held_tokens == 20 * (19_738 + 256) + 20 * (100 + 256)
    assert cases["longest-first"].burst.requests == 40
    # by the plan's sizes, not by name: equal forwards (a chunk each), so the live context
    # decides; the four arrival orders plan the same and keep the plan's order
    assert [c.name for c in run_order(planned)] == [
        "largest-chunk", "max-running", "longest-first", "shortest-first", "random-1",
        "random-2", "longest-context"]  # fmt: skip
    # a case whose prompts fill less than a chunk plans a smaller forward and runs first
    small = dataclasses.replace(LEDGER, chunked_prefill_size=None, max_running_requests=2)
    by_forward = run_order(case_plan(cfg, small))
    assert [c.forward_tokens for c in by_forward] == sorted(c.forward_tokens for c in by_forward)
    assert by_forward[-1].name == "longest-context"


def _soak(params: dict, passed: bool, outcome: str, **kw: object) -> Verdict:  # type: ignore[type-arg]
    return Verdict(params=dict(params), passed=passed, outcome=outcome, soak_factor=3.0, **kw)  # type: ignore[arg-type]


def test_a_soak_that_failed_serving_backs_the_export_off_a_step_more_and_says_so() -> None:
    before = choose(views(_trials()), fraction_step=0.01)
    assert before is not None
    oom = _soak(before.params, False, "runtime_oom", reason="runtime_oom (torch_oom)")
    w = _review([oom]).winner  # type: ignore[attr-defined]
    assert w is not None and w.soak is not None and w.soak.worst is not None
    assert w.soak.worst.uncovered == ("soak",)
    assert w.steps_back == before.steps_back + 1
    assert w.params["mem_fraction_static"] == pytest.approx(
        before.params["mem_fraction_static"] - 0.01
    )
    assert "not covered: the soak failed at the confirmed setting" in w.soak.describe()
    assert any("the confirmation's soak failed at the confirmed setting" in n for n in w.notes)
    # a soak that kept too little headroom failed for its memory too, and its peak counts
    thin = _soak(before.params, False, "ok", violated=("headroom_gib",), stress_peak_gib=2.9)
    w2 = _review([thin]).winner  # type: ignore[attr-defined]
    assert w2 is not None and w2.steps_back == before.steps_back + 1


def test_each_failed_soak_of_a_backed_off_point_backs_off_again_and_a_pass_there_holds() -> None:
    before = choose(views(_trials()), fraction_step=0.01)
    assert before is not None
    f0 = float(before.params["mem_fraction_static"])
    first = _soak(before.params, False, "runtime_oom")
    once = _review([first]).winner  # type: ignore[attr-defined]
    assert once is not None and once.params["mem_fraction_static"] == pytest.approx(f0 - 0.01)
    second = _soak(once.params, False, "runtime_oom")
    twice = _review([first, second]).winner  # type: ignore[attr-defined]
    assert twice is not None and twice.steps_back == before.steps_back + 2
    assert twice.params["mem_fraction_static"] == pytest.approx(f0 - 0.02)
    # the point a step lower passed its soak: the export stays there, not back at the first
    passed = _soak(once.params, True, "ok", cases=CASES)
    held = _review([first, passed]).winner  # type: ignore[attr-defined]
    assert held is not None and held.params == once.params
    assert held.soak is not None and held.soak.worst is not None
    assert held.soak.worst.uncovered == ("soak",)


@pytest.mark.parametrize(
    ("outcome", "violated"),
    [("startup_error", ()), ("killed", ()), ("ok", ("p99_ttft_ms",))],
)
def test_a_soak_that_failed_for_other_reasons_than_its_memory_moves_nothing(
    outcome: str, violated: tuple[str, ...]
) -> None:
    before = choose(views(_trials()), fraction_step=0.01)
    assert before is not None
    v = _soak(before.params, False, outcome, violated=violated)
    w = _review([v]).winner  # type: ignore[attr-defined]
    assert w is not None and w.params == before.params and w.steps_back == before.steps_back


def test_a_failed_soak_where_no_lower_fraction_can_start_says_so_instead_of_confirm_again() -> None:
    """The soak refuted the exported point and the lowest fraction that can start is that point
    (a launch a step lower found no room for the KV pool): the export stays, says that nothing
    of the space is known to pass a soak this long, and does not send the operator to soak the
    same setting again."""
    no_room = "startup_oom (no_kv_room): Not enough memory. Please increase --mem-fraction-static"
    trials = [
        trial(0, 0.88, outcome="startup_oom", reason=no_room),
        trial(1, 0.89, peak=2.5),
        trial(2, 0.90, peak=2.5),
    ]
    before = choose(views(trials), fraction_step=0.01)
    assert before is not None and before.params["mem_fraction_static"] == 0.89
    oom = _soak(before.params, False, "runtime_oom", reason="runtime_oom (torch_oom)")
    review = build_review(
        "t", "sqlite://", trials, cfg=None, study_attrs={"confirmations": [oom.to_attr()]}
    )
    w = review.winner
    assert w is not None and w.params == before.params
    assert w.notes[-1] == REFUTED_FLOOR
    assert not any("run autotune confirm again" in n for n in w.notes)
    assert any("soak failed at the confirmed setting" in n and "no lower fraction can start" in n
               for n in w.notes)  # fmt: skip
