"""The shape of a launch command: where its program ends and SGLang's own flags begin.

A launch command is a program (`python -m sglang.launch_server`, `sglang serve`, maybe behind a
wrapper with flags of its own: `numactl --interleave=all …`, `srun --gres=gpu:8 …`, `docker run
--gpus all … image python3 -m …`) and then the server's flags. `autotune init` splits an
operator's command here, and the flag check hands SGLang's parser only what follows the program,
so a wrapper's flags are never taken for the server's.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

_ENTRY = re.compile(r"(^|/)sglang[./]launch_server(\.py)?$")
CONTAINER_RUNNERS = ("docker", "podman", "nerdctl")
"""Programs that run the server in a container when their first word is `run`."""


def program_end(argv: Sequence[str]) -> int:
    """Where the server's own flags begin: after SGLang's entry point where the words name one
    (`-m sglang.launch_server`, `…/sglang/launch_server.py`, `sglang serve`), so that a wrapper's
    flags before it stay with the program; else at the first `--` token."""
    for i, word in enumerate(argv):
        if word.startswith("--"):
            continue
        if _ENTRY.search(word):
            return i + 1
        if _serve_at(argv, i):
            return i + 2
    return next((i for i, w in enumerate(argv) if w.startswith("--")), len(argv))


def _serve_at(words: Sequence[str], i: int) -> bool:
    """Whether `words[i]` is SGLang's console script and the next word its `serve`."""
    return os.path.basename(words[i]) == "sglang" and i + 1 < len(words) and words[i + 1] == "serve"


def in_container(program: Sequence[str]) -> bool:
    """Whether the program runs the server in a container (`docker run`, `podman run`, `nerdctl
    run`), where the host's Python is not the server's."""
    return (
        len(program) >= 2
        and os.path.basename(program[0]) in CONTAINER_RUNNERS
        and program[1] == "run"
    )


def own_network(program: Sequence[str]) -> bool:
    """Whether the program runs the server in a container with a network of its own, where only
    the ports it publishes reach the host (no `--network host`)."""
    if not in_container(program):
        return False
    words = list(program[2:])
    for i, word in enumerate(words):
        if word in ("--network=host", "--net=host"):
            return False
        if word in ("--network", "--net") and i + 1 < len(words) and words[i + 1] == "host":
            return False
    return True


def interpreter(program: Sequence[str]) -> str | None:
    """The Python the program names for SGLang (`PY -m sglang.launch_server`, `PY …/sglang/
    launch_server.py`), None where it names none or runs in a container."""
    if in_container(program):
        return None
    for i, word in enumerate(program):
        if word == "-m" and i + 1 < len(program) and _ENTRY.search(program[i + 1]) and i > 0:
            return program[i - 1]
        if _ENTRY.search(word) and word.endswith(".py") and i > 0:
            return program[i - 1]
    return None


def console_script(program: Sequence[str]) -> str | None:
    """The word naming SGLang's console script where the program runs one (`sglang serve`,
    `/opt/venv/bin/sglang serve`), else None."""
    return next((w for i, w in enumerate(program) if _serve_at(program, i)), None)


def starts_one_process(program: Sequence[str]) -> bool:
    """Whether the program is SGLang's own entry point with nothing before it (`PY -m
    sglang.launch_server`, `PY …/sglang/launch_server.py`, `sglang serve`): one server process
    on this box, where a launcher (`srun`, a script) may start one on several."""
    end = program_end(program)
    if end != len(program):
        return False
    return end in (2, 3) and (
        interpreter(program) == program[0] or console_script(program) == program[0]
    )
