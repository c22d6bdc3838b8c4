"""The worst-case bursts `autotune confirm` asks the driver for: the longest and the shortest
prompts mixed, sent in each arrival order; a study file's stress phase draws as before."""

from __future__ import annotations

import random
from collections.abc import Callable

from autotune.config.workload import BurstOrder, LengthDist, WorkloadSpec
from autotune.loadgen import ServerFacts, Stress, Target, run_workload, stress_plan
from autotune.loadgen.shapes import Shaper, ordered_burst
from autotune.testing.fakeserver import Running

Start = Callable[..., Running]


def _shaper() -> Shaper:
    return Shaper(random.Random("s"), LengthDist.fixed(10), LengthDist.fixed(4))


def _lengths(groups: list[list[object]]) -> list[list[int]]:
    return [[p.input_len for p in g] for g in groups]  # type: ignore[attr-defined]


def test_each_order_sends_the_long_and_short_prompts_in_its_groups() -> None:
    def burst(order: BurstOrder, seed: int = 0) -> list[list[int]]:
        return _lengths(ordered_burst(_shaper(), 6, 900, 4, order=order, short_len=20, seed=seed))  # type: ignore[arg-type]

    assert burst(BurstOrder.LONGEST_FIRST) == [[900] * 3 + [20] * 3]
    assert burst(BurstOrder.SHORTEST_FIRST) == [[20] * 3, [900] * 3]
    one, two = burst(BurstOrder.RANDOM, 1), burst(BurstOrder.RANDOM, 2)
    assert sorted(one[0]) == sorted(two[0]) == [20] * 3 + [900] * 3
    assert one != two and one == burst(BurstOrder.RANDOM, 1)  # seeded
    # the study file's stress phase: one group of one length, drawn exactly as before
    same = ordered_burst(_shaper(), 3, 900, 4)
    before = _shaper()
    assert same == [[before.fixed(900, 4) for _ in range(3)]]


def test_a_short_prompt_never_outgrows_the_long_one_the_context_allows() -> None:
    mixed = Stress("w", rounds=1, requests=4, input_len=9000, output_len=8,
                   order=BurstOrder.RANDOM, short_len=5000)  # fmt: skip
    plan = stress_plan(mixed, ServerFacts(context_len=4096))
    assert plan["input_len"] == 4096 - 8 - 1 and plan["short_len"] == plan["input_len"]
    assert "short_len" not in stress_plan(Stress("s", requests=2), ServerFacts())


def test_shortest_first_reaches_the_server_short_prompts_first(fake_server: Start) -> None:
    srv = fake_server("--ttft-ms", "2", "--itl-ms", "1")
    phase = Stress("shortest-first", rounds=1, requests=4, input_len=300, output_len=4,
                   order=BurstOrder.SHORTEST_FIRST, short_len=30)  # fmt: skip
    ws = WorkloadSpec(phases=(phase,), seed=3)
    res = run_workload(ws, Target(srv.url), ServerFacts(), is_dead=srv.is_dead)
    sent = sorted(res.records, key=lambda r: r.sent_s or 0.0)
    assert [r.input_tokens for r in sent] == [30, 30, 300, 300]
    assert all(r.ok for r in sent)
    assert res.phases[0].plan["order"] == "shortest-first"
    assert res.phases[0].plan["short_len"] == 30
