"""Run SGLang's own bench_serving request functions against a server and report what they read.

Run with the Python of the SGLang venv (scripts/sglang_venv.py), not autotune's:

    SGLANG_PY scripts/bench_serving_client.py --url http://127.0.0.1:PORT --api generate \
        --requests 64 --concurrency 4 --output-len 64

It takes `async_request_sglang_generate`, `async_request_openai_completions` and
`async_request_openai_chat_completions` (with the dataclasses and small functions they call)
from `sglang/benchmark/serving.py` of the installed SGLang, by their source text, and runs them
unchanged. The module itself is not imported: its top level pulls in transformers, datasets and
every model config, none of which the request functions touch. The module global `args` they
read is set to bench_serving's defaults for a plain streamed run. Prints one JSON object: the
wall time and CPU time of the whole run, and per request `success`, `error`, `ttft`,
`itl_count`, `output_len`, `prompt_len` and `generated_text`.
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import json
import sys
import time
import types
from pathlib import Path
from types import SimpleNamespace
from typing import Any

FUNCTIONS = {
    "generate": "async_request_sglang_generate",
    "completions": "async_request_openai_completions",
    "chat": "async_request_openai_chat_completions",
}
PATHS = {"generate": "/generate", "completions": "/v1/completions", "chat": "/v1/chat/completions"}
SERVING_NAMES = {
    "_ROUTING_KEY_HEADER",
    "_create_bench_client_session",
    "RequestFuncInput",
    "RequestFuncOutput",
    "get_auth_headers",
    "get_request_headers",
    "_combine_openai_chat_content",
    "_extract_cache_from_sglext",
    "_record_server_prompt_len",
    *FUNCTIONS.values(),
}
UTILS_NAMES = {"remove_prefix", "parse_custom_headers"}
PRELUDE = """
import asyncio, json, os, sys, time, traceback, uuid, copy
from copy import deepcopy
from dataclasses import dataclass, field, replace
from typing import Any, AsyncGenerator, Callable, Dict, List, Optional, Tuple, Union
import aiohttp, orjson
try:
    from tqdm.asyncio import tqdm
except ImportError:
    tqdm = object
"""
BENCH_ARGS = SimpleNamespace(  # bench_serving's defaults (`cli_main`'s parser) for a plain run
    disable_stream=False,
    disable_ignore_eos=False,
    return_logprob=False,
    top_logprobs_num=0,
    token_ids_logprob=None,
    temperature=0.0,
    top_p=1.0,
    return_routed_experts=False,
    logprob_start_len=-1,
    header=None,
    cache_report=False,
    print_requests=False,
)


def _named(node: ast.stmt) -> set[str]:
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return {node.name}
    if isinstance(node, ast.Assign):
        return {t.id for t in node.targets if isinstance(t, ast.Name)}
    return set()


def _take(path: Path, names: set[str]) -> list[ast.stmt]:
    nodes = [n for n in ast.parse(path.read_text()).body if _named(n) & names]
    missing = names - set().union(*(_named(n) for n in nodes))
    if missing:
        raise SystemExit(f"bench_serving_client: {path} lacks {sorted(missing)}")
    return nodes


def load(disable_stream: bool = False) -> dict[str, Any]:
    """The namespace holding bench_serving's request functions, as in the installed SGLang."""
    import sglang

    root = Path(sglang.__file__).parent / "benchmark"
    module = ast.Module(
        body=[
            *ast.parse(PRELUDE).body,
            *_take(root / "utils.py", UTILS_NAMES),
            *_take(root / "serving.py", SERVING_NAMES),
        ],
        type_ignores=[],
    )
    holder = types.ModuleType("sglang_bench_serving_functions")  # dataclasses look it up
    sys.modules[holder.__name__] = holder
    namespace: dict[str, Any] = holder.__dict__
    exec(compile(module, str(root / "serving.py"), "exec"), namespace)
    namespace["args"] = SimpleNamespace(**{**vars(BENCH_ARGS), "disable_stream": disable_stream})
    return namespace


async def _run(a: argparse.Namespace, ns: dict[str, Any]) -> list[Any]:
    func = ns[FUNCTIONS[a.api]]
    prompt: Any = [1000 + i for i in range(a.input_len)] if a.api != "chat" else "w " * a.input_len
    extra = json.loads(a.extra)
    sem = asyncio.Semaphore(a.concurrency)

    async def one() -> Any:
        req = ns["RequestFuncInput"](
            prompt=prompt,
            api_url=a.url.rstrip("/") + PATHS[a.api],
            prompt_len=a.input_len,
            output_len=a.output_len,
            model=a.model,
            lora_name="",
            image_data=None,
            extra_request_body=extra,
        )
        async with sem:
            return await func(req)

    return list(await asyncio.gather(*(one() for _ in range(a.requests))))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--url", required=True)
    p.add_argument("--api", choices=sorted(FUNCTIONS), default="generate")
    p.add_argument("--requests", type=int, default=16)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--input-len", type=int, default=16)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--model", default="fake-model")
    p.add_argument("--extra", default="{}", help="JSON merged into each body")
    p.add_argument("--no-stream", action="store_true")
    p.add_argument("--keep-text", action="store_true", help="report the generated text")
    a = p.parse_args()
    ns = load(a.no_stream)
    c0, w0 = time.process_time(), time.perf_counter()
    outputs = asyncio.run(_run(a, ns))
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0
    report = {
        "wall_s": wall,
        "cpu_s": cpu,
        "requests": [
            {
                "success": o.success,
                "error": o.error[-400:],
                "ttft": o.ttft,
                "itl_count": len(o.itl),
                "output_len": o.output_len,
                "prompt_len": o.prompt_len,
                "generated_text": o.generated_text if a.keep_text else len(o.generated_text),
            }
            for o in outputs
        ],
    }
    json.dump(report, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
