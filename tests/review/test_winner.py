"""The winner rule: capacity within a throughput tolerance, then a safety margin."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest

from autotune.config.space import stored_space
from autotune.errors import UsageError
from autotune.memory.model import CHUNK_SLOPE_REL_SD
from autotune.record.view import views
from autotune.review.source import build_review
from autotune.review.verdict import Verdict
from autotune.review.winner import (
    Margin,
    choose,
    lowest_startable,
    parse_margin,
    parse_tolerance,
)
from tests.review.fakes import CELL, GIB, A, P, ledger, trial, walk

NO_ROOM = "startup_oom (no_kv_room): Not enough memory. Please increase --mem-fraction-static"


def test_highest_capacity_backed_off_one_step_to_a_trial_that_ran() -> None:
    w = choose(views(walk()), fraction_step=0.01)
    assert w is not None
    assert w.chosen.number == 1  # 0.90: the most capacity among feasible trials
    assert w.params["mem_fraction_static"] == 0.89
    assert w.source is not None and w.source.number == 4 and w.trial == 4
    assert not w.predicted
    assert w.capacity_tokens == w.source.capacity_tokens
    assert w.steps_back == 1


def test_no_margin_exports_the_chosen_trial() -> None:
    w = choose(views(walk()), margin=Margin(steps=0))
    assert w is not None and w.trial == 1 and w.params["mem_fraction_static"] == 0.90


def test_throughput_tolerance_excludes_a_slower_bigger_pool() -> None:
    trials = [trial(0, 0.88, throughput=150.0), trial(1, 0.90, throughput=130.0)]
    strict = choose(views(trials), tolerance=0.05, margin=Margin(steps=0))
    loose = choose(views(trials), tolerance=0.15, margin=Margin(steps=0))
    assert strict is not None and strict.chosen.number == 0
    assert loose is not None and loose.chosen.number == 1


def test_backed_off_point_that_never_ran_is_predicted_with_sglang_arithmetic() -> None:
    w = choose(views([trial(0, 0.90, peak=2.5)]), fraction_step=0.02)
    assert w is not None and w.predicted and w.source is None
    assert w.params["mem_fraction_static"] == 0.88
    # two steps of 0.01·P: the pool shrinks by 0.02·94.05 GiB and the free memory grows as much
    assert w.capacity_tokens is not None
    assert w.capacity_tokens == pytest.approx(int((21.71 - P * 0.12) * 2**30) // 70272, rel=1e-3)
    chosen_free = w.chosen.free_at_peak_gib
    assert chosen_free is not None and w.free_at_peak_gib is not None
    assert w.free_at_peak_gib == pytest.approx(chosen_free + 0.02 * P, abs=0.05)
    assert any("predicted" in n for n in w.notes)


def test_headroom_margin_takes_enough_steps() -> None:
    w = choose(views(walk()), fraction_step=0.01, margin=Margin(steps=0, headroom_gib=3.0))
    assert w is not None
    # 0.90 leaves 1.12 GiB at the peak; each step adds 0.94 GiB (+ the draft's share): 2 steps
    assert w.steps_back == 2 and w.params["mem_fraction_static"] == 0.88
    assert w.free_at_peak_gib is not None and w.free_at_peak_gib >= 3.0


def test_headroom_margin_already_met_takes_no_step() -> None:
    w = choose(views(walk()), margin=Margin(steps=0, headroom_gib=1.0))
    assert w is not None and w.steps_back == 0 and w.trial == 1


def test_no_feasible_trial_no_winner() -> None:
    assert choose(views([trial(0, 0.94, outcome="startup_oom")])) is None
    assert choose([]) is None


def test_an_infeasible_backed_off_point_is_noted() -> None:
    trials = [trial(0, 0.90), trial(1, 0.89, outcome="runtime_oom")]
    w = choose(views(trials), space=stored_space(trials))  # the fakes' step: 0.01
    assert w is not None and w.source is not None and w.source.number == 1
    assert any("larger margin" in n for n in w.notes)


@pytest.mark.parametrize(
    ("text", "margin"),
    [("1step", Margin(1)), ("2 steps", Margin(2)), ("0", Margin(0)),
     ("1.5GiB", Margin(0, 1.5)), ("2gb", Margin(0, 2.0))],
)  # fmt: skip
def test_parse_margin(text: str, margin: Margin) -> None:
    assert parse_margin(text) == margin


@pytest.mark.parametrize("text", ["one", "1.5steps", "-1", "2TB"])
def test_parse_margin_rejects(text: str) -> None:
    with pytest.raises(UsageError, match="--margin"):
        parse_margin(text)


def test_parse_tolerance() -> None:
    assert parse_tolerance("0.1") == 0.1
    assert parse_tolerance("5%") == 0.05
    for bad in ("x", "1.5", "-0.1"):
        with pytest.raises(UsageError, match="--tolerance"):
            parse_tolerance(bad)


def test_the_margin_never_backs_off_below_what_can_start() -> None:
    """0.81 failed for want of room for the KV pool: a 5-step margin from 0.83 stops at 0.82."""
    trials = [trial(0, 0.83), trial(1, 0.81, outcome="startup_oom", reason=NO_ROOM)]
    w = choose(views(trials), fraction_step=0.01, margin=Margin(steps=5))
    assert w is not None and w.params["mem_fraction_static"] == 0.82, w
    assert w.steps_back == 1
    assert any("the KV pool finds no room" in n for n in w.notes), w.notes


def test_a_narrow_window_trades_the_prefill_chunk_for_the_soaks_margin() -> None:
    """0.81 cannot start and 0.82 kept 0.6 GiB under an 8,192-token chunk's 2.5 GiB peak: no
    fraction that can start gives the soak's margin, so the export halves the chunk (predicted)
    until its least fall covers the shortfall: 2048."""
    free = ledger(0.82)["available_gpu_mem_gib"]
    trials = [
        trial(0, 0.82, peak=free - 0.6, chunk=8192),
        trial(1, 0.81, outcome="startup_oom", reason=NO_ROOM),
    ]
    w = choose(views(trials), fraction_step=0.01, min_headroom_gib=0.5)
    assert w is not None and w.params["mem_fraction_static"] == 0.82, w
    assert w.params["chunked_prefill_size"] == 2048, w.params
    assert w.predicted and w.source is None
    assert any("chunked_prefill_size 2048 instead of 8192" in n for n in w.notes), w.notes
    assert w.soak is not None and w.soak.need_gib > 0.6  # the fraction alone fell short


def test_the_chunk_trade_counts_on_the_least_fall_the_chunk_prior_allows() -> None:
    """The peak is taken as proportional to the chunk, its slope uncertain by
    CHUNK_SLOPE_REL_SD: the export counts on the fall two such spreads below the proportional
    one (part of a peak, a base and the decode batch, does not shrink with the chunk), so a
    shortfall the proportional fall would just cover takes a smaller chunk."""
    peak = ledger(0.82)["available_gpu_mem_gib"] - 0.6
    trials = [
        trial(0, 0.82, peak=peak, chunk=8192),
        trial(1, 0.81, outcome="startup_oom", reason=NO_ROOM),
    ]
    w = choose(views(trials), fraction_step=0.01, min_headroom_gib=0.5)
    assert w is not None
    chunk = w.params["chunked_prefill_size"]
    assert isinstance(chunk, int)
    note = next(n for n in w.notes if "instead of 8192" in n)
    fall = float(re.search(r"by about ([0-9.]+) GiB", note).group(1))  # type: ignore[union-attr]
    assert fall == pytest.approx(
        peak * (1 - chunk / 8192) * (1 - 2 * CHUNK_SLOPE_REL_SD), abs=0.01
    ), note


def test_a_failed_soak_at_the_lowest_fraction_that_starts_trades_the_prefill_chunk() -> None:
    """0.84 held with room for its soak's margin a step lower; 0.82 cannot start. The soak of
    0.83 fails: the export would back off a step more, to 0.82, which cannot start, so it stays
    at 0.83 and halves the chunk for the step the window lacks, and says why."""
    free = ledger(0.84)["available_gpu_mem_gib"]
    trials = [
        trial(0, 0.84, peak=free - 3.0, chunk=8192),
        trial(1, 0.82, outcome="startup_oom", reason=NO_ROOM),
    ]
    before = choose(views(trials), fraction_step=0.01, min_headroom_gib=0.5)
    assert before is not None and before.params["mem_fraction_static"] == 0.83, before
    assert "chunked_prefill_size" not in before.params
    failed = Verdict(params=dict(before.params), passed=False, outcome="runtime_oom")
    after = build_review(
        "t", "sqlite://", trials, cfg=None, study_attrs={"confirmations": [failed.to_attr()]}
    ).winner
    assert after is not None and after.params["mem_fraction_static"] == 0.83, after.params
    chunk = after.params["chunked_prefill_size"]
    assert isinstance(chunk, int) and chunk < 8192
    assert any(f"chunked_prefill_size {chunk} instead of 8192" in n for n in after.notes)
    assert any("the confirmation's soak failed at the confirmed setting" in n
               for n in after.notes), after.notes  # fmt: skip
    assert any("the KV pool finds no room" in n for n in after.notes), after.notes


def test_a_chunk_trade_that_covers_more_than_the_window_lacks_gives_steps_back() -> None:
    """0.84 kept 0.6 GiB under an 8,192-token chunk's peak; 0.81 cannot start, so two steps are
    all the window has and the soak's margin wants four. Halving the chunk covers 2.41 GiB of
    the margin, more than the 1.36 GiB the window lacks: the fraction backs off one step for
    the rest (0.83), not to the window's floor as well (0.82: the margin paid twice)."""
    free = ledger(0.84)["available_gpu_mem_gib"]
    trials = [
        trial(0, 0.84, peak=free - 0.6, chunk=8192),
        trial(1, 0.81, outcome="startup_oom", reason=NO_ROOM),
    ]
    w = choose(views(trials), fraction_step=0.01, min_headroom_gib=0.5)
    assert w is not None and w.soak is not None
    assert w.params["chunked_prefill_size"] == 4096, w.params
    assert w.params["mem_fraction_static"] == 0.83 and w.steps_back == 1, w.params
    covers = float(re.search(r"covers ([0-9.]+) GiB", " ".join(w.notes)).group(1))  # type: ignore[union-attr]
    # what the steps hand back and the chunk's fall hold the soak's margin
    assert w.soak.headroom_gib + w.steps_back * w.soak.step_gib + covers >= w.soak.need_gib
    assert not any("the KV pool finds no room" in n for n in w.notes), w.notes


def test_the_chunk_stays_where_backing_off_gives_the_margin() -> None:
    free = ledger(0.85)["available_gpu_mem_gib"]
    trials = [trial(0, 0.85, peak=free - 0.6, chunk=8192)]
    w = choose(views(trials), fraction_step=0.01, min_headroom_gib=0.5)
    assert w is not None and "chunked_prefill_size" not in w.params, w.params
    assert w.steps_back >= 1


def test_a_fraction_a_trial_started_at_can_start_whatever_the_ledger_says() -> None:
    """The ledger's bound keeps a step for ranks the log does not show (1 − A/P = 0.815 gives
    0.83); a trial that started at 0.82 shows that 0.82 starts."""
    a = P * (1 - 0.815)
    seen = [replace(v, ledger=replace(v.ledger, avail_after_weights_gib=a))
            for v in views([trial(0, 0.82), trial(1, 0.85)])]  # fmt: skip
    assert lowest_startable(seen, 0.01) == pytest.approx(0.82)
    assert lowest_startable(seen[1:], 0.01) == pytest.approx(0.83)


def test_a_short_rank_the_ledger_misses_shows_in_the_pools_the_launches_sized() -> None:
    """SGLang sizes the pool from the least rank: when the pools the launches sized fall to zero
    above the ledger's `1 − A/P` (a rank short that the printed figures do not show), the lowest
    fraction that can start is a step above where they do."""
    short = 1.5  # GiB the pools were sized without
    seen = []
    for v in views([trial(0, 0.85), trial(1, 0.88)]):
        f = v.fraction
        assert f is not None
        n = int((A - short - P * (1 - f)) * GIB) // CELL
        seen.append(replace(v, ledger=replace(v.ledger, max_total_num_tokens=n)))
    # the pools fall to zero at 1 − (A − 1.5)/P = 0.7851; the ledger alone says 1 − A/P = 0.7692
    assert lowest_startable(seen, 0.01) == pytest.approx(0.80)
    assert lowest_startable(views([trial(0, 0.85), trial(1, 0.88)]), 0.01) == pytest.approx(0.78)
    # a wide margin backs off no lower than that
    w = choose(seen, fraction_step=0.01, margin=Margin(steps=20, soak=False))
    assert w is not None and w.params["mem_fraction_static"] == pytest.approx(0.80)


def test_a_trial_at_the_backed_off_point_that_kept_less_than_the_soak_needs_backs_off() -> None:
    """The arithmetic's step is a forecast: where a trial ran the point the soak's margin backs
    off to and kept less than the soak needs, the steps count on from that measurement."""
    # 0.91 kept 0.7 GiB; the peaks at its demand spread from 2.0 to 3.2 GiB
    ran = [trial(0, 0.91, least_free=0.7), trial(2, 0.86, peak=2.0), trial(3, 0.86, peak=3.2)]
    alone = choose(views(ran), fraction_step=0.01)
    assert alone is not None and alone.soak is not None and alone.soak.measured is None
    k, per_step = alone.steps_back, alone.soak.step_gib
    back = round(0.91 - 0.01 * k, 2)
    # as the arithmetic forecast: the same peak, each step's GiB free; the export is that trial
    w = choose(views([*ran, trial(1, back, least_free=0.7 + k * per_step)]), fraction_step=0.01)
    assert w is not None and w.soak is not None and w.soak.measured is None
    assert w.steps_back == k and w.trial == 1
    # the trial there kept less than the soak needs: one more step, from its measurement
    kept = alone.soak.need_gib - 0.1
    w = choose(views([*ran, trial(1, back, least_free=kept)]), fraction_step=0.01)
    assert w is not None and w.soak is not None and w.soak.measured == (1, pytest.approx(kept))
    assert w.soak.need_gib > kept and w.steps_back == k + 1 and w.predicted
    assert f"trial 1 ran a point fewer steps back and kept {kept:.2f} GiB" in w.describe()


def test_a_trial_fewer_steps_back_that_kept_the_soak_s_need_stands_for_the_forecast() -> None:
    """The chosen setting held thin, so the arithmetic's forecast backs off several steps; a
    trial that ran a point fewer steps back and kept what the soak needs is a measurement, and
    the export stops there (the demo: 0.91 kept 0.01 GiB, 0.90 kept 1.14 GiB of the 0.97 GiB
    needed, and the export went to 0.89). Not where a trial there failed."""
    ran = [trial(0, 0.91, least_free=0.55), trial(2, 0.86, peak=2.0), trial(3, 0.86, peak=3.2)]
    alone = choose(views(ran), fraction_step=0.01)
    assert alone is not None and alone.soak is not None and alone.steps_back >= 2
    need = alone.soak.need_gib
    held = trial(1, 0.90, least_free=need + 0.05)
    w = choose(views([*ran, held]), fraction_step=0.01)
    assert w is not None and w.soak is not None and w.steps_back == 1 and w.trial == 1
    assert w.soak.measured == (1, pytest.approx(need + 0.05))
    assert "trial 1 ran the point it lands on and kept" in w.describe()
    failed = trial(4, 0.90, outcome="runtime_oom")
    w = choose(views([*ran, held, failed]), fraction_step=0.01)
    assert w is not None and w.steps_back == alone.steps_back
