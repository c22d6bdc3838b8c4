"""How much host memory a hierarchical host cache may pin on this host, by the SGLang release's
own rule: host RAM available bounded by the container's memory cgroup, over all ranks.

SGLang 0.5.23 reads the cgroup itself (`mem_cache/host_memory.py`: `_cgroup_memory_headroom`,
`available_host_memory_bytes`; `mem_cache/pool_host/base.py`: `host_memory_budget_bytes`,
`HostKVCache._allocate_host_buffer`):

* the process's memberships come from `/proc/self/cgroup` (`0::PATH` is v2; a line whose
  controllers name `memory` is v1), its mounts from `/proc/self/mountinfo`; the cgroup's folder
  is the mount point joined with the membership relative to the mount's root;
* in that folder and every parent up to the mount, each limit file (v2 `memory.max` and
  `memory.high`, v1 `memory.limit_in_bytes`) that is not `max` gives a headroom
  `limit − (usage − page cache)`: usage from `memory.current` (v1 `memory.usage_in_bytes`), page
  cache `active_file + inactive_file` of `memory.stat` (v1 `total_active_file +
  total_inactive_file`; v2 counts none when a descendant sets `memory.min`); the cgroup's
  headroom is the least of them, None when no file sets a limit;
* available = min(psutil's available RAM, the cgroup headroom), logged as `HiCache memory
  headroom: host %.1f GiB, cgroup %.1f GiB`; each rank's budget is `(available − 10 GiB) //
  ranks on this host`, and a pool of `--hicache-size` GB (decimal) per rank above it is refused
  at startup (`Not enough host memory available. Requesting …`).

SGLang 0.5.9 reads no cgroup (its `mem_cache/memory_pool_host.py`): each rank checks its pool
against the machine's available RAM − 10 GiB, undivided, and the kernel's OOM killer (the
host's, or the container's when its cgroup limit is the smaller) ends a rank once all ranks'
pinned pools do not fit. Both releases are held here to one bound on the ranks' total,
`min(available, cgroup headroom) − 10 GiB`; what differs is who stops the launch, which the
refusal says.

Parsing is pure (`parse_*`, `headroom_of`); the files are read at the edge (`cgroup_headroom`,
`meminfo_available`), whose roots are arguments so tests hand them a fake tree.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

GiB = 2**30
RESERVE_BYTES = 10 * GiB
"""Host RAM SGLang leaves free when sizing host pools (`HICACHE_HOST_MEMORY_RESERVE_BYTES`)."""

CGROUP_RULE_SINCE = (0, 5, 23)
"""The first release known to read the cgroup (0.5.9 does not); a release autotune cannot tell
is held to the newer rule, so a launch the container would kill is refused either way."""

_LIMITS = {"cgroup2": ("memory.max", "memory.high"), "cgroup": ("memory.limit_in_bytes",)}
_USAGE = {"cgroup2": "memory.current", "cgroup": "memory.usage_in_bytes"}
_PAGE_CACHE = {
    "cgroup2": ("active_file", "inactive_file"),
    "cgroup": ("total_active_file", "total_inactive_file"),
}
_VERSION = {"cgroup2": "v2", "cgroup": "v1"}


class CgroupError(RuntimeError):
    """The process's memory cgroup cannot be located in the mounted cgroup filesystems, or a
    limit's usage cannot be read (SGLang 0.5.23 then refuses to auto-size the host cache)."""


@dataclass(frozen=True)
class Mount:
    """One cgroup mount of `/proc/self/mountinfo`: its filesystem (`cgroup2` or `cgroup`), the
    cgroup it shows (`root`), where it is mounted and its super options (v1's controllers)."""

    filesystem: str
    root: PurePosixPath
    point: PurePosixPath
    options: tuple[str, ...]


@dataclass(frozen=True)
class Limit:
    """One limit that bounds the process: where it was read (`cgroup v2 memory.max at
    /sys/fs/cgroup/x/memory.max`, or the simulator profile's key), the limit and the usage it is
    charged (page cache taken off), in bytes; `headroom` is what is left under it."""

    label: str
    limit: int
    usage: int = 0

    @property
    def headroom(self) -> int:
        """Bytes left under this limit (never below 0)."""
        return max(0, self.limit - self.usage)

    def describe(self) -> str:
        """`cgroup v2 memory.max at /sys/fs/cgroup/x/memory.max = 64.0 GiB (60.0 GiB free)`."""
        return f"{self.label} = {self.limit / GiB:.1f} GiB ({self.headroom / GiB:.1f} GiB free)"


def parse_memberships(text: str) -> dict[str, PurePosixPath]:
    """`/proc/self/cgroup` → {"cgroup2": path} for the unified line (`0::/x`) and {"cgroup":
    path} for the v1 line whose controllers include `memory`."""
    out: dict[str, PurePosixPath] = {}
    for line in text.splitlines():
        if line.count(":") < 2:
            continue
        _, controllers, path = line.split(":", 2)
        if not controllers:
            out["cgroup2"] = PurePosixPath(path)
        elif "memory" in controllers.split(","):
            out["cgroup"] = PurePosixPath(path)
    return out


def _unescape(value: str) -> str:
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m[1], 8)), value)


def parse_mountinfo(text: str) -> list[Mount]:
    """The cgroup mounts of `/proc/self/mountinfo` (`cgroup2`, and v1 `cgroup` ones), in order."""
    mounts = []
    for line in text.splitlines():
        if " - " not in line:
            continue
        before, after = line.split(" - ", 1)
        tail, head = after.split(), before.split()
        if len(tail) < 3 or len(head) < 5 or tail[0] not in _LIMITS:
            continue
        mounts.append(
            Mount(
                filesystem=tail[0],
                root=PurePosixPath(_unescape(head[3])),
                point=PurePosixPath(_unescape(head[4])),
                options=tuple(tail[2].split(",")),
            )
        )
    return mounts


def parse_limit(text: str) -> int | None:
    """A limit file's value in bytes; None for `max` (unlimited)."""
    value = text.strip()
    return None if value == "max" else int(value)


def parse_memory_stat(text: str) -> dict[str, int]:
    """`memory.stat` as {key: bytes}."""
    out = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2:
            out[parts[0]] = int(parts[1])
    return out


def parse_meminfo_available(text: str) -> int | None:
    """`MemAvailable` of `/proc/meminfo` in bytes (what psutil reports as available on Linux)."""
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def cgroup_folders(
    memberships: Mapping[str, PurePosixPath], mounts: Sequence[Mount]
) -> list[tuple[str, PurePosixPath, PurePosixPath]]:
    """(filesystem, the cgroup's folder, its mount point) for each membership a mount shows, as
    0.5.23 resolves it: the membership relative to the mount's root; under a cgroup namespace
    (membership not below a root other than `/`) relative to `/`."""
    out = []
    for m in mounts:
        membership = memberships.get(m.filesystem)
        if membership is None or (m.filesystem == "cgroup" and "memory" not in m.options):
            continue
        if membership.is_relative_to(m.root):
            relative = membership.relative_to(m.root)
        elif m.root != PurePosixPath("/"):
            relative = membership.relative_to("/")
        else:
            continue
        if ".." in relative.parts:
            raise CgroupError(f"cannot resolve the cgroup path {membership}")
        out.append((m.filesystem, m.point / relative, m.point))
    return out


def headroom_of(limits: Sequence[Limit]) -> Limit | None:
    """The limit that leaves the least headroom, None when no file sets one."""
    return min(limits, key=lambda x: x.headroom, default=None)


def cgroup_limits(proc: Path = Path("/proc"), root: Path = Path("/")) -> list[Limit] | None:
    """Every memory limit that bounds this process (its cgroup and each parent), read as
    SGLang 0.5.23 reads them; None where there is no procfs (not Linux). `root` is where the
    mount points of `proc/self/mountinfo` are found (`/`, or a fake tree in tests). Raises
    `CgroupError` when a membership shows in no mount, or a limit's usage cannot be read."""
    try:
        memberships = parse_memberships((proc / "self/cgroup").read_text())
        mounts = parse_mountinfo((proc / "self/mountinfo").read_text())
    except FileNotFoundError:
        return None
    limits: list[Limit] = []
    resolved = False
    for filesystem, folder, point in cgroup_folders(memberships, mounts):
        directory = root / folder.relative_to("/")
        top = root / point.relative_to("/")
        if not directory.is_dir():
            continue
        resolved = True
        while True:
            limits += _limits_in(filesystem, directory)
            if directory == top or directory == directory.parent:
                break
            directory = directory.parent
    if memberships and not resolved:
        raise CgroupError("cannot locate the process's memory cgroup in the mounted cgroups")
    return limits


def _limits_in(filesystem: str, directory: Path) -> list[Limit]:
    out = []
    usage: int | None = None
    for name in _LIMITS[filesystem]:
        try:
            limit = parse_limit((directory / name).read_text())
        except FileNotFoundError:
            continue  # the hierarchy's root has no limit files
        except ValueError as exc:
            raise CgroupError(f"{directory / name}: not a number ({exc})") from None
        if limit is None:
            continue
        if usage is None:
            usage = _usage(filesystem, directory)
        label = f"cgroup {_VERSION[filesystem]} {name} at {directory / name}"
        out.append(Limit(label, limit, usage))
    return out


def _usage(filesystem: str, directory: Path) -> int:
    """Usage less the page cache the kernel can reclaim (none when a v2 descendant protects
    memory with `memory.min`, or its protection cannot be read)."""
    try:
        usage = int((directory / _USAGE[filesystem]).read_text())
        stat = parse_memory_stat((directory / "memory.stat").read_text())
        cache = sum(stat[k] for k in _PAGE_CACHE[filesystem])
    except (OSError, ValueError, KeyError) as exc:
        raise CgroupError(f"the usage under {directory} cannot be read ({exc})") from None
    if filesystem == "cgroup2" and cache > 0 and _protected_below(directory):
        cache = 0
    return max(0, usage - cache)


def _protected_below(directory: Path) -> bool:
    pending = [directory]
    try:
        while pending:
            for child in pending.pop().iterdir():
                if not child.is_dir() or child.is_symlink():
                    continue
                if int((child / "memory.min").read_text()) != 0:
                    return True
                pending.append(child)
    except (OSError, ValueError):
        return True
    return False


def meminfo_available(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """This machine's available RAM in bytes, None when /proc/meminfo cannot be read."""
    try:
        return parse_meminfo_available(meminfo.read_text())
    except (OSError, ValueError, IndexError):
        return None


def release_tuple(version: str | None) -> tuple[int, ...] | None:
    """`0.5.23` (or `0.5.23.post1`) → (0, 5, 23); None when it is not a version."""
    if not version:
        return None
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", version)
    return tuple(int(x) for x in m.groups()) if m else None


def reads_cgroup(version: str | None) -> bool:
    """Whether this SGLang release bounds host pools by the cgroup itself (0.5.23's rule; an
    unknown release is held to it)."""
    release = release_tuple(version)
    return release is None or release >= CGROUP_RULE_SINCE


@dataclass(frozen=True)
class HostBound:
    """The host memory a host cache of `ranks` ranks may pin: `available` bytes of host RAM
    (`whose`: this machine's, the simulator profile's), the cgroup limit that bounds it most (None
    without one) and the SGLang release whose rule applies."""

    available: int
    whose: str
    cgroup: Limit | None
    ranks: int
    version: str | None

    @property
    def usable(self) -> int:
        """min(host RAM available, the cgroup headroom), bytes."""
        if self.cgroup is None:
            return self.available
        return min(self.available, self.cgroup.headroom)

    @property
    def per_rank_bytes(self) -> int:
        """The largest pool one rank may pin: (usable − 10 GiB) // ranks (0.5.23's budget)."""
        return max(0, self.usable - RESERVE_BYTES) // max(1, self.ranks)

    @property
    def per_rank_gb(self) -> float:
        """`per_rank_bytes` in decimal GB, as `--hicache-size` is given."""
        return self.per_rank_bytes / 1e9

    def fits(self, hicache_gb: float) -> bool:
        """Whether `hicache_gb` GB per rank fits (0, no host cache, always does)."""
        return hicache_gb <= 0 or hicache_gb * 1e9 <= self.per_rank_bytes

    def _binding_cgroup(self) -> bool:
        return self.cgroup is not None and self.cgroup.headroom < self.available

    def source(self) -> str:
        """Where the bound came from, in words (host RAM in decimal GB, as host caches are
        given; a cgroup limit in GiB, as its file and SGLang's headroom line count it)."""
        host = f"{self.whose} {self.available / 1e9:.1f} GB of host RAM available"
        if self.cgroup is None or not self._binding_cgroup():
            return host
        return f"{self.cgroup.describe()}, under {host}"

    def stopper(self) -> str:
        """Who stops a launch above the bound under this release's rule."""
        release = f"SGLang {self.version}" if self.version else "SGLang"
        if reads_cgroup(self.version):
            return f"{release} refuses it at startup (Not enough host memory available)"
        if self._binding_cgroup():
            return (
                f"{release} does not read the cgroup: the container's OOM killer ends a rank "
                "while the pools are pinned"
            )
        return f"{release} refuses it, or the host's OOM killer ends a rank while it is pinned"

    def refusal(self, hicache_gb: float, name: str = "hicache_size", *, named: bool = True) -> str:
        """One line for a host cache above the bound ("" when it fits): the value (after
        `name = ` when `named`), the bound and where it came from, who would stop the launch,
        and the fix."""
        if self.fits(hicache_gb):
            return ""
        fix = "give the container more memory" if self._binding_cgroup() else "free host RAM"
        return (
            f"{f'{name} = ' if named else ''}{hicache_gb:g} GB per rank × {self.ranks} "
            f"rank{'s' if self.ranks != 1 else ''} = "
            f"{hicache_gb * self.ranks:g} GB of host cache is over the host memory bound: "
            f"{self.source()}, less the 10 GiB reserve, leaves {self.per_rank_gb:.1f} GB per "
            f"rank; {self.stopper()}. Lower {name} to at most {int(self.per_rank_gb)}, or {fix}"
        )
