"""Whether this machine can run the study at all, checked once before the first launch.

Three mistakes would otherwise cost a launch each (or a whole night of failed trials):
SGLang not installed for the interpreter the study's command names, a model path that does not
exist, and a hierarchical host cache that cannot fit in host memory (per rank, times the ranks).
Host memory is bounded by the SGLang release's own rule (`server.hostmem`): host RAM available,
bounded by the container's memory cgroup, less a 10 GiB reserve; the simulator profile's in
rehearsal, the machine's (/proc/meminfo, the cgroup files) on the real backend. Each problem is a
`ConfigError` or `UsageError` naming the value and the fix. A host cache candidate above the bound
is a note here, and each trial that asks for it is refused before its launch (`hicache_refusal`);
only a study whose every host cache candidate is above it stops here.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable, Mapping
from pathlib import Path

from autotune.config.command import in_container
from autotune.config.schema import (
    HICACHE,
    Choices,
    Fixed,
    FloatRange,
    IntRange,
    Scalar,
    StudyConfig,
    param_name,
)
from autotune.config.space import gpus_needed, server_argv, settings_of
from autotune.config.studyfile import node_count
from autotune.errors import ConfigError, HarnessError, UsageError
from autotune.server.flagcheck import inspect_argvs, sglang_python
from autotune.server.gpu import GpuProbe, NvmlProbe, visible_devices
from autotune.server.hostmem import (
    CgroupError,
    GiB,
    HostBound,
    Limit,
    cgroup_limits,
    headroom_of,
    meminfo_available,
)
from autotune.sim.profiles import ProfileError, load_profile

MODEL_FLAGS = ("model_path", "speculative_draft_model_path", "tokenizer_path")
_FIND_SGLANG = "import importlib.util, sys; sys.exit(importlib.util.find_spec('sglang') is None)"
_SGLANG_VERSION = "import importlib.metadata as m; print(m.version('sglang'))"
SIM_CGROUP_KEY = "hardware.cgroup_memory_max_gib"


def check_host(
    cfg: StudyConfig,
    *,
    host: Callable[[], HostBound | None] | None = None,
    sglang_present: Callable[[tuple[str, ...]], bool] | None = None,
    gpu_probe: Callable[[], GpuProbe] | None = None,
) -> list[str]:
    """Raise when the study cannot run here; nothing is launched before this passes. Returns
    notes worth a line each (a flag SGLang reads under another spelling, host cache candidates
    over the host memory bound). `host` gives the bound (`host_bound` by default)."""
    sim = cfg.server.backend == "sim"
    if not sim:
        _check_sglang(cfg.server.command, sglang_present or _sglang_importable)
        _check_model_paths(cfg)
    notes = _check_flags(cfg)
    if not sim:
        _check_gpus(cfg, (gpu_probe or NvmlProbe)())
    bound = (host or (lambda: host_bound(cfg)))()
    return notes + _check_hicache(cfg, bound)


def _check_sglang(command: tuple[str, ...], present: Callable[[tuple[str, ...]], bool]) -> None:
    if shutil.which(command[0]) is None:
        raise ConfigError("server.command", f"{command[0]!r} is not found on PATH; fix the path")
    python = sglang_python(command)
    if python is not None and not present((python,)):
        raise UsageError(
            f"SGLang is not installed for {python} (server.command runs "
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
        f"{_where(cfg, given)}: the server reads {given} as {full}"
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
    if in_container(cfg.server.command):
        return  # the paths are the container's, not this machine's
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


def _ranks_per_host(cfg: StudyConfig) -> int:
    """The ranks whose host pools share this host: every GPU of the server over `--nnodes` (0.5.23
    `ranks_per_host`: the launch world size ÷ nodes, at least 1)."""
    return max(1, _ranks(cfg) // node_count(cfg.server.flags))


def hicache_candidates(cfg: StudyConfig) -> list[float]:
    """The host cache sizes (GB per rank, > 0) the study may launch: each choice, a range's ends
    (its low end, or its first step above 0 when it starts at 0 = off), or the fixed flag."""
    for p in cfg.search.params:
        if p.name != HICACHE:
            continue
        if isinstance(p, Fixed):
            values: list[Scalar] = [p.value]
        elif isinstance(p, Choices):
            values = list(p.values)
        elif isinstance(p, IntRange | FloatRange):
            # a continuous range from 0 holds sizes as small as one likes: 1e-9 stands for them
            first = p.low if p.low > 0 else min(p.step or 1e-9, p.high)
            values = [first, p.high]
        else:
            values = []
        return [float(v) for v in values if isinstance(v, int | float) and v > 0]
    value = dict(cfg.server.flags).get(HICACHE)
    return [float(value)] if isinstance(value, int | float) and value > 0 else []


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
            f"the server needs {needed} GPUs (tp × pp × data-parallel replicas) and {usable} "
            "are usable here; lower tp-size or run on a larger box",
        )


def _check_hicache(cfg: StudyConfig, bound: HostBound | None) -> list[str]:
    """Every host cache candidate above the bound: a preflight error when none is left, else a
    note (each trial that asks for one is refused before launch, `hicache_refusal`)."""
    candidates = hicache_candidates(cfg)
    if bound is None or not candidates:
        return []
    over = [c for c in candidates if not bound.fits(c)]
    if not over:
        return []
    where = f"search.{HICACHE}" if HICACHE in cfg.search.names() else f"server.flags.{HICACHE}"
    if len(over) == len(candidates):
        raise ConfigError(where, bound.refusal(max(over), HICACHE, named=False))
    return [
        f"{where}: {', '.join(f'{c:g}' for c in over)} GB per rank is over the host memory bound "
        f"({bound.source()}, {bound.per_rank_gb:.1f} GB per rank); those trials are refused "
        "before launch"
    ]


def hicache_refusal(cfg: StudyConfig, params: Mapping[str, object], bound: HostBound | None) -> str:
    """Why a trial of `params` is not launched: its host cache is above the bound ("" when it
    fits, when it has none, or when no bound is known)."""
    value = params.get(HICACHE, dict(cfg.server.flags).get(HICACHE))
    if bound is None or isinstance(value, bool) or not isinstance(value, int | float):
        return ""
    return bound.refusal(float(value), HICACHE)


def host_bound(
    cfg: StudyConfig, *, proc: Path = Path("/proc"), root: Path = Path("/")
) -> HostBound | None:
    """The host memory bound of this study's host cache: the simulator profile's host RAM and
    cgroup limit (`hardware.cgroup_memory_max_gib`) in rehearsal, this machine's MemAvailable and
    memory cgroup on the real backend (`proc` and `root` are where those files are read); None
    when host RAM cannot be read (nothing is checked then)."""
    ranks = _ranks_per_host(cfg)
    if cfg.server.backend == "sim":
        try:
            profile = load_profile(cfg.server.sim_profile)
        except (ProfileError, OSError):
            return None  # the launch reports a bad profile itself
        hw = profile.hardware
        limit = hw.cgroup_memory_max_gib
        cgroup = (
            Limit(f"the simulator profile's {SIM_CGROUP_KEY}", int(limit * GiB)) if limit else None
        )
        release = cfg.server.sim_version or profile.sglang_version
        ram = int(hw.host_ram_available_gb * 1e9)
        return HostBound(ram, "the simulator profile's", cgroup, ranks, release)
    available = meminfo_available(proc / "meminfo")
    if available is None:
        return None
    try:
        limits = cgroup_limits(proc, root)
    except (CgroupError, OSError):
        limits = None  # SGLang then checks an explicit size against host RAM alone, and so do we
    version = sglang_version(cfg.server.command)
    return HostBound(available, "this machine's", headroom_of(limits or []), ranks, version)


def sglang_version(command: tuple[str, ...]) -> str | None:
    """The SGLang release the study's Python has installed, None when the command does not run
    SGLang or its version cannot be read."""
    python = sglang_python(command)
    if python is None:
        return None
    try:
        done = subprocess.run(
            [python, "-c", _SGLANG_VERSION],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = done.stdout.strip()
    if done.returncode != 0 or not text:
        return None
    return text


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
