"""A workload sketched from a log's Prefill and Decode lines.

* concurrency: the most requests in the server at one line, running, being prefilled and queued
  (what the clients asked for at the busiest moment), raised to the most request slots the
  search tries and, where the pool holds a known number of requests at the sketched length,
  cut to the more of the two: clients past both would only queue;
* prompt lengths: each Prefill line's tokens per new sequence (`#new-token` + `#cached-token`
  over `#new-seq`). SGLang cuts the last prompt of a batch that fills the prefill chunk and
  goes on with it first in the rank's next batch, where `#new-seq` counts it again
  (`PrefillAdder`: the cut request stays in `can_run_list`); after a line whose new tokens fill
  the chunk, the next line's first sequence is the same prompt, counted once;
* answer lengths: a Decode line closes `--decode-log-interval` decode forwards, each adding
  `accept len` tokens (1 without a draft) to each of its `#running-req`, so the lines add up to
  the answer tokens generated, shared among the requests the Prefill lines admitted. (A Decode
  line's `#token` over `#running-req`, about prompt + half the answer, reads the answer only as
  twice a small difference of two large numbers where answers are much shorter than prompts: it
  is the fallback with fewer than three Decode lines, where their `gen throughput` and times
  show lines missing between them, or where the Prefill lines do not account for the requests
  the Decode lines run.)
* the prefix cache's share of prompt tokens says whether the traffic reuses prefixes.

Without serving lines it is a generic chat load around the request slots, and says so. Either
way it is a sketch: the comments ask for the operator's own traffic.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from autotune.logparse.events import Batch

MAX_CONCURRENCY = 4096
"""The most clients a sketched workload runs at once, and so the most request slots a study
`init` writes searches beyond the current value (`bootstrap.sizing`)."""
DECODE_LOG_INTERVAL = 40
"""SGLang's default `--decode-log-interval`: a Decode line every this many decode forwards."""


@dataclass(frozen=True)
class Lengths:
    """A length distribution for the workload: mean, spread and the bounds it is clipped to, in
    tokens."""

    mean: int
    std: int
    low: int
    high: int

    def toml(self) -> str:
        """The `[workload]` inline table for these lengths: lognormal, or fixed when there is no
        spread."""
        if self.std <= 0 or self.low >= self.high:
            return f'{{ dist = "fixed", value = {self.mean} }}'
        return (
            f'{{ dist = "lognormal", mean = {self.mean}, std = {self.std}, '
            f"min = {self.low}, max = {self.high} }}"
        )


@dataclass(frozen=True)
class Traffic:
    """The sketched workload: client concurrency, prompt and answer lengths, and the comments saying
    what they were read from."""

    concurrency: int
    input_len: Lengths
    output_len: Lengths
    comments: tuple[str, ...]


CHUNK_SLACK = 64
"""Tokens short of the prefill chunk at which a Prefill line still counts as having filled it:
a cut is rounded down to a hybrid model's kernel grid (`PrefillAdder.floor_chunked_tokens`)."""


def _prompt_sizes(
    batches: Sequence[Batch], chunk: int | None = None
) -> tuple[list[float], float | None]:
    """Each prompt's length as the Prefill lines show it, a line's tokens shared among its
    sequences; a prompt cut at the chunk is one prompt of its pieces' shares (its lines keep
    their own spread), and the prefix cache's share of prompt tokens."""
    sizes: list[float] = []
    new = cached = 0
    cut: dict[str, float] = {}  # by rank: the share so far of a prompt cut at the chunk
    for b in batches:
        if b.phase != "prefill" or not b.new_seq or b.new_tokens is None:
            continue
        line = [(b.new_tokens + (b.cached_tokens or 0)) / b.new_seq] * b.new_seq
        new += b.new_tokens
        cached += b.cached_tokens or 0
        line[0] += cut.pop(b.rank, 0.0)  # its first sequence: the cut prompt going on
        if chunk and chunk > CHUNK_SLACK and b.new_tokens >= chunk - CHUNK_SLACK:
            cut[b.rank] = line.pop()  # its last prompt goes on in the rank's next line
        sizes += line
    sizes += cut.values()  # the log ends inside a cut prompt
    share = cached / (new + cached) if new + cached else None
    return sizes, share


def _contexts(batches: Sequence[Batch]) -> list[float]:
    return [
        b.tokens / b.running
        for b in batches
        if b.phase == "decode" and b.running and b.tokens is not None and b.tokens > 0
    ]


def _busiest(batches: Sequence[Batch]) -> int:
    """The most requests in the server at one line: running + queued (+ those a Prefill line
    admits, which are counted in neither)."""
    most = 0
    for b in batches:
        here = (b.running or 0) + (b.queued or 0)
        if b.phase == "prefill":
            here += b.new_seq or 0
        most = max(most, here)
    return most


def _concurrency(
    batches: Sequence[Batch], peak_running: int | None, slots: int | None, comments: list[str]
) -> int:
    """The clients to run: the busiest moment the log shows, else enough to fill the slots."""
    busiest = _busiest(batches)
    if busiest:
        concurrency = min(busiest, MAX_CONCURRENCY)
        comments.append(
            f"concurrency {concurrency}: the most requests the log shows in the server at once "
            f"(running, being prefilled and queued; at most {peak_running or 0} running)"
        )
        return concurrency
    concurrency = min(max(slots or 32, 2), MAX_CONCURRENCY)
    comments.append(
        f"concurrency {concurrency}: no serving lines in the log; enough clients to fill "
        "the request slots"
    )
    return concurrency


def _input_lengths(sizes: Sequence[float], chunk: int | None, comments: list[str]) -> Lengths:
    """The prompt lengths from the Prefill lines' sizes, else a generic chat mix."""
    if len(sizes) < 3:
        comments.append("prompts: not in the log; a generic chat mix")
        return Lengths(mean=2000, std=1500, low=100, high=16000)
    mean = statistics.fmean(sizes)
    inputs = Lengths(
        mean=max(round(mean), 1),
        std=round(statistics.pstdev(sizes)),
        low=max(int(min(sizes)), 1),
        high=max(int(max(sizes)), 1),
    )
    comments.append(
        f"prompts: {len(sizes)} requests in the Prefill lines, {inputs.mean:,} tokens each "
        f"on average ({inputs.low:,} to {inputs.high:,} per line)"
        + (
            f"; a prompt cut at the {chunk:,}-token prefill chunk counted once"
            if chunk
            else "; the prefill chunk is not in the log, so a prompt cut at it counts twice"
        )
    )
    return inputs


def _generated(batches: Sequence[Batch], interval: int) -> tuple[float, int] | None:
    """The answer tokens the decode forwards made over the log, and the Decode lines that show
    them: SGLang prints a Decode line every `interval` decode forwards (`--decode-log-interval`;
    0.5.23 `metrics_reporter.report_decode_stats`), each forward adds `accept len` tokens to every
    running request (1 without a draft: the line's mean of the round's generated tokens per
    request), so a line stands for `interval × #running-req × accept len` tokens. None below three
    lines."""
    lines = [b for b in batches if b.phase == "decode" and b.running]
    if len(lines) < 3 or _gaps(lines, interval) or _unadmitted(batches):
        return None
    return sum(_line_tokens(b, interval) for b in lines), len(lines)


def _line_tokens(b: Batch, interval: int) -> float:
    """The answer tokens one Decode line stands for: `interval` forwards of its running requests,
    `accept len` tokens each (1 without a draft)."""
    return interval * (b.running or 0) * (b.accept_len or 1.0)


def _unadmitted(batches: Sequence[Batch]) -> bool:
    """Whether the Prefill lines leave out requests the answers were made for: a rank's first
    serving line finds requests already running (an excerpt that begins mid-serving), a Decode
    line runs more than the rank's Prefill lines admitted (lines dropped), or the requests still
    running at the last Decode line are more than a third of those admitted (a log too short for
    the answers it cut off to average out)."""
    admitted: dict[str, int] = {}
    last = 0
    for b in batches:
        if b.rank not in admitted:
            admitted[b.rank] = 0
            if (b.running or 0) > 0:
                return True
        if b.phase == "prefill":
            admitted[b.rank] += b.new_seq or 0
        elif (b.running or 0) > admitted[b.rank]:
            return True
        else:
            last = b.running or 0
    return 3 * last > sum(admitted.values())


def _gaps(lines: Sequence[Batch], interval: int) -> bool:
    """Whether Decode lines are missing between the ones the log shows (an excerpt, a collector
    that drops lines): each line's `gen throughput` is the tokens made since the rank's last
    Decode line over the time since it, so over a rank's lines it adds up, with their times, to
    the tokens made, which lines missing in between leave far beyond what the shown lines count
    (more than half again, past a second of the fastest line's rounding)."""
    made = counted = 0.0
    fastest = 0.0
    last: dict[str, Batch] = {}
    for b in lines:
        before = last.get(b.rank)
        last[b.rank] = b
        if before is None or b.time is None or before.time is None or b.gen_throughput is None:
            continue
        made += b.gen_throughput * max(b.time - before.time, 0.0)
        counted += _line_tokens(b, interval)
        fastest = max(fastest, b.gen_throughput)
    return made > 1.5 * counted + 2.0 * fastest


def _output_lengths(
    batches: Sequence[Batch],
    sizes: Sequence[float],
    inputs: Lengths,
    comments: list[str],
    interval: int = DECODE_LOG_INTERVAL,
) -> Lengths:
    """The answer lengths: the tokens the Decode lines' forwards made over the requests the
    Prefill lines admitted (each answer's first token comes with its prefill); where fewer than
    three Decode lines show, lines are missing between them (`_gaps`) or the Prefill lines miss
    requests (`_unadmitted`), twice the Decode lines' mean context over the prompt; else 512
    tokens on average."""
    generated = _generated(batches, interval)
    if generated is not None and len(sizes) >= 3:
        made, lines = generated
        mean_out = round(min(made / len(sizes) + 1, 16384))
        comments.append(
            f"answers: about {mean_out:,} tokens, the {made:,.0f} tokens the decode forwards of "
            f"{lines} Decode lines made ({interval} forwards a line, --decode-log-interval) over "
            f"the {len(sizes)} requests the Prefill lines admitted"
        )
        return _answers(mean_out)
    contexts = _contexts(batches)
    if contexts and len(sizes) >= 3:
        answer = 2.0 * (statistics.median(contexts) - inputs.mean)
        if answer >= 16:
            mean_out = round(min(answer, 16384))
            comments.append(
                f"answers: about {mean_out:,} tokens, from the Decode lines' tokens per running "
                "request (prompt + half the answer)"
            )
            return _answers(mean_out)
    comments.append("answers: the log does not show their length; 512 tokens on average")
    return Lengths(mean=512, std=128, low=64, high=2048)


def _answers(mean_out: int) -> Lengths:
    """Answers of `mean_out` tokens on average, a quarter of that spread."""
    return Lengths(
        mean=mean_out, std=max(mean_out // 4, 1), low=max(mean_out // 4, 1), high=mean_out * 2
    )


def _fit_context(inputs: Lengths, outputs: Lengths, context_len: int | None) -> Lengths:
    """The prompt lengths cut so the longest prompt and answer fit the context."""
    if context_len and inputs.high + outputs.high > context_len:
        high = max(context_len - outputs.high, 1)
        return Lengths(
            inputs.mean if inputs.mean <= high else high, inputs.std, min(inputs.low, high), high
        )
    return inputs


def _fill(
    concurrency: int, most_slots: int, holds: int | None, busiest: int, comments: list[str]
) -> int:
    """The clients, so the most request slots searched can fill and no more than the pool
    holds (or those slots) wait: queued clients add no memory, only latency."""
    if holds is not None:
        top = max(most_slots, holds)
        if concurrency > top:
            comments.append(
                f"cut to {top} clients: the pool holds {holds} requests of the sketched length "
                f"and the search tries at most {most_slots} slots; "
                + (f"the log's other {busiest - top}" if busiest > top else "more")
                + " would only queue"
            )
            return top
    if most_slots > concurrency:
        concurrency = min(most_slots, MAX_CONCURRENCY)
        comments.append(
            f"raised to {concurrency} clients, the most request slots the search tries, so the "
            "slots it tries can fill and their throughput differ"
        )
    return concurrency


def lengths(
    batches: Sequence[Batch],
    *,
    chunk: int | None,
    context_len: int | None,
    log_interval: int = DECODE_LOG_INTERVAL,
) -> tuple[Lengths, Lengths, list[str]]:
    """The prompt and answer lengths the serving lines show (else a generic chat mix), cut to
    the context, and the comments saying where they came from; `log_interval` is the server's
    `--decode-log-interval`."""
    sizes, _ = _prompt_sizes(batches, chunk)
    comments: list[str] = []
    inputs = _input_lengths(sizes, chunk, comments)
    outputs = _output_lengths(batches, sizes, inputs, comments, log_interval)
    return _fit_context(inputs, outputs, context_len), outputs, comments


def sketch(
    batches: Sequence[Batch],
    *,
    peak_running: int | None,
    slots: int | None,
    chunk: int | None,
    context_len: int | None,
    most_slots: int = 0,
    holds: int | None = None,
    log_interval: int = DECODE_LOG_INTERVAL,
) -> Traffic:
    """The workload sketched from the log's serving lines; its clients can fill `most_slots`
    request slots (the most the search tries), so throughput can tell the slot counts apart,
    and, where `holds` (the requests the pool holds at the sketched length) is known, no more
    clients wait than that or those slots."""
    _, cached_share = _prompt_sizes(batches)
    comments: list[str] = []
    concurrency = _concurrency(batches, peak_running, slots if holds is None else None, comments)
    concurrency = _fill(concurrency, most_slots, holds, _busiest(batches), comments)
    inputs, outputs, said = lengths(
        batches, chunk=chunk, context_len=context_len, log_interval=log_interval
    )
    comments += said
    if cached_share is not None and cached_share >= 0.2:
        comments.append(
            f"{cached_share:.0%} of prompt tokens came from the prefix cache: the traffic "
            "reuses prefixes (multi-turn sessions, shared system prompts); [workload.sessions] "
            "models that (docs/study-file.md)"
        )
    return Traffic(concurrency, inputs, outputs, tuple(comments))
