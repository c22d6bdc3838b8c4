"""What a trial asked for beside what SGLang ran (`Clamp`, `Clamps.of`), read from one ledger.

SGLang lowers some settings at startup without failing, so a trial that asked for one point
measures another. Each rule, with the SGLang 0.5.23 source that applies it and the line that
reports the value it ran (0.5.9 where it differs):

* `max_running_requests`: asked is `--max-running-requests` on the `server_args=` line; run is the
  scheduler's summary line (`managers/scheduler.py`, `max_total_num_tokens=…, …,
  max_running_requests=E, …`). 0.5.23 `mem_cache/kv_cache_configurator.py` `resolve_max_num_reqs`
  takes `min(asked // attn_dp_size, max_total_num_tokens // 2)` and warns `max_running_requests
  was reduced from the requested R to E (per dp worker) due to the available KV cache capacity.`;
  post-capture sizing recomputes it for the smaller pool (`model_runner_components/
  kv_pool_runtime.py` `compute_post_capture_kv_resize`, `Post-capture KV sizing:
  max_running_requests R -> E`). 0.5.9 keeps an explicit value (`min(asked // dp,
  req_to_token_pool.size)`, the table sized from it) and resets an unset one to 48 with
  speculative decoding.
* `cuda_graph_max_bs`: asked is `--cuda-graph-max-bs` on the `server_args=` line (0.5.23
  `cuda_graph_max_bs_decode`); run is the largest decode batch captured (0.5.23 `Capture target
  decode CUDA graph end. bs=[…]`, 0.5.9 `Capture cuda graph bs […]`). `get_batch_sizes_to_capture`
  (0.5.23 `model_executor/runner/base_cuda_graph_runner.py`, 0.5.9 `cuda_graph_runner.py`) drops
  every size above the request table's rows (`req_to_token_pool.size`).
* `context_length`: asked is `--context-length` (a model's own context, the flag unset, is
  nobody's ask and is not compared); run is what one request can hold: `managers/tp_worker.py`
  `get_worker_info` takes `max_req_len = min(context_len − 1, pool − 1)`, and 0.5.23 warns
  `KV pool holds N tokens, fewer than --context-length M.` (0.5.9 applies the rule silently).
* `chunked_prefill_size`: asked is the `server_args=` line's, run is the summary line's.
* `post_capture_kv_sizing`: asked is the trial's SGLANG_ENABLE_POST_CAPTURE_KV_SIZING (the log
  does not print it); run is whether the pool was sized after capture (`KV Cache VA upper bound`,
  `Post-capture KV sizing: KV cache allocated`). 0.5.23 `arg_groups/overrides.py`
  `post_capture_kv_sizing_planned` turns it off when the largest prefill graph is below the chunk
  (`max_prefill_buffer_tokens > max(prefill bs)`), for MLA, without decode graphs, and more.

Kept in `logparse` because it is read from the ledger alone; every review surface, the export and
the search's duplicate check ask this one place.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from autotune.logparse.ledger import Ledger

POST_CAPTURE_ENV = "SGLANG_ENABLE_POST_CAPTURE_KV_SIZING"
"""The variable that asks 0.5.23 for post-capture KV sizing (`environ.py`, default False)."""


def post_capture_asked(env: Mapping[str, str]) -> bool:
    """Whether `env` asks for post-capture sizing, read as SGLang's `EnvBool.parse` reads it
    (`environ.py`: `true`, `1`, `yes`, `y`, any case)."""
    return env.get(POST_CAPTURE_ENV, "").lower() in ("true", "1", "yes", "y")


Value = int | bool
"""A setting's value: a count (requests, batch, tokens) or on/off."""


@dataclass(frozen=True)
class Clamp:
    """One setting: what the trial asked for, what SGLang ran, why they differ, and where in
    SGLang's source the rule is. `asked` or `effective` is None when the log does not show it."""

    name: str
    """The study's parameter name (`max_running_requests`, `cuda_graph_max_bs`, …)."""
    asked: Value | None
    effective: Value | None
    reason: str
    source: str
    rule: str = ""
    """Which of SGLang's rules set the value: `kv_capacity` (the pool holds tokens ÷ 2
    requests), `post_capture`, `spec_reset`, `request_table` (graph sizes above the table
    dropped), `pool` (a request cut to the pool), "" when nothing lowered it or the log does not
    say which rule did."""

    @property
    def clamped(self) -> bool:
        """Whether SGLang ran something other than what was asked."""
        return (
            self.asked is not None and self.effective is not None and self.asked != self.effective
        )

    def text(self) -> str:
        """`max_running_requests: asked 2048, ran 1024 (why)`."""
        return (
            f"{self.name}: asked {_show(self.asked)}, ran {_show(self.effective)} ({self.reason})"
        )


@dataclass(frozen=True)
class Clamps:
    """The five settings of one launch, each as asked and as run (`of`); `clamped` holds the
    ones SGLang changed."""

    items: tuple[Clamp, ...] = ()

    @classmethod
    def of(cls, ledger: Ledger) -> Clamps:
        """The five settings of `ledger` (pure)."""
        return cls(
            (
                _requests(ledger),
                _graph_bs(ledger),
                _context(ledger),
                _chunk(ledger),
                _post_capture(ledger),
            )
        )

    @property
    def clamped(self) -> tuple[Clamp, ...]:
        """The settings SGLang changed."""
        return tuple(c for c in self.items if c.clamped)

    def lines(self) -> tuple[str, ...]:
        """One `Clamp.text` per changed setting."""
        return tuple(c.text() for c in self.clamped)

    def effective(self) -> dict[str, Value]:
        """What SGLang ran of each changed setting, by parameter name."""
        return {c.name: c.effective for c in self.clamped if c.effective is not None}


REQUESTS_SOURCE = "mem_cache/kv_cache_configurator.py resolve_max_num_reqs"
GRAPH_SOURCE = "model_executor/runner/base_cuda_graph_runner.py get_batch_sizes_to_capture"
CONTEXT_SOURCE = "managers/tp_worker.py get_worker_info"
CHUNK_SOURCE = "server_args.py (the scheduler's summary line)"
POST_CAPTURE_SOURCE = "arg_groups/overrides.py post_capture_kv_sizing_planned"


def _requests(led: Ledger) -> Clamp:
    asked, ran = led.requested_max_running_requests, led.max_running_requests
    tokens = led.max_total_num_tokens
    dp = led.dp_size if led.dp_size and led.dp_size > 1 else 1
    per_worker = asked // dp if asked is not None else None
    rule = led.max_running_requests_rule or ""
    source, reason = REQUESTS_SOURCE, "the scheduler's summary line"
    if rule == "post_capture":
        reason = f"post-capture KV sizing left {tokens} tokens"
        source = "model_executor/model_runner_components/kv_pool_runtime.py"
    elif rule == "spec_reset":
        reason, source = "speculative decoding resets it", "server_args.py"
    elif dp > 1 and per_worker == ran:
        return Clamp("max_running_requests", per_worker, ran, f"per DP group of {dp}", source)
    elif tokens is not None and ran is not None and ran == tokens // 2:
        rule, reason = "kv_capacity", f"the KV pool of {tokens} tokens holds {ran} requests"
    return Clamp("max_running_requests", asked, ran, reason, source, rule)


def _graph_bs(led: Ledger) -> Clamp:
    """Lowered only when the request table cut the capture list (its largest size is then the
    table's rows, or the rows with 0.5.23's padding row); a largest size below the asked one that
    the table did not cut is the list's own step (`[…, 240, 248, 256]`), not a clamp."""
    asked, ran = led.requested_cuda_graph_max_bs, led.graph_max_bs
    rows = led.max_running_requests
    cut = asked is not None and ran is not None and rows is not None and ran < asked
    if cut and ran is not None and rows is not None and rows <= ran <= rows + 1:
        return Clamp(
            "cuda_graph_max_bs",
            asked,
            ran,
            f"the request table holds {rows} requests",
            GRAPH_SOURCE,
            "request_table",
        )
    shown = asked if asked is not None else ran
    return Clamp(
        "cuda_graph_max_bs", asked, shown, "the largest decode batch captured", GRAPH_SOURCE
    )


def _context(led: Ledger) -> Clamp:
    model, tokens = led.context_len, led.max_total_num_tokens
    asked = led.requested_context_length  # the model's own context is no point of the study
    ran = min(model, tokens) if model is not None and tokens is not None else model
    reason = (
        f"the KV pool holds {tokens} tokens, fewer than the context"
        if tokens is not None and model is not None and tokens < model
        else "the scheduler's summary line"
    )
    rule = "pool" if ran is not None and asked is not None and ran < asked else ""
    return Clamp("context_length", asked, ran, reason, CONTEXT_SOURCE, rule)


def _chunk(led: Ledger) -> Clamp:
    return Clamp(
        "chunked_prefill_size",
        led.requested_chunked_prefill_size,
        led.chunked_prefill_size,
        "SGLang's resolved value",
        CHUNK_SOURCE,
    )


def _post_capture(led: Ledger) -> Clamp:
    asked, ran = led.post_capture_requested, led.post_capture_kv_sizing
    largest, chunk = led.prefill_graph_max_tokens, led.chunked_prefill_size
    if (led.sglang_version or "").startswith("0.5.9"):
        reason = "SGLang 0.5.9 has no post-capture sizing"
    elif largest is None:
        reason = "no prefill CUDA graph was captured"
    elif chunk is not None and largest < chunk:
        reason = f"the largest prefill graph ({largest} tokens) is below the chunk ({chunk})"
    else:
        reason = "SGLang's rules turned it off"
    return Clamp("post_capture_kv_sizing", asked, ran, reason, POST_CAPTURE_SOURCE)


def _show(value: Value | None) -> str:
    if value is None:
        return "?"
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)
