"""The host memory bound of a host cache: the memory cgroup read as SGLang 0.5.23 reads it (v2
and v1, nested paths, `max`, missing files, a cgroup namespace), over fake trees in tmp_path, and
the bound each release's rule gives; one oracle test runs SGLang's own reader on the same tree."""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

import pytest

from autotune.config.studyfile import load_study
from autotune.server import hostmem
from autotune.server.hostcheck import hicache_refusal, host_bound
from autotune.server.hostmem import (
    GiB,
    cgroup_limits,
    headroom_of,
    parse_limit,
    parse_memberships,
    parse_meminfo_available,
    parse_mountinfo,
    reads_cgroup,
)
from tests.oracle import run_in_sglang
from tests.simstudy import small_steady

V2_MOUNT = "41 31 0:38 {root} {point} rw,relatime - cgroup2 cgroup2 rw\n"
V1_MOUNT = "35 31 0:32 {root} {point} rw,relatime - cgroup cgroup rw,memory\n"
V1_CPU = "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"


def _tree(
    tmp: Path,
    membership: str,
    mountinfo: str,
    files: dict[str, str],
) -> Path:
    """A fake /proc/self (cgroup, mountinfo) under tmp/proc and files under tmp (paths given
    from the fake root)."""
    proc = tmp / "proc" / "self"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text(membership)
    (proc / "mountinfo").write_text(mountinfo)
    for path, text in files.items():
        f = tmp / path.lstrip("/")
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)
    return tmp / "proc"


def _v2_dir(
    base: str, limit: str, current: int, cache: int = 0, high: str = "max"
) -> dict[str, str]:
    return {
        f"{base}/memory.max": f"{limit}\n",
        f"{base}/memory.high": f"{high}\n",
        f"{base}/memory.current": f"{current}\n",
        f"{base}/memory.min": "0\n",
        f"{base}/memory.stat": f"anon {current}\nactive_file {cache}\ninactive_file 0\n",
    }


def test_v2_limit_of_a_nested_cgroup_less_its_usage_and_page_cache(tmp_path: Path) -> None:
    base = "/sys/fs/cgroup/kubepods/pod1/ctr"
    proc = _tree(
        tmp_path,
        "0::/kubepods/pod1/ctr\n",
        V2_MOUNT.format(root="/", point="/sys/fs/cgroup"),
        _v2_dir(base, str(64 * GiB), 6 * GiB, cache=2 * GiB),
    )
    limits = cgroup_limits(proc, tmp_path)
    assert limits is not None
    least = headroom_of(limits)
    assert least is not None
    assert least.headroom == 60 * GiB  # 64 − (6 − 2 of page cache)
    assert least.label == f"cgroup v2 memory.max at {tmp_path}{base}/memory.max"
    assert "= 64.0 GiB (60.0 GiB free)" in least.describe()


def test_a_parent_limit_smaller_than_the_cgroups_own_bounds_it(tmp_path: Path) -> None:
    files = {
        **_v2_dir("/sys/fs/cgroup/a/b", "max", GiB),
        **_v2_dir("/sys/fs/cgroup/a", str(8 * GiB), 3 * GiB),
    }
    proc = _tree(tmp_path, "0::/a/b\n", V2_MOUNT.format(root="/", point="/sys/fs/cgroup"), files)
    least = headroom_of(cgroup_limits(proc, tmp_path) or [])
    assert least is not None and least.headroom == 5 * GiB
    assert least.label.endswith("/sys/fs/cgroup/a/memory.max")


def test_memory_high_counts_as_a_limit_too(tmp_path: Path) -> None:
    files = _v2_dir("/sys/fs/cgroup/x", "max", GiB, high=str(4 * GiB))
    proc = _tree(tmp_path, "0::/x\n", V2_MOUNT.format(root="/", point="/sys/fs/cgroup"), files)
    least = headroom_of(cgroup_limits(proc, tmp_path) or [])
    assert least is not None and least.headroom == 3 * GiB and "memory.high" in least.label


def test_max_everywhere_and_a_root_without_files_is_no_limit(tmp_path: Path) -> None:
    files = _v2_dir("/sys/fs/cgroup/x", "max", GiB)
    proc = _tree(tmp_path, "0::/x\n", V2_MOUNT.format(root="/", point="/sys/fs/cgroup"), files)
    assert cgroup_limits(proc, tmp_path) == []
    assert headroom_of([]) is None


def test_v1_memory_controller_limit(tmp_path: Path) -> None:
    base = "/sys/fs/cgroup/memory/docker/abc"
    files = {
        f"{base}/memory.limit_in_bytes": f"{16 * GiB}\n",
        f"{base}/memory.usage_in_bytes": f"{4 * GiB}\n",
        f"{base}/memory.stat": f"cache 1\ntotal_active_file {GiB}\ntotal_inactive_file 0\n",
        "/sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
        "/sys/fs/cgroup/memory/memory.usage_in_bytes": f"{5 * GiB}\n",
        "/sys/fs/cgroup/memory/memory.stat": "total_active_file 0\ntotal_inactive_file 0\n",
    }
    proc = _tree(
        tmp_path,
        "4:memory:/docker/abc\n3:cpu:/\n",
        V1_CPU + V1_MOUNT.format(root="/", point="/sys/fs/cgroup/memory"),
        files,
    )
    least = headroom_of(cgroup_limits(proc, tmp_path) or [])
    assert least is not None and least.headroom == 13 * GiB
    assert least.label.startswith("cgroup v1 memory.limit_in_bytes at ")


def test_a_cgroup_namespace_shows_the_membership_from_its_own_root(tmp_path: Path) -> None:
    """Inside a cgroup namespace /proc/self/cgroup says `0::/`, while mountinfo names the host
    side subtree as the mount's root: the folder is the mount point itself."""
    files = _v2_dir("/sys/fs/cgroup", str(32 * GiB), 2 * GiB)
    proc = _tree(
        tmp_path, "0::/\n", V2_MOUNT.format(root="/docker/abc", point="/sys/fs/cgroup"), files
    )
    least = headroom_of(cgroup_limits(proc, tmp_path) or [])
    assert least is not None and least.headroom == 30 * GiB


def test_no_procfs_is_no_cgroup_and_an_unmounted_membership_is_an_error(tmp_path: Path) -> None:
    assert cgroup_limits(tmp_path / "nowhere", tmp_path) is None
    proc = _tree(tmp_path, "0::/x\n", V2_MOUNT.format(root="/", point="/sys/fs/cgroup"), {})
    with pytest.raises(hostmem.CgroupError):
        cgroup_limits(proc, tmp_path)


def test_the_pure_parsers() -> None:
    assert parse_limit("max\n") is None and parse_limit("1024\n") == 1024
    assert parse_meminfo_available("MemTotal: 10 kB\nMemAvailable:  4 kB\n") == 4096
    assert parse_memberships("4:memory,hugetlb:/a\n0::/b\n") == {
        "cgroup": PurePosixPath("/a"),
        "cgroup2": PurePosixPath("/b"),
    }
    (mount,) = parse_mountinfo(
        "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"
        + V2_MOUNT.format(root="/", point=r"/sys/fs/cg\040x")
    )
    assert mount.filesystem == "cgroup2" and mount.point == PurePosixPath("/sys/fs/cg x")


def _bound(limit_gib: float | None, version: str, ranks: int = 8) -> hostmem.HostBound:
    label = "cgroup v2 memory.max at /sys/fs/cgroup/memory.max"
    cgroup = hostmem.Limit(label, int(limit_gib * GiB)) if limit_gib else None
    return hostmem.HostBound(int(900e9), "this machine's", cgroup, ranks, version)


def test_the_bound_is_min_of_ram_and_cgroup_less_the_reserve_over_the_ranks() -> None:
    b = _bound(64, "0.5.23")
    assert b.per_rank_bytes == (64 - 10) * GiB // 8
    assert b.fits(7) and not b.fits(8)
    line = b.refusal(8)
    assert line.startswith("hicache_size = 8 GB per rank × 8 ranks = 64 GB of host cache")
    assert "cgroup v2 memory.max at /sys/fs/cgroup/memory.max = 64.0 GiB" in line
    assert "SGLang 0.5.23 refuses it at startup" in line
    assert line.endswith("Lower hicache_size to at most 7, or give the container more memory")
    assert _bound(None, "0.5.23").per_rank_bytes == (int(900e9) - 10 * GiB) // 8
    assert b.refusal(0) == "" and b.refusal(7) == ""


def test_a_release_that_does_not_read_the_cgroup_is_ended_by_the_oom_killer() -> None:
    assert not reads_cgroup("0.5.9") and reads_cgroup("0.5.23") and reads_cgroup(None)
    line = _bound(64, "0.5.9").refusal(8)
    assert "SGLang 0.5.9 does not read the cgroup: the container's OOM killer ends a rank" in line


SGLANG_HEADROOM = """
import json, sys
from pathlib import Path
from sglang.srt.mem_cache.host_memory import _cgroup_memory_headroom
print(json.dumps(_cgroup_memory_headroom(Path(sys.argv[1]))))
"""


@pytest.mark.sglang
def test_sglangs_own_reader_gives_the_same_headroom(tmp_path: Path, sglang_python: Path) -> None:
    """SGLang 0.5.23 `mem_cache/host_memory.py: _cgroup_memory_headroom` on the same fake tree
    (mount points absolute, as SGLang reads them from the root)."""
    point = f"{tmp_path}/sys/fs/cgroup"
    files = {
        **_v2_dir(f"{point}/a/b", "max", GiB, cache=GiB // 2),
        **_v2_dir(f"{point}/a", str(8 * GiB), 3 * GiB, cache=GiB, high=str(9 * GiB)),
    }
    proc = _tree(tmp_path / "t", "0::/a/b\n", V2_MOUNT.format(root="/", point=point), {})
    for path, text in files.items():
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(text)
    ours = headroom_of(cgroup_limits(proc, Path("/")) or [])
    theirs = json.loads(run_in_sglang(sglang_python, SGLANG_HEADROOM, str(proc)))
    assert ours is not None and ours.headroom == theirs == 6 * GiB  # 8 − (3 − 1 of page cache)
    Path(f"{point}/a/b/memory.min").write_text(f"{GiB}\n")  # protected below: no cache credit
    ours = headroom_of(cgroup_limits(proc, Path("/")) or [])
    theirs = json.loads(run_in_sglang(sglang_python, SGLANG_HEADROOM, str(proc)))
    assert ours is not None and ours.headroom == theirs == 5 * GiB


REAL_STUDY = """
[server]
backend = "sglang"
command = ["python3", "-m", "sglang.launch_server"]

[server.flags]
model-path = "org/model"
tp-size = 4

[search]
mem_fraction_static = { low = 0.85, high = 0.9, step = 0.01 }
hicache_size = { choices = [0, 8, 16] }

""" + small_steady(1, input_len=200, output_len=4, concurrency=2)


def test_the_real_backend_reads_this_machines_meminfo_and_cgroup(tmp_path: Path) -> None:
    """`host_bound` on the real backend: MemAvailable and the process's cgroup from the given
    /proc and root; a trial over the bound gets its refusal, one under it none."""
    path = tmp_path / "s.toml"
    path.write_text(REAL_STUDY)
    cfg = load_study(path)
    files = _v2_dir("/sys/fs/cgroup/box", str(64 * GiB), 0)
    proc = _tree(tmp_path, "0::/box\n", V2_MOUNT.format(root="/", point="/sys/fs/cgroup"), files)
    (proc / "meminfo").write_text(f"MemTotal: {2**30} kB\nMemAvailable: {500 * 2**20} kB\n")
    bound = host_bound(cfg, proc=proc, root=tmp_path)
    assert bound is not None and bound.ranks == 4 and bound.available == 500 * GiB
    assert bound.per_rank_bytes == 54 * GiB // 4  # the cgroup's 64 GiB, not the 500 available
    over = hicache_refusal(cfg, {"hicache_size": 16}, bound)
    assert over.startswith("hicache_size = 16 GB per rank × 4 ranks = 64 GB of host cache")
    assert f"cgroup v2 memory.max at {tmp_path}/sys/fs/cgroup/box/memory.max = 64.0 GiB" in over
    assert "this machine's 536.9 GB of host RAM available" in over
    assert hicache_refusal(cfg, {"hicache_size": 8}, bound) == ""
    assert hicache_refusal(cfg, {"hicache_size": 0}, bound) == ""
    two = REAL_STUDY.replace("tp-size = 4", "tp-size = 4\nnnodes = 2")
    path.write_text(two.replace('["python3"', '["srun", "--nodes=2", "python3"'))
    two_nodes = host_bound(load_study(path), proc=proc, root=tmp_path)
    assert two_nodes is not None and two_nodes.ranks == 2  # ranks on this host: 4 over 2 nodes
    (proc / "meminfo").unlink()
    assert host_bound(cfg, proc=proc, root=tmp_path) is None  # no meminfo: nothing checked
