"""The worst cases `autotune confirm` runs after the soak: where the winner is weakest (pure).

A trial meets the transient peak only as its workload happens to provoke it. SGLang's prefill
forward holds the activations of up to `chunked_prefill_size` new tokens at once (the
`PrefillAdder` of `sglang/srt/managers/schedule_policy.py` spends `rem_chunk_tokens`, the chunk,
on the requests it admits, and splits a longer prompt into chunks, `Scheduler.
_get_new_batch_prefill_raw` in `managers/scheduler.py`); its decode batch holds up to the
effective max running requests; the live context (the KV the running requests hold) rises with
the longest request; and the waiting queue is first-come-first-served by default
(`SchedulePolicy.calc_priority`, `schedule_policy = "fcfs"`), so the order prompts arrive in
decides which of them share a prefill batch and whether a long prefill meets a running batch.

`case_plan` turns a study (its search space, fixed flags and workload) and the ledger of a
launch of the winner (what SGLang actually ran: its effective chunk, context length, max running
requests and KV pool) into one stress burst per case:

* `largest-chunk`: prompts one full chunk long, the largest chunk the study allows (the highest
  `chunked_prefill_size` in its space, else the fixed or the effective one);
* `longest-context`: the longest request the workload can send (its largest input plus largest
  output, capped by the longest request the server serves: its effective context length, or its
  KV pool where that is smaller, `longest_request`);
* `max-running`: the effective max running requests at once, each prompt as long as lets them
  all fit in the KV pool;
* `longest-first`, `shortest-first`, `random-1`, `random-2`: the longest and the shortest prompt
  of the workload mixed, in each arrival order (`config.workload.BurstOrder`).

Every burst is cut to one more request than the KV pool holds at once (as the driver's
`stress_plan` cuts a stress phase), and its outputs to `CASE_MAX_OUTPUT` tokens (the peak follows
the batch, not how long it decodes; the longest-context case keeps its whole length by moving the
difference to its input).

`run_order` puts the cases in the order a confirm runs them, on the soak's own launch
(`autotune.review.confirm.run_confirm`): from the least to the most likely to fail, by each
case's planned peak (`Case.planned_peak`), so a case that kills the server comes as late as its
size says it would, and only the cases after it need a fresh launch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from autotune.config.schema import CHUNK, Choices, Fixed, FloatRange, IntRange, StudyConfig
from autotune.config.workload import BurstOrder, LengthDist, Poisson, Steady, Stress, Warmup
from autotune.logparse.ledger import Ledger

CASE_MAX_OUTPUT = 256
"""The most tokens a worst case's request generates."""
DEFAULT_CHUNK = 8192
"""The chunk SGLang's prefill takes when neither the study nor the ledger names one."""
DEFAULT_REQUESTS = 32
"""Requests at once when the ledger shows no max running requests."""
ORDERS = (
    ("longest-first", BurstOrder.LONGEST_FIRST, 0),
    ("shortest-first", BurstOrder.SHORTEST_FIRST, 0),
    ("random-1", BurstOrder.RANDOM, 1),
    ("random-2", BurstOrder.RANDOM, 2),
)
"""The arrival-order cases: name, order, seed."""
CASE_NAMES = ("largest-chunk", "longest-context", "max-running", *(n for n, _, _ in ORDERS))


@dataclass(frozen=True)
class Case:
    """One worst case: its name, the burst it sends (a one-round `Stress` phase) and why."""

    name: str
    burst: Stress
    why: str
    forward_tokens: int = 0
    """The prompt tokens its largest prefill forward takes: the prompts of the requests that run
    at once, at most the chunk the server prefills at a time (SGLang's `PrefillAdder` admits new
    tokens up to `rem_chunk_tokens`, `managers/schedule_policy.py`)."""
    held_tokens: int = 0
    """The live context its requests that run at once ask the KV pool for (at most the effective
    max running requests of them, each its whole input and output); a burst cut to one more
    request than the pool holds asks for more than the pool, and the more it asks, the more
    the server retracts and queues."""

    @property
    def planned_peak(self) -> tuple[int, int, int]:
        """What the plan says of the case's peak, compared in this order: the largest prefill
        forward (its activations are the transient above SGLang's preallocated KV pool), the live
        context the running requests hold, the requests at once."""
        return (self.forward_tokens, self.held_tokens, self.burst.requests or 0)

    def sent(self) -> str:
        """What the case sends, in words: `48 × 8,192+64 tokens at once`, or for an order
        `8 × (long 12,000 / short 100)+64 tokens, longest-first`."""
        b = self.burst
        if b.order is BurstOrder.SAME or b.short_len is None:
            return f"{b.requests} × {b.input_len or 0:,}+{b.output_len} tokens at once"
        return (
            f"{b.requests} × (long {b.input_len or 0:,} / short {b.short_len:,})+{b.output_len} "
            f"tokens, {b.order}"
        )


@dataclass(frozen=True)
class Lengths:
    """The shortest input, the longest input and the longest output the workload can send."""

    min_input: int
    max_input: int
    max_output: int


def workload_lengths(cfg: StudyConfig) -> Lengths:
    """The extremes of every length the study's workload draws: its own and its phases'
    distributions, the stress phases' prompts, a dataset's rows, and a session's whole
    conversation (the system prompt and every turn's input and output)."""
    w = cfg.workload
    dists_in: list[LengthDist] = [w.input_len]
    dists_out: list[LengthDist] = [w.output_len]
    fixed_in: list[int] = []
    fixed_out: list[int] = []
    for ph in w.phases:
        if isinstance(ph, Warmup | Steady | Poisson):
            dists_in += [ph.input_len] if ph.input_len is not None else []
            dists_out += [ph.output_len] if ph.output_len is not None else []
        elif isinstance(ph, Stress):
            fixed_in += [ph.input_len] if ph.input_len is not None else []
            fixed_out.append(ph.output_len)
    rows_in = [r.input_len for r in w.dataset_rows if r.input_len is not None]
    rows_out = [r.output_len for r in w.dataset_rows]
    if w.dataset_rows:
        dists_in, dists_out = dists_in[1:], dists_out[1:]
    lows = [d.low for d in dists_in] + rows_in
    highs = [d.high for d in dists_in] + rows_in + fixed_in
    outs = [d.high for d in dists_out] + rows_out + fixed_out
    max_in = max(highs, default=w.input_len.high)
    max_out = max(outs, default=w.output_len.high)
    if w.sessions is not None:
        s = w.sessions
        max_in = max(max_in, s.system_prompt_len + s.turns * max_in + (s.turns - 1) * max_out)
    return Lengths(max(2, min(lows, default=2)), max_in, max_out)


def largest_chunk(cfg: StudyConfig, ledger: Ledger) -> int:
    """The largest prefill chunk the study allows: the highest `chunked_prefill_size` its space
    searches, else the fixed one, else the one the server ran (the ledger), else SGLang's
    default."""
    found: list[int] = []
    for p in cfg.search.params:
        if p.name != CHUNK:
            continue
        if isinstance(p, FloatRange | IntRange):
            found.append(int(p.high))
        elif isinstance(p, Choices):
            found += [int(v) for v in p.values if isinstance(v, int | float)]
        elif isinstance(p, Fixed) and isinstance(p.value, int | float):
            found.append(int(p.value))
    for name, value in cfg.server.flags:
        if name.replace("-", "_") == CHUNK and isinstance(value, int | float):
            found.append(int(value))
    found = [c for c in found if c > 0]
    if found:
        return max(found)
    return ledger.chunked_prefill_size or DEFAULT_CHUNK


def longest_request(ledger: Ledger) -> int | None:
    """The longest request the server serves (input + output): SGLang's `max_req_len`,
    `min(context_len − 1, KV pool − 1)` (`TpModelWorker` in `sglang/srt/managers/tp_worker.py`;
    a longer one is refused), less the 5 tokens it keeps off the input (`max_req_input_len`);
    None when the ledger shows neither."""
    known = [n - 1 for n in (ledger.context_len, ledger.max_total_num_tokens) if n]
    return max(2, min(known) - 5) if known else None


def _fit(requests: int, tokens: int, pool: int | None) -> int:
    """`requests`, cut to one more than the KV pool holds at once (at least one)."""
    if pool:
        requests = min(requests, pool // max(tokens, 1) + 1)
    return max(1, requests)


def case_plan(cfg: StudyConfig, ledger: Ledger) -> tuple[Case, ...]:
    """The worst cases for the study `cfg` at a launch whose ledger is `ledger` (see the module
    docstring), in the plan's order (`CASE_NAMES`), each with its planned peak; `run_order` gives
    the order they run in."""
    lengths = workload_lengths(cfg)
    pool = ledger.max_total_num_tokens
    limit = longest_request(ledger)
    running = ledger.max_running_requests or DEFAULT_REQUESTS
    stress_out = next((ph.output_len for ph in cfg.workload.phases if isinstance(ph, Stress)), 64)
    timeout = max(
        (ph.timeout_s for ph in cfg.workload.phases if isinstance(ph, Stress)), default=600.0
    )

    def capped(input_len: int, output_len: int) -> tuple[int, int]:
        if limit is not None:
            output_len = min(output_len, max(1, limit // 2))
            input_len = min(input_len, max(2, limit - output_len))
        return max(2, input_len), max(1, output_len)

    out = min(lengths.max_output, CASE_MAX_OUTPUT)
    chunk_in, chunk_out = capped(largest_chunk(cfg, ledger), min(stress_out, CASE_MAX_OUTPUT))
    long_in, long_out = capped(lengths.max_input + lengths.max_output - out, out)
    per_request = pool // running if pool else chunk_in + out
    mr_in, mr_out = capped(max(2, min(chunk_in, per_request - out)), out)
    short = min(lengths.min_input, long_in)
    mixed = _fit(max(2, running), (long_in + short) // 2 + long_out, pool)

    def burst(name: str, requests: int, input_len: int, output_len: int) -> Stress:
        return Stress(name, rounds=1, requests=requests, input_len=input_len,
                      output_len=output_len, timeout_s=timeout)  # fmt: skip

    cases = [
        Case(
            "largest-chunk",
            burst("largest-chunk", _fit(running, chunk_in + chunk_out, pool), chunk_in, chunk_out),
            f"prompts of the largest prefill chunk the study allows ({chunk_in:,} tokens)",
        ),
        Case(
            "longest-context",
            burst("longest-context", _fit(running, long_in + long_out, pool), long_in, long_out),
            f"the longest request the workload can send ({long_in + long_out:,} tokens"
            + (f"; the server serves up to {limit:,})" if limit else ")"),
        ),
        Case(
            "max-running",
            burst("max-running", running, mr_in, mr_out),
            f"the effective max running requests ({running}) at once",
        ),
    ]
    for name, order, seed in ORDERS:
        b = Stress(name, rounds=1, requests=mixed, input_len=long_in, output_len=long_out,
                   timeout_s=timeout, order=order, short_len=short, order_seed=seed)  # fmt: skip
        cases.append(Case(name, b, f"the longest and shortest prompts mixed, {order}"))
    chunk = ledger.chunked_prefill_size
    return tuple(_sized(c, running, chunk if chunk and chunk > 0 else None) for c in cases)


def _sized(case: Case, running: int, chunk: int | None) -> Case:
    """`case` with its planned forward and held tokens: of its burst, the requests that run at
    once (at most `running`; of a mixed burst its long prompts first, the worst the arrival order
    can make it), their prompts (at most the `chunk`) and their whole lengths."""
    b = case.burst
    requests = b.requests or 1
    n_long = requests if b.short_len is None or requests < 2 else max(1, requests // 2)
    at_once = min(requests, max(1, running))
    longs = min(n_long, at_once)
    long_in, short_in = b.input_len or 0, b.short_len or 0
    prompts = longs * long_in + (at_once - longs) * short_in
    held = prompts + at_once * b.output_len
    forward = min(prompts, chunk) if chunk else prompts
    return replace(case, forward_tokens=forward, held_tokens=held)


def run_order(cases: Sequence[Case]) -> tuple[Case, ...]:
    """`cases` from the least to the most likely to fail: by `Case.planned_peak`, the plan's
    order where two plan the same."""
    return tuple(sorted(cases, key=lambda c: c.planned_peak))


def case_planner(
    cfg: StudyConfig, names: Sequence[str], fallback: Ledger
) -> Callable[[Ledger], tuple[Case, ...]]:
    """The cases `names` (all of them when empty) of the study `cfg`, planned from the ledger of
    the soak's launch (what SGLang ran at this setting), else from `fallback` (the trial's) when
    that launch showed no KV pool, in the order they run (`run_order`)."""

    def plan(ran: Ledger) -> tuple[Case, ...]:
        ledger = ran if ran.max_total_num_tokens else fallback
        return run_order(chosen_cases(case_plan(cfg, ledger), names))

    return plan


def chosen_cases(cases: Sequence[Case], names: Sequence[str]) -> tuple[Case, ...]:
    """The cases named (all of them when `names` is empty), in plan order."""
    if not names:
        return tuple(cases)
    return tuple(c for c in cases if c.name in names)
