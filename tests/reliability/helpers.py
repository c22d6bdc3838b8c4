"""A study run under a fault, and what the reliability tests check after it.

`World` owns one test's folder: it writes the study file, runs `autotune` as a real process in
its own session, starts foreign processes (a `sleep`, a simulator) that autotune must not touch,
and at the end asserts that nothing autotune started is left and every foreign process lives.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sqlite3
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial

from autotune.server import pidfile
from autotune.testing import audit

NAME = "rel"
STUDY = """
[server]
backend = "sim"
sim_profile = "kimi-k2.5-tp8-96g"
sim_time_scale = 30000
{server}

[server.flags]
model-path = "moonshotai/Kimi-K2.5"
tp-size = 8
{flags}

[server.limits]
startup_s = 30
stall_s = {stall_s}
workload_s = 30
stop_grace_s = 1.5
release_s = {release_s}
{limits}

[search]
mem_fraction_static = {{ low = 0.85, high = 0.97, step = 0.01 }}
max_running_requests = 48
{search}

[baseline]
mem_fraction_static = {baseline}

[workload]
input_len = 200
output_len = 4
request_timeout_s = 10
drain_timeout_s = 2
{workload}

[[workload.phases]]
kind = "steady"
concurrency = 2
duration_s = {duration}
{phases}

[budget]
n_trials = {n_trials}

[sampler]
name = "grid"
{tail}
"""

STRESS = """
[[workload.phases]]
kind = "stress"
rounds = 1
requests = 2
input_len = 9000
output_len = 4
"""

EAGLE = """
speculative-algorithm = "EAGLE3"
speculative-draft-model-path = "lightseekorg/kimi-k2.5-eagle3"
speculative-num-steps = 3
speculative-eagle-topk = 1
speculative-num-draft-tokens = 4
"""
"""The draft model: with it, 0.93 starts and then runs out of memory under the stress phase."""


@dataclass(frozen=True)
class Done:
    """How one `autotune` command ended."""

    rc: int
    out: str
    err: str


def hangup_default() -> None:
    """In a child about to run autotune: SIGHUP at its default action, as in a terminal's shell,
    even where the tests themselves run under `nohup` (which autotune honours by ignoring it)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@dataclass
class World:
    folder: Path
    sessions: set[int] = field(default_factory=set)
    foreign: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def results(self) -> Path:
        return self.folder / "results"

    @property
    def study_dir(self) -> Path:
        return self.results / NAME

    @property
    def gpu_dir(self) -> Path:
        return self.study_dir / "sim-gpu"

    @property
    def url(self) -> str:
        return f"sqlite:///{self.study_dir / 'study.db'}"

    def study(self, **values: object) -> Path:
        """Write the study file from STUDY with `values` for its fields. `stall_s` is 10 s by
        default, so that a loaded machine's pause is never read as a hang; a test about stalls
        asks for 1.5 s itself."""
        fields: dict[str, object] = dict(
            server="", flags="", search="", workload="", phases="", tail="", limits="",
            baseline=0.88, duration=0.5, n_trials=1, release_s=3, stall_s=10,
        )  # fmt: skip
        fields.update(values)
        path = self.folder / f"{NAME}.toml"
        path.write_text(STUDY.format(**fields))
        return path

    def start(self, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        """`autotune ARGS` in its own session, in the background."""
        cmd = [sys.executable, "-m", "autotune", *args]
        proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=self.folder,
            start_new_session=True,
            preexec_fn=hangup_default,
            env={**os.environ, **(env or {})},
        )
        self.sessions.add(proc.pid)
        return proc

    def autotune(self, *args: str, env: dict[str, str] | None = None, timeout: float = 120) -> Done:
        proc = self.start(*args, env=env)
        try:
            out, err = proc.communicate(timeout=timeout)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        return Done(proc.returncode, out, err)

    def run(self, *extra: str, env: dict[str, str] | None = None, timeout: float = 120) -> Done:
        """`autotune run` on the study file, results under the test's folder."""
        return self.autotune(*self.run_args(*extra), env=env, timeout=timeout)

    def run_args(self, *extra: str) -> list[str]:
        return [
            "run", "--config", str(self.folder / f"{NAME}.toml"),
            "--results-dir", str(self.results), *extra,
        ]  # fmt: skip

    def trials(self) -> list[FrozenTrial]:
        return optuna.load_study(study_name=NAME, storage=self.url).get_trials()

    def problems(self) -> list[str]:
        """Where the storage and the results folder disagree (lost or mis-recorded trials)."""
        return audit.problems(self.trials(), self.study_dir)

    def stranger(self, argv: list[str], **kw: object) -> subprocess.Popen[bytes]:
        """A foreign process: started here, in its own session; it must outlive every run."""
        proc: subprocess.Popen[bytes] = subprocess.Popen(  # type: ignore[call-overload]
            argv, start_new_session=True, stdin=subprocess.DEVNULL, **kw
        )
        self.foreign.append(proc)
        return proc

    def foreign_sleep(self) -> subprocess.Popen[bytes]:
        return self.stranger(["sleep", "600"])

    def foreign_listener(self) -> int:
        """A foreign process listening on a free local port; returns the port."""
        listener = self.stranger(
            [sys.executable, "-c", "import socket, time\ns = socket.socket()\n"
             "s.bind(('127.0.0.1', 0)); s.listen()\nprint(s.getsockname()[1], flush=True)\n"
             "time.sleep(600)"],
            stdout=subprocess.PIPE,
        )  # fmt: skip
        assert listener.stdout is not None
        return int(listener.stdout.readline())

    def leftovers(self) -> list[audit.Leftover]:
        return audit.leftovers(
            str(self.folder), sessions=self.sessions, spare={p.pid for p in self.foreign}
        )

    def finish(self) -> None:
        """The end of a test: foreign processes alive, nothing of ours left (killed if so)."""
        dead = [p.args for p in self.foreign if p.poll() is not None]
        left = self.leftovers()
        deadline = time.monotonic() + 5
        while left and time.monotonic() < deadline:  # a zombie about to be reaped
            time.sleep(0.1)
            left = self.leftovers()
        for leftover in left:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(leftover.pid, signal.SIGKILL)
        for p in self.foreign:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
            for stream in (p.stdout, p.stderr):
                if stream is not None:
                    stream.close()
        assert not dead, f"foreign processes were killed: {dead}"
        assert not left, f"processes left behind: {left}"


def one_line(text: str) -> str:
    """The single line an error prints; fails when there is more than one."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert len(lines) == 1, text
    return lines[0]


def wait_for_log(
    world: World, proc: subprocess.Popen[str], text: str, number: int = 0, timeout: float = 60
) -> Path:
    """Wait until trial `number`'s server.log holds `text` (the run must still be going)."""
    return wait_for_text(world.study_dir / f"trials/{number:04d}/server.log", proc, text, timeout)


def wait_for_text(log: Path, proc: subprocess.Popen[str], text: str, timeout: float = 60) -> Path:
    """Wait until the file `log` holds `text` (the process must still be going)."""
    deadline = time.monotonic() + timeout
    while text not in (log.read_text(errors="replace") if log.exists() else ""):
        assert time.monotonic() < deadline, f"{text!r} never appeared in {log}"
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.05)
    return log


def lock_storage(world: World, seconds: float) -> None:
    """Hold the study's SQLite file under `BEGIN EXCLUSIVE` from this (another) process for
    `seconds` (past SQLite's 5 s busy timeout): every write the study makes meanwhile fails as
    locked."""
    holder = sqlite3.connect(world.study_dir / "study.db", timeout=30)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        time.sleep(seconds)
    finally:
        holder.rollback()
        holder.close()


def server_record(world: World) -> pidfile.PidRecord:
    """The pidfile of the one server the run has up now."""
    [(_, record)] = pidfile.records(world.study_dir / "run")
    return record


def fill_disk(folder: Path) -> Path:
    """Write a ballast file in `folder` until its disk says `ENOSPC`: not a byte left."""
    ballast = folder / "ballast"
    fd = os.open(ballast, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1 << 20, 4096, 1):
            try:
                while os.write(fd, b"\0" * size):
                    pass
            except OSError as exc:
                assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return ballast
