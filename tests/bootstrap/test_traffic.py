"""The workload `autotune init` sketches from a log's Prefill and Decode lines
(`bootstrap.traffic`)."""

from __future__ import annotations

from autotune.bootstrap.traffic import lengths
from autotune.logparse.events import Batch


def _prefill(line: int, seqs: int, new: int, rank: str = "") -> Batch:
    return Batch("prefill", line, None, rank, new_seq=seqs, new_tokens=new, cached_tokens=0)


def _decode(line: int, running: int, tokens: int, accept: float | None = None) -> Batch:
    return Batch("decode", line, None, "", running=running, tokens=tokens, accept_len=accept)


# Eight 1,501-token prompts against an 8,192-token chunk, as SGLang's PrefillAdder takes them:
# one alone, then a batch that fills the chunk and cuts the sixth of its prompts short, then the
# cut prompt going on (counted again in `#new-seq`) with the last one; then the answers decode,
# a Decode line every 40 forwards (SGLang's `--decode-log-interval`), ten of them with all
# eight running, the mean context growing by 40 a line, and one with the last two: about 400
# tokens each.
EIGHT = [
    _prefill(1, 1, 1501),
    _prefill(2, 6, 8192),
    _prefill(3, 2, 2315),
    *(_decode(4 + i, 8, 8 * (1501 + 40 * (i + 1))) for i in range(10)),
    _decode(14, 2, 2 * (1501 + 420)),
]


def test_a_prompt_cut_at_the_chunk_is_one_prompt() -> None:
    """Counted once per line it spans, the eight read as nine of 1,334 tokens, and the answers
    as 411: 40 forwards a line of 82 running requests over the eight, and the first token each."""
    inputs, outputs, comments = lengths(EIGHT, chunk=8192, context_len=131072)
    assert inputs.mean == 1501
    assert outputs.mean == 411
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


def test_short_answers_to_long_prompts_are_the_tokens_the_forwards_made() -> None:
    """Twelve prompts of 4,000 to 20,000 tokens, 120-token answers: the running requests' mean
    context is the prompts' (skewed) mean plus 60, too small a difference to read the answer
    from; the Decode lines' forwards made 1,080 tokens for the twelve."""
    prompts = [4000, 5000, 6000, 6000, 7000, 8000, 9000, 10000, 12000, 15000, 18000, 20000]
    lines = [_prefill(i, 1, n) for i, n in enumerate(prompts)]
    ctx = sorted(prompts)[len(prompts) // 2] + 60  # what the middle request holds mid-answer
    lines += [_decode(20 + i, n, n * ctx) for i, n in enumerate((12, 12, 3))]
    _, outputs, comments = lengths(lines, chunk=None, context_len=None)
    assert outputs.mean == 91
    assert any("1,080 tokens the decode forwards of 3 Decode lines made" in c for c in comments)


def test_a_draft_makes_its_accept_length_a_forward_and_the_interval_is_the_servers() -> None:
    lines = [_prefill(i, 1, 2000) for i in range(8)]
    lines += [_decode(10 + i, n, n * 2300, accept=2.5) for i, n in enumerate((8, 8, 2))]
    _, drafted, _ = lengths(lines, chunk=None, context_len=None)
    assert drafted.mean == 226  # 40 forwards × 18 running × 2.5 tokens over 8
    _, often, comments = lengths(lines, chunk=None, context_len=None, log_interval=10)
    assert often.mean == 57
    assert any("10 forwards a line" in c for c in comments)


def test_fewer_than_three_decode_lines_read_the_context() -> None:
    lines = [_prefill(i, 1, 1000) for i in range(4)]
    lines += [_decode(10 + i, 4, 4 * 1150) for i in range(2)]
    _, outputs, comments = lengths(lines, chunk=None, context_len=None)
    assert outputs.mean == 300
    assert any("prompt + half the answer" in c for c in comments)


def test_decode_lines_missing_between_those_shown_read_the_context() -> None:
    """An excerpt: three Decode lines a minute apart at 130 tokens/s made about 15,600 tokens,
    not the 600 that the last two lines' 40 forwards count, so the count would read the answers
    many times short."""
    lines = [_prefill(i, 1, 1500) for i in range(12)]
    lines += [
        Batch("decode", 20 + i, 60.0 * i, "", running=n, tokens=n * 1800, gen_throughput=130.0)
        for i, n in enumerate((12, 12, 3))
    ]
    _, outputs, comments = lengths(lines, chunk=None, context_len=None)
    assert outputs.mean == 600
    assert any("prompt + half the answer" in c for c in comments)
    # the same lines a second apart are the whole story
    whole = [b._replace(time=float(b.line_no)) if b.phase == "decode" else b for b in lines]
    _, counted, _ = lengths(whole, chunk=None, context_len=None)
    assert counted.mean == 91


def test_an_excerpt_that_begins_mid_serving_reads_the_context() -> None:
    """The first serving line finds 45 requests running that no Prefill line admitted: the
    tokens made for them are not the three admitted requests' answers."""
    lines = [Batch("prefill", 1, None, "", new_seq=3, new_tokens=6000, cached_tokens=0, running=45)]
    lines += [_prefill(2 + i, 1, 2000) for i in range(2)]
    lines += [_decode(10 + i, 48, 48 * 2300) for i in range(3)]
    _, outputs, comments = lengths(lines, chunk=None, context_len=None)
    assert outputs.mean == 600
    assert any("prompt + half the answer" in c for c in comments)
