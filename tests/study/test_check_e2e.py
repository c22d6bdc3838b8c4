"""`autotune check` end to end through the simulator: go on the shipped kimi study, no-go for a
port another process holds, a log whose P line is reworded (an unknown format), a disk too small
for the night's logs, a host cache over the host memory bound and a `/server_info` of the wrong
shape; and `run` after `check` neither launches the baseline again nor times its ETA without the
check's startup."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest

from autotune.config.studyfile import load_study
from autotune.record.stored import study_record
from autotune.record.view import view
from autotune.review.checktable import check_text
from autotune.server.gpu import GiB
from autotune.server.hostmem import HostBound
from autotune.sim.gpustate import write_holder
from autotune.study.check import run_check
from autotune.study.progress import duration
from autotune.study.storage import default_storage_url
from autotune.trial.live import LiveLauncher, live_launcher
from tests import simstudy
from tests.simstudy import sim_study

pytestmark = pytest.mark.e2e


def _study(folder: Path, *, flags: str = "", port: int | None = None, n_trials: int = 3) -> Path:
    text = sim_study(n_trials=n_trials, flags=simstudy.KIMI_FLAGS + ("\n" + flags if flags else ""))
    if port is not None:
        text = text.replace('backend = "sim"\n', f'backend = "sim"\nport = {port}\n', 1)
    path = folder / "chk.toml"
    path.write_text(text)
    return path


def _check(config: Path) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    done = simstudy.run(config, "check", timeout=240)
    return done, time.monotonic() - t0


def _trials(folder: Path, name: str = "chk") -> list[optuna.trial.FrozenTrial]:
    url = f"sqlite:///{folder / 'results' / name / 'study.db'}"
    return optuna.load_study(study_name=name, storage=url).get_trials()


def _no_go(out: str, reading: str) -> str:
    """The one-line no-go of `reading` (its reason and its fix)."""
    line = next((x for x in out.splitlines() if x.startswith(f"no-go: {reading}")), "")
    assert line, out
    assert "; fix: " in line, line
    return line


def test_check_kimi_on_the_simulator_is_go(no_leftovers: Path) -> None:
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "autotune", "check", "--study", "kimi", "--backend", "sim",
         "--results-dir", str(no_leftovers / "results")],
        capture_output=True, text=True, timeout=240, cwd=no_leftovers, start_new_session=True,
    )  # fmt: skip
    wall = time.monotonic() - t0
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "NO-GO" not in out and out.rstrip().splitlines()[-1].startswith("GO:"), out
    readings = (
        "SGLang version", "log format", "ledger p_gib", "ledger kv_gib", "HTTP /server_info",
        "HTTP /flush_cache", "HTTP /generate", "GPU memory after the teardown",
        "disk for the logs", "launches", "night",
    )  # fmt: skip
    for reading in readings:
        assert re.search(rf"^{re.escape(reading)}.*\s go\s", out, re.M), (reading, out)
    assert "on 8/8 ranks" in out
    trials = _trials(no_leftovers, "kimi")
    assert len(trials) == 1 and trials[0].state == optuna.trial.TrialState.COMPLETE
    assert trials[0].params == {
        "mem_fraction_static": 0.88, "max_running_requests": 48, "hicache_size": 48,
    }  # fmt: skip
    study = optuna.load_study(
        study_name="kimi", storage=default_storage_url(no_leftovers / "results" / "kimi")
    )
    check = study_record(study).check
    assert check is not None and check.trial == 0 and check.startup_s > 0
    assert wall < 120, wall


def test_a_baseline_that_runs_out_of_memory_is_go_and_stored_as_the_searchs_first_fact(
    no_leftovers: Path,
) -> None:
    """The shipped demo starts from a setting that runs out of memory under load: the failed
    requests are the server's death, not the API's, and the night starts below it."""
    done = subprocess.run(
        [sys.executable, "-m", "autotune", "check", "--study", "demo",
         "--results-dir", str(no_leftovers / "results")],
        capture_output=True, text=True, timeout=240, cwd=no_leftovers, start_new_session=True,
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert re.search(r"^baseline launch\s+go\s+runtime_oom", out, re.M), out
    assert re.search(
        r"^workload API \(generate\)\s+go\s+answered until the server ran out", out, re.M
    )
    assert out.rstrip().splitlines()[-1].startswith("GO:"), out
    (trial,) = _trials(no_leftovers, "demo")
    assert trial.state == optuna.trial.TrialState.COMPLETE


def test_a_port_held_by_another_process_is_no_go(no_leftovers: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        done, _ = _check(_study(no_leftovers, port=port))
    assert done.returncode == 1, done.stdout + done.stderr
    line = _no_go(done.stdout, "server port")
    assert f"port {port}" in line and "in use" in line
    assert not (no_leftovers / "results" / "chk" / "trials").exists()  # nothing was launched
    assert _trials(no_leftovers) == []


def test_gpu_memory_held_by_a_foreign_process_is_no_go(no_leftovers: Path) -> None:
    config = _study(no_leftovers)
    gpu_dir = no_leftovers / "results" / "chk" / "sim-gpu"
    gpu_dir.mkdir(parents=True)
    stranger = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        write_holder(gpu_dir, stranger.pid, {0: 4 * GiB}, {i: 96 * GiB for i in range(8)})
        done, _ = _check(config)
        assert stranger.poll() is None  # never touched
    finally:
        stranger.kill()
        stranger.wait()
    assert done.returncode == 1, done.stdout + done.stderr
    line = _no_go(done.stdout, "GPU memory before the launch")
    assert f"pid {stranger.pid}" in line and "did not start" in line
    assert _trials(no_leftovers) == []


def test_a_log_in_an_unknown_format_is_no_go(no_leftovers: Path) -> None:
    done, _ = _check(_study(no_leftovers, flags='sim-fault = "reword-log"'))
    assert done.returncode == 1, done.stdout + done.stderr
    line = _no_go(done.stdout, "ledger p_gib")
    assert "not shown" in line and "missing on TP0" in line
    assert "SGLang release whose log autotune reads" in line


def test_a_server_info_of_the_wrong_shape_is_no_go(no_leftovers: Path) -> None:
    done, _ = _check(_study(no_leftovers, flags='sim-fault = "bad-server-info"'))
    assert done.returncode == 1, done.stdout + done.stderr
    line = _no_go(done.stdout, "HTTP /server_info or /get_server_info")
    assert "no `internal_states` list" in line


def test_a_server_refusing_every_request_is_no_go_with_its_answer(no_leftovers: Path) -> None:
    done, _ = _check(_study(no_leftovers, flags='sim-fault = "refuse-generate"'))
    assert done.returncode == 1, done.stdout + done.stderr
    line = _no_go(done.stdout, "workload API")
    assert "error rate 1.000" in line and "HTTP 500" in line, line
    assert "Internal Server Error" in line, line


def _in_process(folder: Path, *, config: Path | None = None, go: bool = False, **kw: object) -> str:
    """`check` run in this process on the study at `config` (the default study when None); its
    report's text, the go it expects asserted."""
    cfg = load_study(config or _study(folder))
    study_folder = folder / "results" / cfg.name
    study_folder.mkdir(parents=True)
    report = run_check(
        cfg,
        study_folder,
        default_storage_url(study_folder),
        live_launcher,
        lambda launcher: launcher.probe if isinstance(launcher, LiveLauncher) else None,
        **kw,  # type: ignore[arg-type]
    )
    assert report.go is go
    return check_text(cfg, report)


def test_a_disk_too_small_for_the_nights_logs_is_no_go(no_leftovers: Path) -> None:
    out = _in_process(no_leftovers, disk_free=lambda path: 100 * 2**20)
    line = _no_go(out, "disk for the logs")
    assert "0.10 GiB free" in line and "3 trials" in line and "another --results-dir" in line


def test_a_host_cache_over_the_host_memory_is_no_go(no_leftovers: Path) -> None:
    small = HostBound(int(100e9), "this machine's", None, 8, "0.5.23")
    out = _in_process(no_leftovers, host=lambda: small)
    line = _no_go(out, "host RAM for the host cache")
    assert "over the host memory bound" in line and "lower hicache_size" in line
    assert not (no_leftovers / "results" / "chk" / "trials").exists()


def test_run_after_check_does_not_launch_the_baseline_again_and_times_its_eta_by_it(
    no_leftovers: Path,
) -> None:
    config = _study(no_leftovers, n_trials=2)
    done, _ = _check(config)
    assert done.returncode == 0, done.stdout + done.stderr
    url = default_storage_url(no_leftovers / "results" / "chk")
    check = study_record(optuna.load_study(study_name="chk", storage=url)).check
    assert check is not None and check.trial == 0
    again = simstudy.run(config, "check")
    assert again.returncode == 2 and "baseline measured already (trial 0)" in again.stderr
    assert len(again.stderr.strip().splitlines()) == 1, again.stderr
    ran = simstudy.run(config, "run")
    assert ran.returncode == 0, ran.stdout + ran.stderr
    trials = [t for t in _trials(no_leftovers) if t.state.is_finished()]
    assert len(trials) == 2
    baseline = trials[0].params
    assert [t.number for t in trials if t.params == baseline] == [0]
    # the check's short load gave the baseline its pool, ledger and stress peak, but not a
    # throughput or a growth of the study's workload: the search and the review leave them out
    checked, night = (view(t) for t in trials)
    assert checked.capacity_tokens and checked.stress_peak_gib is not None
    assert checked.throughput_tok_s is None and checked.growth_gib is None
    assert night.throughput_tok_s
    assert "trial 1/2" not in ran.stdout  # the check's launch counts: the run starts at 2/2
    started = re.search(r"trial 2/2 \(#1\) startup \S+ \(expected (\S+)\)", ran.stdout)
    assert started is not None, ran.stdout
    assert started.group(1) == duration(check.startup_s)
    # the first ETA is the check's own trial (its stress rounds timed by the check's round, as
    # the check's plan times them): it was a lower bound that left the stress phase out
    one = re.search(r"^one trial +go +(\S+)$", done.stdout, re.M)
    eta = re.search(r"trial 2/2 \(#1\) launch .* ETA (\S+)$", ran.stdout, re.M)
    assert one is not None and eta is not None, done.stdout + ran.stdout
    assert eta.group(1) == one.group(1)


def test_a_preflight_no_go_writes_nothing(no_leftovers: Path) -> None:
    """SGLang missing for the study's Python: no-go in one line, and the results folder is left
    as it was, so a rehearsal on the simulator under the same name still works after."""
    config = _study(no_leftovers)
    missing = 'command = ["/nonexistent/python", "-m", "sglang.launch_server"]'
    text = config.read_text().replace('backend = "sim"\n', 'backend = "sglang"\n', 1)
    config.write_text(text.replace("[server]\n", f"[server]\n{missing}\n", 1))
    done, _ = _check(config)
    assert done.returncode == 1, done.stdout + done.stderr
    _no_go(done.stdout, "preflight")
    assert not (no_leftovers / "results").exists()


def test_host_cache_sizes_over_the_bound_are_named_beside_those_within(
    no_leftovers: Path,
) -> None:
    """The row said every size was "within the bound" and, in the same breath, that 96 GB was
    over it: the sizes within and those over are now named apart."""
    search = (
        "[search]\nmem_fraction_static = { low = 0.88, high = 0.94, step = 0.03 }\n"
        "max_running_requests = 48\nhicache_size = { choices = [24, 96] }\n\n"
        "[baseline]\nmem_fraction_static = 0.88\nhicache_size = 24"
    )
    config = no_leftovers / "chk.toml"
    config.write_text(sim_study(n_trials=3, flags=simstudy.KIMI_FLAGS, search=search))
    bound = HostBound(int(8 * 60e9 + 11 * 2**30), "this machine's", None, 8, "0.5.23")
    assert bound.fits(24) and not bound.fits(96)
    text = _in_process(no_leftovers, config=config, go=True, host=lambda: bound)
    row = next(x for x in text.splitlines() if x.startswith("host RAM for the host cache"))
    assert "24 GB per rank within the bound" in row and "96 GB over it" in row
    assert "up to 96" not in row and " go " in row
