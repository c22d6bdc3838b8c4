"""Which requests to send: seeded prompts and lengths, rendered cheaply even at 128K tokens.

Prompts are random token ids (native /generate and /v1/completions take `input_ids` / token
arrays, so counts are exact without a tokenizer) or, for chat, one short English word per token
(approximate; the server's reported prompt_tokens is what gets recorded). A prompt is a list of
spans into one seeded pool of ids, so rendering a 128K-token prompt is one `join`, not 128K
random draws. Every request starts with its own two-token head, so unrelated requests never share
a cached prefix; sessions deliberately do: turn k resends turns 0..k-1, after a system prompt
that several sessions share.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from dataclasses import KW_ONLY, dataclass, field

from autotune.config.workload import BurstOrder, DatasetRow, LengthDist, Sessions

POOL_SIZE = 1 << 17
TOKEN_LOW, TOKEN_HIGH = 1000, 30000  # ordinary vocabulary ids in any large tokenizer
HEAD_BASE = 100  # heads use ids HEAD_BASE..HEAD_BASE+HEAD_SPAN-1, disjoint from the pool
HEAD_SPAN = 900
_WORDS_TEXT = (
    "the of and to in is was for on are with as at be by this had not but from or have an they "
    "which one you were all her she there would their we him been has when who will no more if "
    "out so said what up its about than into them can only other new some could time these two "
    "may then do first any my now such like our over man me even most made after also did many "
    "before must through back years where much your way well down should because each just those "
    "people how too little state good very make world still own see men work long get here "
    "between both life being under never day same another know while last might us great old "
    "year off come since against go came right used take three"
)
_WORDS = tuple(_WORDS_TEXT.split(" "))


def sample_length(dist: LengthDist, rng: random.Random) -> int:
    """One draw from `dist`, rounded and clipped to [low, high]."""
    if dist.kind == "fixed":
        return dist.low
    if dist.kind == "uniform":
        return rng.randint(dist.low, dist.high)
    if dist.kind == "normal":
        x = rng.gauss(dist.mean, dist.std)
    else:
        sigma2 = math.log1p((dist.std / dist.mean) ** 2)
        x = rng.lognormvariate(math.log(dist.mean) - sigma2 / 2, math.sqrt(sigma2))
    return min(dist.high, max(dist.low, round(x)))


@dataclass(frozen=True)
class Span:
    """`length` ids of the pool starting at `offset`, wrapping around."""

    offset: int
    length: int


@dataclass(frozen=True)
class Prompt:
    """Token pieces (explicit ids or pool spans) or a literal text from a dataset."""

    pieces: tuple[tuple[int, ...] | Span, ...] = ()
    text: str | None = None

    def __len__(self) -> int:
        return sum(p.length if isinstance(p, Span) else len(p) for p in self.pieces)


@dataclass(frozen=True)
class RequestPlan:
    """One request to send: its prompt, intended input and output token counts, and session."""

    prompt: Prompt
    input_len: int
    output_len: int
    session: int | None = None
    turn: int = 0


class TokenPool:
    """Seeded random ids, with their decimal and word renderings precomputed."""

    def __init__(self, rng: random.Random, size: int = POOL_SIZE) -> None:
        self.ids = rng.choices(range(TOKEN_LOW, TOKEN_HIGH), k=size)
        self.id_strs = [str(i) for i in self.ids]
        self.words = [_WORDS[i % len(_WORDS)] for i in self.ids]

    def _slices(self, span: Span) -> Iterator[tuple[int, int]]:
        size = len(self.ids)
        start, left = span.offset % size, span.length
        while left > 0:
            n = min(left, size - start)
            yield start, start + n
            left -= n
            start = 0

    def ids_json(self, prompt: Prompt) -> str:
        """The prompt as a JSON array of ids, e.g. `[101,4021,...]`."""
        parts: list[str] = []
        for piece in prompt.pieces:
            if isinstance(piece, Span):
                parts.extend(",".join(self.id_strs[a:b]) for a, b in self._slices(piece))
            elif piece:
                parts.append(",".join(map(str, piece)))
        return "[" + ",".join(parts) + "]"

    def token_ids(self, prompt: Prompt) -> list[int]:
        """The ids `prompt` stands for, spans resolved into the pool: what the server is sent as
        `input_ids`."""
        out: list[int] = []
        for piece in prompt.pieces:
            if isinstance(piece, Span):
                for a, b in self._slices(piece):
                    out.extend(self.ids[a:b])
            else:
                out.extend(piece)
        return out

    def text(self, prompt: Prompt) -> str:
        """The prompt as words, one per token (heads become words too)."""
        if prompt.text is not None:
            return prompt.text
        parts: list[str] = []
        for piece in prompt.pieces:
            if isinstance(piece, Span):
                parts.extend(" ".join(self.words[a:b]) for a, b in self._slices(piece))
            elif piece:
                parts.append(" ".join(_WORDS[i % len(_WORDS)] for i in piece))
        return " ".join(parts)


@dataclass(eq=False)
class Shaper:
    """Makes the request sequence of one phase from its own seeded generator.

    The sequence depends only on the seed and the order of calls, never on timing: the n-th
    request of a phase is the same on every run with the same spec. It owns the phase's
    generator and lengths as given, and the counters the sequence advances (a shaper is a
    stream, so two are equal only when they are the same one).
    """

    rng: random.Random
    input_len: LengthDist
    output_len: LengthDist
    _: KW_ONLY
    dataset: tuple[DatasetRow, ...] = ()
    sessions: Sessions | None = None
    max_context: int | None = None
    pool_size: int = POOL_SIZE
    _count: int = field(init=False, repr=False, default=0)
    """Heads handed out so far."""
    _salt: int = field(init=False, repr=False)
    """Where this shaper's heads start, drawn first from `rng`."""
    _row: int = field(init=False, repr=False)
    """The next dataset row (starts at a random row, drawn from `rng` after the salt)."""
    _session: int = field(init=False, repr=False, default=0)
    """Sessions handed out so far."""

    def __post_init__(self) -> None:
        self._salt = self.rng.randrange(HEAD_SPAN * HEAD_SPAN)
        self._row = self.rng.randrange(len(self.dataset)) if self.dataset else 0

    def _head(self) -> tuple[int, ...]:
        """Two ids unique among this shaper's first HEAD_SPAN² requests."""
        n = self._count + self._salt
        self._count += 1
        return (HEAD_BASE + n % HEAD_SPAN, HEAD_BASE + (n // HEAD_SPAN) % HEAD_SPAN)

    def _span(self, length: int) -> Span:
        return Span(self.rng.randrange(self.pool_size), length)

    def _lengths(self) -> tuple[int, int, str | None]:
        if self.dataset:
            row = self.dataset[self._row % len(self.dataset)]
            self._row += 1
            return row.input_len or 0, row.output_len, row.prompt
        return (
            sample_length(self.input_len, self.rng),
            sample_length(self.output_len, self.rng),
            None,
        )

    def _fit(self, input_len: int, output_len: int) -> tuple[int, int]:
        """Shrink the input so input + output fits the context (as datasets are filtered)."""
        if self.max_context is None:
            return input_len, output_len
        output_len = min(output_len, max(1, self.max_context // 2))
        return min(input_len, max(2, self.max_context - output_len - 1)), output_len

    def single(self) -> RequestPlan:
        """An independent request with a unique head."""
        input_len, output_len, text = self._lengths()
        if text is not None:
            self._count += 1
            return RequestPlan(Prompt(text=text), input_len, output_len)
        input_len, output_len = self._fit(max(input_len, 2), output_len)
        prompt = Prompt((self._head(), self._span(input_len - 2)))
        return RequestPlan(prompt, input_len, output_len)

    def fixed(self, input_len: int, output_len: int) -> RequestPlan:
        """A request of exact lengths (the stress phase), unique head, no dataset."""
        input_len, output_len = self._fit(max(input_len, 2), output_len)
        return RequestPlan(Prompt((self._head(), self._span(input_len - 2))), input_len, output_len)

    def session(self) -> list[RequestPlan]:
        """The turns of the next session, or one single request when sessions are off.

        Turn k's prompt is the system prompt, then every earlier turn's user input and a stand-in
        for the answer (output_len pool ids), then the new input; turns that would not fit the
        context are dropped.
        """
        if self.sessions is None:
            return [self.single()]
        s = self.sessions
        sid = self._session
        self._session += 1
        group = sid % s.system_prompts
        pieces: list[tuple[int, ...] | Span] = []
        if s.system_prompt_len > 0:
            # Shared by every session of the group: a fixed head and span derived from the group.
            pieces.append(
                (HEAD_BASE + group % HEAD_SPAN, HEAD_BASE + (group // HEAD_SPAN) % HEAD_SPAN)
            )
            pieces.append(Span(group * 7919 % self.pool_size, max(0, s.system_prompt_len - 2)))
        pieces.append(self._head())
        plans: list[RequestPlan] = []
        for turn in range(s.turns):
            new_len, output_len, _ = self._lengths()
            pieces.append(self._span(max(1, new_len)))
            prompt = Prompt(tuple(pieces))
            total = len(prompt)
            if self.max_context is not None and total + output_len >= self.max_context:
                break
            plans.append(RequestPlan(prompt, total, output_len, session=sid, turn=turn))
            pieces.append(self._span(output_len))
        return plans or [self.single()]


def ordered_burst(
    shaper: Shaper,
    requests: int,
    input_len: int,
    output_len: int,
    *,
    order: BurstOrder = BurstOrder.SAME,
    short_len: int | None = None,
    seed: int = 0,
) -> list[list[RequestPlan]]:
    """One stress round's prompts in the groups they are sent in, each group at once.

    `same`: one group of `requests` prompts of `input_len` tokens (the study file's stress phase,
    drawn exactly as before). Otherwise half the prompts (at least one) are `input_len` tokens
    and the rest `short_len`: `longest-first` one group, the long ones first; `random` one group
    shuffled by `seed`; `shortest-first` two groups, the short ones, then the long ones."""
    if order is BurstOrder.SAME or short_len is None or requests < 2:
        return [[shaper.fixed(input_len, output_len) for _ in range(requests)]]
    n_long = max(1, requests // 2)
    longs = [shaper.fixed(input_len, output_len) for _ in range(n_long)]
    shorts = [shaper.fixed(short_len, output_len) for _ in range(requests - n_long)]
    if order is BurstOrder.LONGEST_FIRST:
        return [[*longs, *shorts]]
    if order is BurstOrder.SHORTEST_FIRST:
        return [shorts, longs]
    mixed = [*longs, *shorts]
    random.Random(f"order/{seed}").shuffle(mixed)
    return [mixed]
