"""Whether this machine can run the study at all, checked once before the first launch.

Three mistakes would otherwise cost a launch each (or a whole night of failed trials):
SGLang not installed for the interpreter the study's command names, a model path that does not
exist, and a hierarchical host cache that cannot fit in host RAM (per rank, times the ranks).
Host RAM is the simulator profile's in rehearsal and the machine's (/proc/meminfo) on the real
backend. Each problem is a `ConfigError` or `UsageError` naming the value and the fix.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

from autotune.config.space import gpus_needed, server_argv, settings_of
from autotune.config.studyfile import (
    HICACHE,
    Choices,
    Fixed,
    FloatRange,
    IntRange,
    Scalar,
    StudyConfig,
    param_name,
)
from autotune.errors import ConfigError, HarnessError, UsageError
from autotune.server.flagcheck import inspect_argvs
from autotune.server.gpu import GpuProbe, NvmlProbe, visible_devices
from autotune.sim.profiles import ProfileError, load_profile

MODEL_FLAGS = ("model_path", "speculative_draft_model_path", "tokenizer_path")
_FIND_SGLANG = "import importlib.util, sys; sys.exit(importlib.util.find_spec('sglang') is None)"


def check_host(
    cfg: StudyConfig,
    *,
    host_ram_gb: Callable[[], float | None] | None = None,
    sglang_present: Callable[[tuple[str, ...]], bool] | None = None,
    gpu_probe: Callable[[], GpuProbe] | None = None,
) -> list[str]:
    """Raise when the study cannot run here; nothing is launched before this passes. Returns
    notes worth a line each (a flag SGLang reads under another spelling)."""
    sim = cfg.server.backend == "sim"
    if not sim:
        _check_sglang(cfg.server.command, sglang_present or _sglang_importable)
        _check_model_paths(cfg)
    notes = _check_flags(cfg)
    if not sim:
        _check_gpus(cfg, (gpu_probe or NvmlProbe)())
    ram = (host_ram_gb or (lambda: _ram_gb(cfg)))()
    _check_hicache(cfg, ram, "the simulator profile's" if sim else "this machine's")
    return notes


def _check_sglang(command: tuple[str, ...], present: Callable[[tuple[str, ...]], bool]) -> None:
    if shutil.which(command[0]) is None:
        raise ConfigError("server.command", f"{command[0]!r} is not found on PATH; fix the path")
    runs_sglang = len(command) >= 3 and command[1] == "-m" and command[2].startswith("sglang")
    if runs_sglang and not present(command):
        raise UsageError(
            f"SGLang is not installed for {command[0]} (server.command runs "
            f"`{' '.join(command)}`); install it (pip install 'sglang[all]'), point "
            "server.command at the Python that has it, or rehearse with --backend sim"
        )


def _check_flags(cfg: StudyConfig) -> list[str]:
    """The server's own parser (SGLang's in the study's Python, or the simulator's table) on
    the fixed flags and every searched value (each choice, each end of a range, the others at
    their first value): a flag it does not know or a value it rejects fails every launch that
    uses it. Flags it knows under another spelling come back as notes."""

    argvs = argvs_to_check(cfg)
    canonical: dict[str, str] = {}
    for report in inspect_argvs(argvs, backend=cfg.server.backend):
        if report.problems:
            problem = report.problems[0]
            flag = re.search(r"(--[a-z0-9][a-z0-9-]*)", problem)
            name = param_name(flag.group(1)[2:]) if flag else ""
            where = f"search.{name}" if name in cfg.search.names() else f"server.flags.{name}"
            raise ConfigError(where if name else "server.flags", f"{problem}; fix the flag")
        canonical.update(report.canonical)
    return [
        f"{_where(cfg, given)}: the server reads {given} as {full}; exports spell it {full}"
        for given, full in canonical.items()
    ]


def argvs_to_check(cfg: StudyConfig) -> list[list[str]]:
    """The launch commands that together use every searched value: the fixed flags with each
    parameter's first value, then each other choice and each range's other end in turn."""
    first: dict[str, Scalar] = {}
    values: list[tuple[str, Scalar]] = []
    for p in cfg.search.params:
        if isinstance(p, Fixed):
            first[p.name] = p.value
        elif isinstance(p, Choices):
            first[p.name] = p.values[0]
            values += [(p.name, v) for v in p.values[1:]]
        elif isinstance(p, IntRange | FloatRange):
            first[p.name] = p.low
            values.append((p.name, p.high))
    argvs = []
    for point in [first, *({**first, name: v} for name, v in values)]:
        settings = settings_of(point, cfg.search)
        argvs.append(server_argv(cfg.server, settings, backend=cfg.server.backend))
    return argvs


def _where(cfg: StudyConfig, flag: str) -> str:
    name = param_name(flag[2:])
    return f"search.{name}" if name in cfg.search.names() else f"server.flags.{name}"


def _sglang_importable(command: tuple[str, ...]) -> bool:
    try:
        done = subprocess.run(
            [command[0], "-c", _FIND_SGLANG], capture_output=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _check_model_paths(cfg: StudyConfig) -> None:
    """A value that reads as a local path must exist; `org/name` may be a Hugging Face id."""
    for name, value in cfg.server.flags:
        if name not in MODEL_FLAGS or not isinstance(value, str):
            continue
        if value.startswith(("/", "./", "../", "~")) and not Path(value).expanduser().exists():
            raise ConfigError(
                f"server.flags.{name.replace('_', '-')}",
                f"{value} does not exist on this machine; fix the path "
                "(or give a Hugging Face model id)",
            )


def _ranks(cfg: StudyConfig) -> int:
    return gpus_needed(cfg.server.flags)


def _largest_hicache(cfg: StudyConfig) -> float:
    for p in cfg.search.params:
        if p.name != HICACHE:
            continue
        if isinstance(p, Fixed):
            values = [p.value]
        elif isinstance(p, Choices):
            values = list(p.values)
        elif isinstance(p, IntRange | FloatRange):
            values = [p.high]
        else:
            values = []
        numbers = [float(v) for v in values if isinstance(v, int | float)]
        return max(numbers, default=0.0)
    value = dict(cfg.server.flags).get(HICACHE)
    return float(value) if isinstance(value, int | float) else 0.0


def _check_gpus(cfg: StudyConfig, probe: GpuProbe) -> None:
    """NVML answers and shows the GPUs the server will use, found once before the first launch
    rather than as a harness error in every trial."""
    try:
        gpus = probe.snapshot()
    except HarnessError as exc:
        raise HarnessError(
            f"no GPU can be read on this machine ({exc}) Run the study on the GPU box, or "
            "rehearse it with --backend sim"
        ) from None
    env = {**os.environ, **cfg.server.env}
    wanted = visible_devices(env)
    present = {g.index for g in gpus}
    if wanted is not None and not set(wanted) <= present:
        missing = sorted(set(wanted) - present)
        raise ConfigError(
            "server.env.CUDA_VISIBLE_DEVICES",
            f"GPU {', '.join(map(str, missing))} is not on this machine (NVML shows "
            f"{len(gpus)}); fix the list or --gpus",
        )
    usable = len(wanted) if wanted is not None else len(gpus)
    needed = _ranks(cfg)
    if usable < needed:
        raise ConfigError(
            "server.flags",
            f"the server needs {needed} GPUs (tp × pp) and {usable} are usable here; lower "
            "tp-size or run on a larger box",
        )


def _check_hicache(cfg: StudyConfig, ram_gb: float | None, whose: str) -> None:
    largest = _largest_hicache(cfg)
    ranks = _ranks(cfg)
    if ram_gb is None or largest <= 0 or largest * ranks <= ram_gb:
        return
    raise ConfigError(
        f"search.{HICACHE}",
        f"{largest:g} GB per rank × {ranks} ranks = {largest * ranks:g} GB of host cache is "
        f"more than {whose} {ram_gb:g} GB of host RAM; lower it to at most "
        f"{ram_gb / ranks:g}",
    )


def _ram_gb(cfg: StudyConfig) -> float | None:
    if cfg.server.backend == "sim":
        try:
            return load_profile(cfg.server.sim_profile).hardware.host_ram_gb
        except (ProfileError, OSError):
            return None  # the launch reports a bad profile itself
    return machine_ram_gb()


def machine_ram_gb(meminfo: Path = Path("/proc/meminfo")) -> float | None:
    """Total host RAM in GB (10^9 bytes), or None when /proc/meminfo cannot be read."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024 / 1e9
    except (OSError, ValueError, IndexError):
        return None
    return None


MIN_RESULTS_FREE_BYTES = 256 * 2**20
"""Room a trial needs under the results folder (its server log, record and storage rows)."""


def results_disk_problem(folder: Path, min_free: int = MIN_RESULTS_FREE_BYTES) -> str:
    """Why the disk under `folder` cannot take another trial ("" when it can): checked before
    each launch, so a full disk stops the run cleanly instead of breaking a trial half-way."""
    try:
        st = os.statvfs(folder)
    except OSError as exc:
        return f"the results folder {folder} cannot be read: {exc.strerror or exc}"
    free = st.f_bavail * st.f_frsize
    if free >= min_free:
        return ""
    return (
        f"the results disk is full: {free / 2**20:.0f} MiB free under {folder}, a trial needs "
        f"{min_free / 2**20:.0f} MiB; free some space and run the same command to resume"
    )
