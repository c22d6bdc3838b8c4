"""SGLang's own format strings, read from its source and rendered with sample values.

`STRINGS_PROBE` runs in SGLang's Python (`tests.oracle.run_in_sglang`): it finds the installed
package without importing it and prints, for each file asked for, every string literal and
f-string as the AST gives it back (the form `autotune.logparse.formats` writes them in).
`render` fills one such text: f-string fields from a mapping of expression → value (conversion
and format spec applied as Python would), %-formats from a tuple.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from autotune.logparse.formats import Source

STRINGS_FUNCS = r"""
import ast

def render(node):
    if isinstance(node, ast.Constant):
        return node.value
    out = []
    for v in node.values:
        if isinstance(v, ast.Constant):
            out.append(v.value.replace("{", "{{").replace("}", "}}"))
            continue
        conv = "" if v.conversion == -1 else "!" + chr(v.conversion)
        spec = ""
        if v.format_spec is not None:
            spec = ":" + "".join(
                p.value if isinstance(p, ast.Constant) else "{" + ast.unparse(p.value) + "}"
                for p in v.format_spec.values
            )
        out.append("{" + ast.unparse(v.value) + conv + spec + "}")
    return "".join(out)

def strings(path):
    tree = ast.parse(open(path, encoding="utf-8").read())
    inner = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.JoinedStr):
            for v in n.values:
                inner.add(id(v))
                if isinstance(v, ast.FormattedValue) and v.format_spec is not None:
                    inner.add(id(v.format_spec))
                    inner.update(id(p) for p in v.format_spec.values)
    found = []
    for n in ast.walk(tree):
        if id(n) in inner:
            continue
        if isinstance(n, ast.Constant) and isinstance(n.value, str):
            found.append(["plain", render(n)])
        elif isinstance(n, ast.JoinedStr):
            found.append(["f", render(n)])
    return found
"""

STRINGS_PROBE = (
    STRINGS_FUNCS
    + r"""
import importlib.util, json, os, sys

origin = importlib.util.find_spec("sglang").origin
srt = os.path.join(os.path.dirname(origin), "srt")
out = {"srt": srt, "files": {}}
for rel in sys.argv[1:]:
    path = os.path.join(srt, rel)
    out["files"][rel] = strings(path) if os.path.exists(path) else None
print(json.dumps(out))
"""
)


def file_strings(path: str) -> list[list[str]]:
    """A file's strings as the probe lists them, read with this Python (fixture making)."""
    scope: dict[str, Any] = {}
    exec(STRINGS_FUNCS, scope)
    result: list[list[str]] = scope["strings"](path)
    return result


def found(source: Source, strings: Sequence[Sequence[str]] | None) -> bool:
    """Whether `source` is among a file's strings (f-strings for style "f", literals else)."""
    if strings is None:
        return False
    want = "f" if source.style == "f" else "plain"
    for kind, text in strings:
        if kind != want:
            continue
        if text == source.text or (source.style == "prefix" and text.startswith(source.text)):
            return True
    return False


def _unnested(text: str, start: int = 0) -> Iterator[tuple[int, str]]:
    """(index, character) of each character of `text` from `start` that stands outside quotes
    and brackets; a closing bracket that closes nothing (an f-string field's end) is one."""
    depth, quote = 0, ""
    for i in range(start, len(text)):
        c = text[i]
        if quote:
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}" and depth:
            depth -= 1
        elif depth == 0:
            yield i, c


def _field_end(text: str, start: int) -> int:
    for i, c in _unnested(text, start):
        if c in ")]}":
            return i
    raise ValueError(f"unclosed field in {text!r}")


def _split_field(field: str) -> tuple[str, str, str]:
    """(expression, conversion, spec) of one f-string field."""
    colon = next((i for i, c in _unnested(field) if c == ":"), -1)
    expr, spec = (field[:colon], field[colon + 1 :]) if colon >= 0 else (field, "")
    conv = ""
    if len(expr) > 2 and expr[-2] == "!" and expr[-1] in "rsa":
        expr, conv = expr[:-2], expr[-1]
    return expr, conv, spec


def render_f(text: str, values: Mapping[str, Any]) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c == "{" and text.startswith("{{", i):
            out.append("{")
            i += 2
        elif c == "}" and text.startswith("}}", i):
            out.append("}")
            i += 2
        elif c == "{":
            end = _field_end(text, i + 1)
            expr, conv, spec = _split_field(text[i + 1 : end])
            if expr not in values:
                raise KeyError(f"no sample value for {{{expr}}} in {text!r}")
            value = values[expr]
            if conv == "r":
                value = repr(value)
            elif conv == "s":
                value = str(value)
            elif conv == "a":
                value = ascii(value)
            out.append(format(value, spec))
            i = end + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


def render(source: Source, values: Mapping[str, Any] | Sequence[Any] = ()) -> str:
    """One source filled in: `values` is a mapping for an f-string, a sequence for %-format."""
    if source.style == "f":
        assert isinstance(values, Mapping), source.text
        return render_f(source.text, values)
    if source.style == "%":
        assert not isinstance(values, Mapping), source.text
        return source.text % tuple(values)
    return source.text


AVAIL_KEY = "'available_cpu_mem' if self.device == 'cpu' else 'available_gpu_mem'"


def summary_values(
    tokens: int, chunk: int, slots: int, context: int, free: float
) -> dict[str, Any]:
    """The sample values of the scheduler's summary line (`scheduler_summary`, the same f-string
    in 0.5.18 and 0.5.23) on a GPU, by the expressions its fields name: the pool's `tokens`, the
    chunk, the request slots, the context and the free memory after the start (GiB)."""
    return {
        "self.max_total_num_tokens": tokens,
        "get_schedule().chunked_prefill_size": chunk,
        "self.max_prefill_tokens": 16384,
        "self.max_running_requests": slots,
        "self.model_config.context_len": context,
        AVAIL_KEY: "available_gpu_mem",
        "self.startup_available_gpu_memory_gb": free,
    }


def startup_timings(
    phase: Source,
    line: Source,
    graphs: Mapping[str, float],
    seconds: tuple[float, float, float, float],
) -> str:
    """The engine's startup timings line: `line` (a %-format) filled with `seconds`
    (load_weight, kv_cache_allocation, scheduler_e2e, tokenizer_e2e) and, before the last, each
    CUDA graph phase's time rendered with `phase` and joined by commas."""
    inner = ", ".join(render(phase, {"phase": p, "duration": d}) for p, d in graphs.items())
    load, kv, scheduler, tokenizer = seconds
    return render(line, (load, kv, scheduler, inner, tokenizer))
