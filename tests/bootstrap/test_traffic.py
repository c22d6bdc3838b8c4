"""The workload `autotune init` sketches from a log's Prefill and Decode lines
(`bootstrap.traffic`)."""

from __future__ import annotations

from autotune.bootstrap.traffic import lengths
from autotune.logparse.events import Batch


def _prefill(line: int, seqs: int, new: int, rank: str = "") -> Batch:
    return Batch("prefill", line, None, rank, new_seq=seqs, new_tokens=new, cached_tokens=0)


def _decode(line: int, running: int, tokens: int) -> Batch:
    return Batch("decode", line, None, "", running=running, tokens=tokens)


# Eight 1,501-token prompts against an 8,192-token chunk, as SGLang's PrefillAdder takes them:
# one alone, then a batch that fills the chunk and cuts the sixth of its prompts short, then the
# cut prompt going on (counted again in `#new-seq`) with the last one; then the answers decode
# (about 400 tokens each: the running requests' mean context is the prompt + half of it).
EIGHT = [
    _prefill(1, 1, 1501),
    _prefill(2, 6, 8192),
    _prefill(3, 2, 2315),
    *(_decode(4 + i, 8, 8 * (1501 + 200)) for i in range(5)),
]


def test_a_prompt_cut_at_the_chunk_is_one_prompt() -> None:
    """Counted once per line it spans, the eight read as nine of 1,334 tokens, and the answers
    as 762 (twice the context over a prompt read short)."""
    inputs, outputs, comments = lengths(EIGHT, chunk=8192, context_len=131072)
    assert inputs.mean == 1501
    assert 380 <= outputs.mean <= 420
    assert any("8 requests" in c and "counted once" in c for c in comments)


def test_prompts_of_many_lengths_keep_their_spread_across_a_cut() -> None:
    """Sixteen prompts of 300 to 900 tokens in one burst: fourteen and the start of the fifteenth
    fill the 8,192-token chunk, the rest of it and the last come next. Read as one run of equal
    shares they came out as a fixed length."""
    burst = [_prefill(1, 15, 8192), _prefill(2, 2, 1408)]
    inputs, _, comments = lengths(burst, chunk=8192, context_len=131072)
    assert inputs.mean == 600 and inputs.std > 0 and inputs.low < inputs.high
    assert 'dist = "lognormal"' in inputs.toml()
    assert any("16 requests" in c for c in comments)


def test_the_cut_is_followed_on_its_own_rank() -> None:
    """Each DP group's TP0 prints its own Prefill lines: a cut on one rank goes on on that rank."""
    lines = [
        _prefill(1, 6, 8192, "DP0 TP0"),
        _prefill(2, 3, 4503, "DP1 TP0"),
        _prefill(3, 2, 2315, "DP0 TP0"),
    ]
    inputs, _, _ = lengths(lines, chunk=8192, context_len=None)
    assert inputs.mean == 1501  # 7 prompts on DP0, 3 on DP1


def test_without_the_chunk_the_lines_are_read_as_they_are() -> None:
    inputs, _, comments = lengths(EIGHT, chunk=None, context_len=None)
    assert inputs.mean == round(12008 / 9)
    assert any("counts twice" in c for c in comments)
