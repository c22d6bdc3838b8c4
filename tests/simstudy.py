"""What the end-to-end tests share: a simulator study file, `autotune` as a real process, and the
check that no process a test started outlives it.

Every process an end-to-end test starts carries the test's folder in its command line (the study
file path or the simulator's GPU-state folder), so `leftovers(folder)` finds any survivor; it is
`autotune.testing.audit.leftovers`, which also counts the members of a survivor's process group or
session.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from autotune.testing import audit

KIMI_FLAGS = """model-path = "moonshotai/Kimi-K2.5"
tp-size = 8
trust-remote-code = true
speculative-algorithm = "EAGLE3"
speculative-draft-model-path = "lightseekorg/kimi-k2.5-eagle3"
speculative-num-steps = 3
speculative-eagle-topk = 1
speculative-num-draft-tokens = 4"""


LLAMA_TP2 = """model-path = "meta-llama/Llama-3.1-70B-Instruct"
tp-size = 2"""


def limits(*, stop_grace_s: int = 10, release_s: int = 10) -> str:
    """The `[server.limits]` table of the end-to-end studies, a blank line after it: a minute to
    start, half a minute of silence, a minute of load; `stop_grace_s` and `release_s` to stop."""
    return f"""[server.limits]
startup_s = 60
stall_s = 30
workload_s = 60
stop_grace_s = {stop_grace_s}
release_s = {release_s}

"""


def workload(
    duration: float | str = 1.0,
    *,
    stress: bool = True,
    input_len: int | str = '{ dist = "uniform", min = 200, max = 600 }',
    output_len: int = 16,
    concurrency: int = 8,
    request_timeout_s: int | None = 30,
    drain_s: int | None = 5,
    api_key_env: str | None = None,
) -> str:
    """The `[workload]` table of `sim_study` and the other test studies, a blank line after it: a
    steady phase of `duration` seconds at `concurrency` requests in flight, then (with `stress`)
    one stress round of two 8K-token prompts; a timeout given as None is left to its default, and
    `api_key_env` names the variable that holds the server's API key."""
    text = "[workload]\n"
    if api_key_env is not None:
        text += f'api_key_env = "{api_key_env}"\n'
    text += f"input_len = {input_len}\noutput_len = {output_len}\n"
    if request_timeout_s is not None:
        text += f"request_timeout_s = {request_timeout_s}\n"
    if drain_s is not None:
        text += f"drain_timeout_s = {drain_s}\n"
    text += f"""
[[workload.phases]]
kind = "steady"
concurrency = {concurrency}
duration_s = {duration}

"""
    if stress:
        text += """[[workload.phases]]
kind = "stress"
rounds = 1
requests = 2
input_len = 8192
output_len = 4

"""
    return text


def small_steady(
    duration: float = 1.0,
    *,
    input_len: int = 512,
    output_len: int = 64,
    concurrency: int = 4,
    api_key_env: str | None = None,
) -> str:
    """The `[workload]` table of the small test studies that launch nothing long (`workload`): one
    steady phase, by default a second at four requests in flight of 512-token prompts and 64-token
    answers, no stress round, the timeouts left to their defaults."""
    return workload(
        duration,
        stress=False,
        input_len=input_len,
        output_len=output_len,
        concurrency=concurrency,
        request_timeout_s=None,
        drain_s=None,
        api_key_env=api_key_env,
    )


def sim_study(
    *,
    low: float = 0.88,
    step: float = 0.03,
    duration: float = 1.0,
    time_scale: float | None = None,
    version: str | None = None,
    headroom_gib: float | None = 0.5,
    sampler: str | None = "grid",
    profile: str = "kimi-k2.5-tp8-96g",
    flags: str = KIMI_FLAGS,
    server_limits: str | None = None,
    search: str | None = None,
    load: str | None = None,
    n_trials: int | str = 3,
    tail: str = "",
) -> str:
    """A study of `n_trials` trials on the simulated Kimi-K2.5 (tp 8, EAGLE3 draft), searching
    mem_fraction_static from `low` to 0.94 by `step`: a steady phase of `duration` seconds, then
    one stress round of 8K-token prompts. `profile`, `version` (the simulated SGLang's), `flags`
    (the `[server.flags]` lines), `server_limits` (the `limits()` table), `search` (the `[search]`
    and `[baseline]` tables), `load` (the `workload()` table) and `tail` (tables after the
    budget) put another model, space, load and study there."""
    scale = "" if time_scale is None else f"sim_time_scale = {time_scale}\n"
    release = "" if version is None else f'sim_version = "{version}"\n'
    constraints = (
        "" if headroom_gib is None else f"[constraints]\nmin_headroom_gib = {headroom_gib}\n\n"
    )
    if sampler is not None:
        tail += f'\n[sampler]\nname = "{sampler}"\n'
    space = search or (
        f"[search]\nmem_fraction_static = {{ low = {low}, high = 0.94, step = {step} }}\n"
        "max_running_requests = 48\nhicache_size = 48\n\n[baseline]\nmem_fraction_static = 0.88"
    )
    return f"""
[server]
backend = "sim"
sim_profile = "{profile}"
{release}{scale}
[server.flags]
{flags}

{server_limits or limits()}{space}

{load or workload(duration)}{constraints}[budget]
n_trials = {n_trials}
{tail}"""


def command(config: Path, *args: str) -> list[str]:
    """`autotune ARGS` on the study file `config`, its results in `results` beside it."""
    return [sys.executable, "-m", "autotune", *args, "--config", str(config),
            "--results-dir", str(config.parent / "results")]  # fmt: skip


def run(config: Path, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """`autotune ARGS` to its end, in its own session in the study file's folder."""
    return subprocess.run(
        command(config, *args),
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=config.parent,
        start_new_session=True,
    )


def start(config: Path, *args: str) -> subprocess.Popen[str]:
    """`autotune ARGS` in the background, its own session, stderr folded into stdout."""
    return subprocess.Popen(
        command(config, *args),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=config.parent,
        start_new_session=True,
    )


def wait_ready(log: Path, proc: subprocess.Popen[str], timeout_s: float = 60) -> bool:
    """Until the server log `log` says it is ready (True), `proc` ends or `timeout_s` passes."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        if log.is_file() and "fired up and ready" in log.read_text(errors="replace"):
            return True
        time.sleep(0.1)
    return False


def leftovers(folder: Path) -> list[int]:
    """Live processes that mention `folder`, with their process groups and sessions."""
    return [p.pid for p in audit.leftovers(str(folder))]


def kill(pids: list[int]) -> None:
    """SIGKILL each process's group (the process alone when it shares this one's group)."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            pgid = os.getpgid(pid)
            if pgid != os.getpgrp():
                os.killpg(pgid, signal.SIGKILL)
            else:
                os.kill(pid, signal.SIGKILL)


def assert_none_left(folder: Path) -> None:
    """Kill whatever still mentions `folder` and fail if there was anything."""
    left = leftovers(folder)
    kill(left)
    assert not left, f"processes left behind: {left}"
