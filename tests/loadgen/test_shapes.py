"""Seeded request shapes: distributions, unique heads, sessions that share prefixes."""

from __future__ import annotations

import json
import random
import statistics

from autotune.config.workload import DatasetRow, LengthDist, Sessions
from autotune.loadgen.shapes import Shaper, TokenPool, sample_length


def test_distributions_stay_in_bounds_and_center() -> None:
    rng = random.Random(1)
    uni = [sample_length(LengthDist("uniform", 10, 20), rng) for _ in range(2000)]
    assert min(uni) == 10 and max(uni) == 20
    norm = [sample_length(LengthDist("normal", 1, 10_000, 500.0, 50.0), rng) for _ in range(4000)]
    assert abs(statistics.mean(norm) - 500) < 5
    logn = LengthDist("lognormal", 1, 1_000_000, 1000.0, 800.0)
    xs = [sample_length(logn, rng) for _ in range(20000)]
    assert abs(statistics.mean(xs) - 1000) < 40  # mean and std are of the lengths themselves
    assert abs(statistics.stdev(xs) - 800) < 80
    clipped = [sample_length(LengthDist("normal", 90, 110, 100.0, 1000.0), rng) for _ in range(500)]
    assert min(clipped) == 90 and max(clipped) == 110
    assert sample_length(LengthDist.fixed(7), rng) == 7


def test_same_seed_same_requests_and_exact_lengths() -> None:
    def plans(seed: int) -> list[list[int]]:
        pool = TokenPool(random.Random(f"{seed}/pool"), size=4096)
        sh = Shaper(
            random.Random(seed), LengthDist("uniform", 3, 300), LengthDist.fixed(5), pool_size=4096
        )
        out = []
        for _ in range(20):
            p = sh.single()
            ids = pool.token_ids(p.prompt)
            assert len(ids) == p.input_len == len(json.loads(pool.ids_json(p.prompt)))
            out.append(ids)
        return out

    assert plans(3) == plans(3)
    assert plans(3) != plans(4)


def test_unrelated_requests_never_share_a_first_token_pair() -> None:
    sh = Shaper(random.Random(0), LengthDist.fixed(10), LengthDist.fixed(1))
    heads = {sh.single().prompt.pieces[0] for _ in range(5000)}
    assert len(heads) == 5000


def test_sessions_resend_the_conversation_so_turns_share_prefixes() -> None:
    pool = TokenPool(random.Random(0), size=8192)
    sh = Shaper(
        random.Random(0),
        LengthDist.fixed(50),
        LengthDist.fixed(20),
        sessions=Sessions(turns=3, system_prompt_len=100, system_prompts=2),
        pool_size=8192,
    )
    s0, s1, s2 = sh.session(), sh.session(), sh.session()
    assert [p.turn for p in s0] == [0, 1, 2]
    ids = [pool.token_ids(p.prompt) for p in s0]
    assert [len(x) for x in ids] == [p.input_len for p in s0] == [152, 222, 292]
    assert ids[1][: len(ids[0])] == ids[0] and ids[2][: len(ids[1])] == ids[1]
    # sessions 0 and 2 share system prompt 0; session 1 has the other one
    a, b, c = (pool.token_ids(s[0].prompt) for s in (s0, s1, s2))
    assert a[:100] == c[:100] and a[:100] != b[:100]
    assert a[100:102] != c[100:102]


def test_sessions_stop_at_the_context_limit() -> None:
    sh = Shaper(
        random.Random(0),
        LengthDist.fixed(100),
        LengthDist.fixed(50),
        sessions=Sessions(turns=10),
        max_context=500,
    )
    turns = sh.session()
    assert 1 <= len(turns) < 10
    assert all(p.input_len + p.output_len < 500 for p in turns)


def test_context_limit_shrinks_single_requests() -> None:
    sh = Shaper(random.Random(0), LengthDist.fixed(10_000), LengthDist.fixed(100), max_context=4096)
    p = sh.single()
    assert p.input_len + p.output_len < 4096 and len(p.prompt) == p.input_len


def test_dataset_rows_cycle_with_prompts_and_lengths() -> None:
    rows = (DatasetRow(7, 30), DatasetRow(3, None, "hello world"))
    sh = Shaper(random.Random(0), LengthDist.fixed(1), LengthDist.fixed(1), dataset=rows)
    got = [sh.single() for _ in range(4)]
    assert sorted((p.output_len, p.prompt.text) for p in got[:2]) == [(3, "hello world"), (7, None)]
    assert [p.output_len for p in got[2:]] == [p.output_len for p in got[:2]]


def test_text_rendering_has_one_word_per_token() -> None:
    pool = TokenPool(random.Random(0), size=1024)
    sh = Shaper(random.Random(0), LengthDist.fixed(300), LengthDist.fixed(1), pool_size=1024)
    p = sh.single()
    assert len(pool.text(p.prompt).split(" ")) == 300
