"""Soak: a long study on the simulator with random faults, then a count of what was left behind.

    .venv/bin/python scripts/soak.py --trials 100 --seed 0
    .venv/bin/python scripts/soak.py --trials 45 --workers 3 --storage postgresql://… \
        --pg-restart "pg_ctlcluster 15 soak restart" --pg-restarts 3

The study runs in child processes (this script with --child) that wrap autotune's live
launcher, so each launch gets a fault drawn from a seeded `random.Random` (`draw_fault`): none,
one of the simulator's `--sim-fault` kinds, or one the child plays on the live server a moment
into its workload: SIGSTOP to the whole server (`freeze`), logrotate's copytruncate of its log
(`log-copytruncate`), `rm` of its log (`log-delete`), another process holding `BEGIN
EXCLUSIVE` on study.db for 15 s, past SQLite's 5 s busy timeout (`db-lock`, SQLite only),
someone else's SIGKILL or SIGTERM to the server (`kill-server`, `term-server`: `killed`),
autotune itself stopped for 8 s (`pause-harness`: `disturbed`), or a stranger listening on the
server's port before it binds (`port-stolen`: `machine_error`). The
child's wall clock (`time.time`) jumps hours and months both ways all night (`--no-clock-jumps`
to keep it true).

The parent plays the operator's night: now and then it SIGKILLs a child mid-trial or stops it
with SIGINT or SIGHUP (a dropped SSH session), and it restarts a child whenever it exits before
the budget is spent (a killed run, a run that stopped itself after repeated machine failures, a
run refused because `confirm` held the study), just as re-running the same command resumes a
study. Alongside, the whole time: a foreign `sleep`, and `status`, `report`, `export` and
`confirm` run in a loop against the live study (`--no-review` to leave them out); none may fail
other than with its documented one-line refusal, and none may touch the run's processes or
records (a server they stopped would show as a record that does not match its fault). With
`--workers N` (PostgreSQL `--storage`), N workers share the study, each on its own GPU group and
port, and `--pg-restart CMD` restarts the database `--pg-restarts` times while they run: workers
must carry on.

At the end it prints: orphans (live processes that mention the soak folder), lost trials
(`autotune.testing.audit.problems` per worker folder: trials left RUNNING, missing or
disagreeing records), wrong records (a recorded outcome the injected fault cannot cause), trials
counted twice, GPU memory still held, the budget, the review commands' results, outcome and
fault counts, the operator's events and the wall time. Exit code 0 when all of it holds.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.server.preflight import free_port  # noqa: E402
from autotune.testing import audit  # noqa: E402

NAME = "soak"
STUDY = """
[server]
backend = "sim"
sim_profile = "{profile}"
sim_time_scale = 30000

[server.flags]
model-path = "{model}"
tp-size = {tp}
{draft}

[server.limits]
startup_s = 30
stall_s = 4
workload_s = 30
stop_grace_s = 1.5
release_s = 5

[search]
mem_fraction_static = {{ low = 0.86, high = 0.94, step = 0.01 }}
max_running_requests = {{ choices = [32, 48] }}

[baseline]
mem_fraction_static = 0.88
max_running_requests = 48

[workload]
input_len = 200
output_len = 4
request_timeout_s = 10
drain_timeout_s = 2

[[workload.phases]]
kind = "steady"
concurrency = 2
duration_s = 0.6

[[workload.phases]]
kind = "stress"
rounds = 1
requests = 1
input_len = 9000
output_len = 4

[budget]
n_trials = {trials}

[storage]
heartbeat_s = 1
grace_s = 10

[sampler]
name = "tpe"
seed = {seed}
"""
SINGLE = {
    "profile": "kimi-k2.5-tp8-96g",
    "model": "moonshotai/Kimi-K2.5",
    "tp": 8,
    "draft": 'speculative-algorithm = "EAGLE3"\n'
    'speculative-draft-model-path = "lightseekorg/kimi-k2.5-eagle3"\n'
    "speculative-num-steps = 3\nspeculative-eagle-topk = 1\nspeculative-num-draft-tokens = 4",
}
"""One worker: Kimi-K2.5 on TP8 with an EAGLE-3 draft, so high fractions run out of memory."""
WORKERS = {
    "profile": "llama-3.1-70b-tp8-h100",
    "model": "meta-llama/Llama-3.1-70B-Instruct",
    "tp": 2,
    "draft": "",
}
"""Several workers: Llama-3.1-70B on TP2, one pair of the eight GPUs each."""
GROUPS = ("0,1", "2,3", "4,5", "6,7")

SIM = "sim"
PLAYED = "played"
FAULTS: tuple[tuple[str, str, float], ...] = (
    ("", SIM, 0.38),
    ("hang-weight-load", SIM, 0.05),
    ("health-empty", SIM, 0.05),
    ("health-fail", SIM, 0.05),
    ("crash-mid-load", SIM, 0.05),
    ("hold-gpu=0.5", SIM, 0.05),
    ("ignore-sigterm", SIM, 0.05),
    ("slow-startup=2", SIM, 0.04),
    ("oom-kill-startup", SIM, 0.04),
    ("oom-kill=0.3", SIM, 0.04),
    ("freeze", PLAYED, 0.06),
    ("log-copytruncate", PLAYED, 0.05),
    ("log-delete", PLAYED, 0.05),
    ("db-lock", PLAYED, 0.04),
    ("kill-server", PLAYED, 0.03),
    ("term-server", PLAYED, 0.03),
    ("pause-harness", PLAYED, 0.03),
    ("port-stolen", PLAYED, 0.03),
)
"""Fault kinds, who injects them (the simulator, or the child on the live server), and how often
each is drawn per launch ("" = no fault). `db-lock` is drawn only on SQLite."""

SERVED = frozenset({"ok", "startup_oom", "runtime_oom"})
"""What a server that starts normally can end in: its parameters decide which."""
EXPECTED: Mapping[str, frozenset[str]] = {
    "": SERVED,
    "hang-weight-load": frozenset({"hang"}),
    "crash-mid-load": frozenset({"startup_error"}),
    "health-empty": SERVED,
    "health-fail": SERVED,
    "hold-gpu=0.5": SERVED,
    "ignore-sigterm": SERVED,
    "slow-startup=2": SERVED,
    "oom-kill-startup": frozenset({"startup_error"}),
    "oom-kill=0.3": frozenset({"hang"}),
    "freeze": frozenset({"hang"}),
    "log-copytruncate": SERVED,
    "log-delete": SERVED,
    "db-lock": SERVED | {"harness_error"},
    "kill-server": frozenset({"killed"}),
    "term-server": frozenset({"killed"}),
    "pause-harness": frozenset({"disturbed"}),
    "port-stolen": frozenset({"machine_error"}),
}
"""Outcomes each injected fault may be recorded with; anything else is a wrong record."""
STARTUP = frozenset({"startup_oom"})
REVIEW_OK: Mapping[str, frozenset[int]] = {
    "status": frozenset({0, 2}),
    "report": frozenset({0, 2}),
    "export": frozenset({0, 2}),
    "confirm": frozenset({0, 2}),
}
"""Exit codes each live review command may end with: 2 is its one-line refusal (no study yet,
nothing to report or export yet, no winner to confirm, or the study held by the run)."""


STORAGE_FAILED = "the study storage failed while the trial ran"
"""The reason of a trial in flight when the database failed (`autotune.study.runner`): FAIL,
`harness_error`, its point run again. Any fault's trial may meet a restart or a lock."""


def draw_fault(seed: int, number: int, sqlite: bool = True) -> str:
    rng = random.Random(f"fault-{seed}-{number}")
    faults = [f for f in FAULTS if sqlite or f[0] != "db-lock"]
    return str(rng.choices([f[0] for f in faults], weights=[f[2] for f in faults])[0])


WHILE_SERVING = frozenset(
    {
        "oom-kill=0.3",
        "freeze",
        "log-copytruncate",
        "log-delete",
        "db-lock",
        "kill-server",
        "term-server",
        "pause-harness",
        "port-stolen",
    }
)
"""Faults that act only once the server serves, or at its very end of startup (the HTTP bind
comes after the KV pool is sized): a start its parameters break comes first."""


def allowed(fault: str) -> frozenset[str]:
    return EXPECTED[fault] | (STARTUP if fault in WHILE_SERVING else frozenset())


# ------------------------------------------------------------------------------------------------
# The child: autotune run with a fault per launch
# ------------------------------------------------------------------------------------------------

JUMPS = (0.0, 6 * 3600.0, -6 * 3600.0, 30 * 86400.0, -30 * 86400.0, 365 * 86400.0)


def jump_the_wall_clock() -> None:
    """`time.time` jumps every 0.7 s through JUMPS; time.monotonic stays true. The simulated
    GPUs keep the true clock: their state files (`autotune.sim.gpustate`, NVML's stand-in, shared
    with the servers, whose clocks do not jump) stamp holds and heartbeats with the wall clock."""
    import types

    from autotune.sim import gpustate

    gpustate.time = types.SimpleNamespace(  # type: ignore[attr-defined,assignment]
        **{k: getattr(time, k) for k in dir(time) if not k.startswith("__")}
    )
    real, real_ns, mono = time.time, time.time_ns, time.monotonic
    t0 = mono()

    def offset() -> float:
        return JUMPS[int((mono() - t0) / 0.7) % len(JUMPS)]

    time.time = lambda: real() + offset()
    time.time_ns = lambda: real_ns() + int(offset() * 1e9)


def _listen(host: str, port: int) -> subprocess.Popen[bytes]:
    """A stranger listening on `host:port` (and answering nothing) until it is killed, or
    until the child that started it is gone (a SIGKILLed child must not leave it behind)."""
    code = (
        "import os, socket, time\nparent = os.getppid()\ns = socket.socket()\n"
        f"s.bind(({host!r}, {port})); s.listen()\nprint('up', flush=True)\n"
        "while os.getppid() == parent:\n    time.sleep(0.2)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, start_new_session=True
    )
    assert proc.stdout is not None
    proc.stdout.readline()
    return proc


def child(args: argparse.Namespace) -> int:
    if args.clock_jumps:
        jump_the_wall_clock()

    from autotune.cli.common import HUNG_UP, INTERRUPTED, HungUp, stop_signals
    from autotune.config.studyfile import load_study
    from autotune.errors import AutotuneError
    from autotune.server.hostcheck import check_host
    from autotune.study.runner import run, study_lock
    from autotune.study.storage import default_storage_url
    from autotune.study.workers import gpu_group, with_worker_args, worker_folder
    from autotune.trial.live import live_launcher
    from autotune.trial.plan import TrialPlan
    from autotune.trial.seam import Launcher, Load, ServerRun, Startup, Stop

    folder: Path = args.folder
    seed: int = args.seed
    study_dir = folder / "results" / NAME
    url = args.storage or default_storage_url(study_dir)
    sqlite = url.startswith("sqlite")

    class Played:
        """A live server with a fault played on it a moment into its workload."""

        def __init__(self, inner: ServerRun, fault: str, plan: TrialPlan) -> None:
            self.inner, self.fault, self.plan = inner, fault, plan
            self.listener: subprocess.Popen[bytes] | None = None
            if fault == "port-stolen":  # another process takes the free port before the bind
                self.listener = _listen(plan.host, plan.port)

        def wait_ready(self) -> Startup:
            return self.inner.wait_ready()

        def drive(self, ledger: Mapping[str, object]) -> Load:
            timer = threading.Timer(0.15, self._play)
            timer.daemon = True
            timer.start()
            try:
                return self.inner.drive(ledger)
            finally:
                timer.cancel()

        def stop(self) -> Stop:
            try:
                return self.inner.stop()
            finally:
                if self.listener is not None:  # the soak's own stranger, gone with the trial
                    self.listener.kill()
                    self.listener.wait()

        def _play(self) -> None:
            log = self.plan.log_path
            with contextlib.suppress(OSError):
                if self.fault == "freeze":
                    server = getattr(self.inner, "server", None)
                    if server is not None:
                        os.killpg(server.record.pgid, signal.SIGSTOP)
                elif self.fault == "log-copytruncate":
                    for i in range(2):
                        shutil.copyfile(log, log.with_name(f"server.log.{i + 1}"))
                        os.truncate(log, 0)
                        time.sleep(0.2)
                elif self.fault == "log-delete":
                    log.unlink()
                elif self.fault in ("kill-server", "term-server"):
                    server = getattr(self.inner, "server", None)
                    if server is not None:  # someone else's kill: autotune did not send it
                        sig = signal.SIGKILL if self.fault == "kill-server" else signal.SIGTERM
                        os.kill(server.record.pid, sig)
                elif self.fault == "pause-harness":
                    # autotune itself stopped for 8 s (a laptop lid, a VM migration), by a
                    # process of its own so that something is left to send SIGCONT
                    pause = f"kill -STOP {os.getpid()}; sleep 8; kill -CONT {os.getpid()}"
                    subprocess.Popen(
                        ["sh", "-c", pause], stdin=subprocess.DEVNULL, start_new_session=True
                    )
                elif self.fault == "db-lock":
                    db = study_dir / "study.db"
                    hold = (
                        "import sqlite3, sys, time\n"
                        "c = sqlite3.connect(sys.argv[1], timeout=30)\n"
                        "c.execute('BEGIN EXCLUSIVE')\ntime.sleep(15)\nc.rollback()\n"
                    )
                    subprocess.Popen(
                        [sys.executable, "-c", hold, str(db)],
                        stdin=subprocess.DEVNULL,
                        start_new_session=True,
                    )

    class FaultLauncher:
        """The live launcher, with the fault drawn for each launch."""

        def __init__(self, inner: Launcher) -> None:
            self.inner = inner

        def extra_args(self) -> tuple[str, ...]:
            return self.inner.extra_args()

        def stop_orphans(self) -> list[str]:
            return self.inner.stop_orphans()

        def launch(self, plan: TrialPlan) -> ServerRun:
            fault = draw_fault(seed, plan.number, sqlite)
            kind = dict((f[0], f[1]) for f in FAULTS)[fault]
            if fault and kind == SIM:
                plan = replace(plan, argv=(*plan.argv, "--sim-fault", fault))
            elif fault == "port-stolen":  # a start slow enough for the stranger to bind first
                plan = replace(plan, argv=(*plan.argv, "--sim-fault", "slow-startup=100"))
            run = self.inner.launch(plan)
            return Played(run, fault, plan) if fault and kind == PLAYED else run

    try:
        cfg = with_worker_args(
            load_study(folder / f"{NAME}.toml"), gpus=args.gpus, port=args.port,
            heartbeat_s=None, grace_s=None,
        )  # fmt: skip
        check_host(cfg)
        where = worker_folder(study_dir, gpu_group(cfg.server.env))
        where.mkdir(parents=True, exist_ok=True)
        with study_lock(where), stop_signals() as stopped:
            launcher = FaultLauncher(live_launcher(cfg, where))
            return stopped.exit_code(run(cfg, where, url, launcher, sys.stdout))
    except AutotuneError as exc:
        sys.stderr.write(f"autotune: error: {exc}\n")
        return exc.exit_code
    except HungUp:
        return HUNG_UP
    except KeyboardInterrupt:
        return INTERRUPTED


# ------------------------------------------------------------------------------------------------
# The parent: the operator's night
# ------------------------------------------------------------------------------------------------


@dataclass
class Worker:
    """One `autotune run` of the night, restarted until it finishes."""

    name: str
    gpus: str | None
    port: int | None
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0
    done: bool = False

    def folder(self, study_dir: Path) -> Path:
        return study_dir / f"gpus-{self.gpus.replace(',', '-')}" if self.gpus else study_dir


def _ready_trial(folder: Path) -> int | None:
    """The newest trial whose server says it is ready, if any."""
    logs = sorted(folder.glob("trials/*/server.log"))
    if not logs:
        return None
    try:
        text = logs[-1].read_text(errors="replace")
    except OSError:
        return None
    return int(logs[-1].parent.name) if "fired up and ready" in text else None


class Review(threading.Thread):
    """`status`, `report`, `export` and `confirm` in a loop against the live study."""

    def __init__(self, folder: Path, storage: str | None) -> None:
        super().__init__(name="review", daemon=True)
        self.folder = folder
        self.storage = storage
        self.halt = threading.Event()
        self.codes: collections.Counter[str] = collections.Counter()
        self.problems: list[str] = []
        self.log = folder / "review.log"

    def run(self) -> None:
        common = ["--config", str(self.folder / f"{NAME}.toml")]
        common += ["--results-dir", str(self.folder / "results")]
        common += ["--storage", self.storage] if self.storage else []
        commands = {
            "status": ["status", *common],
            "report": ["report", *common],
            "export": ["export", *common, "--format", "shell", "--no-flag-check"],
            # the soak confirms the winner alongside the run; its worst cases (a launch's worth
            # of bursts) are `confirm`'s own tests, not this loop's
            "confirm": ["confirm", *common, "--cases", "none"],
        }
        with open(self.log, "a") as out:
            while not self.halt.is_set():
                for name, argv in commands.items():
                    if self.halt.is_set():
                        return
                    self._once(name, argv, out)
                    self.halt.wait(0.5)

    def _once(self, name: str, argv: list[str], out: Any) -> None:
        proc = subprocess.Popen(
            [sys.executable, "-m", "autotune", *argv],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=self.folder,
            start_new_session=True,
        )  # fmt: skip
        try:
            stdout, stderr = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            # stopped as an operator would (Ctrl-C), so a confirm stops the server it started
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.communicate()
            self.problems.append(f"{name}: no answer within 120 s")
            return
        done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
        self.codes[f"{name} exit {done.returncode}"] += 1
        out.write(f"$ autotune {name} → {done.returncode}\n{done.stdout[-2000:]}{done.stderr}\n")
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
        if done.returncode not in REVIEW_OK[name] or "Traceback" in done.stderr:
            self.problems.append(f"{name} exit {done.returncode}: {done.stderr.strip()[-300:]}")
        elif done.returncode == 2 and len(lines) != 1:
            self.problems.append(f"{name} refused in {len(lines)} lines: {done.stderr[-300:]}")


def night(args: argparse.Namespace, folder: Path, workers: list[Worker]) -> dict[str, object]:
    study_dir = folder / "results" / NAME
    rng = random.Random(f"operator-{args.seed}")
    decided: set[tuple[str, int]] = set()
    events: collections.Counter[str] = collections.Counter()
    log = open(folder / "soak.log", "a")  # noqa: SIM115
    foreign = subprocess.Popen(["sleep", "3600"], start_new_session=True)
    review = Review(folder, args.storage) if args.review else None
    if review is not None:
        review.start()
    restarts_left = args.pg_restarts if args.pg_restart else 0
    next_restart = time.monotonic() + args.pg_every
    try:
        while not all(w.done for w in workers):
            for w in workers:
                _tend(args, folder, w, log, events)
                if w.proc is None or w.done:
                    continue
                number = _ready_trial(w.folder(study_dir))
                if number is not None and (w.name, number) not in decided:
                    decided.add((w.name, number))
                    draw = rng.random()
                    if draw < args.kill_rate:
                        os.kill(w.proc.pid, signal.SIGKILL)
                        events["SIGKILL mid-trial"] += 1
                    elif draw < args.kill_rate * 1.25:
                        os.kill(w.proc.pid, signal.SIGINT)
                        events["SIGINT mid-trial"] += 1
                    elif draw < args.kill_rate * 1.5:
                        os.kill(w.proc.pid, signal.SIGHUP)  # the SSH session dropped
                        events["SIGHUP mid-trial"] += 1
            if restarts_left and time.monotonic() >= next_restart:
                restarts_left -= 1
                next_restart = time.monotonic() + args.pg_every
                done = subprocess.run(shlex.split(args.pg_restart), capture_output=True, text=True)
                events[f"database restart (exit {done.returncode})"] += 1
                log.write(f"soak: {args.pg_restart} → {done.returncode} {done.stderr}\n")
            time.sleep(0.05)
        foreign_alive = foreign.poll() is None
    finally:
        if review is not None:
            review.halt.set()
            review.join(timeout=180)
        for w in workers:
            if w.proc is not None and w.proc.poll() is None:
                os.killpg(w.proc.pid, signal.SIGKILL)
                w.proc.wait()
        foreign.kill()
        foreign.wait()
        log.close()
    out: dict[str, object] = {"events": dict(events), "foreign_alive": foreign_alive}
    if review is not None:
        out["review"] = dict(sorted(review.codes.items()))
        out["review_problems"] = review.problems
    return out


def _tend(
    args: argparse.Namespace,
    folder: Path,
    w: Worker,
    log: Any,
    events: collections.Counter[str],
) -> None:
    """Start the worker if it is not running and not done; note how its last run ended."""
    if w.proc is not None:
        rc = w.proc.poll()
        if rc is None:
            return
        events[f"run exit {rc}"] += 1
        w.proc = None
        if rc == 0:
            w.done = True
            return
        if rc == 2:
            time.sleep(0.5)  # refused: the study was held (confirm), or the storage was down
    if w.starts > args.max_restarts:
        w.done = True
        events["gave up restarting"] += 1
        return
    cmd = [sys.executable, __file__, "--child", "--folder", str(folder), "--seed", str(args.seed)]
    cmd += ["--storage", args.storage] if args.storage else []
    cmd += ["--gpus", w.gpus, "--port", str(w.port)] if w.gpus else []
    cmd += [] if args.clock_jumps else ["--no-clock-jumps"]
    w.proc = subprocess.Popen(
        cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True, cwd=folder
    )
    w.starts += 1


def check(
    folder: Path, trials_wanted: int, seed: int, storage: str | None, workers: Sequence[Worker]
) -> dict[str, object]:
    import optuna

    from autotune.record import keys
    from autotune.sim.gpustate import read_gpu_state
    from autotune.study.storage import counted, default_storage_url

    study_dir = folder / "results" / NAME
    url = storage or default_storage_url(study_dir)
    sqlite = url.startswith("sqlite")
    trials = optuna.load_study(study_name=NAME, storage=url).get_trials()
    outcomes = collections.Counter(str(t.user_attrs.get("outcome", t.state.name)) for t in trials)
    faults: collections.Counter[str] = collections.Counter()
    wrong: list[str] = []
    storage_failures = 0
    for t in trials:
        record = t.user_attrs.get(keys.RECORD)
        if not isinstance(record, dict):
            continue
        fault = draw_fault(seed, t.number, sqlite)  # what FaultLauncher injected in this launch
        faults[fault or "none"] += 1
        outcome = str(t.user_attrs.get("outcome"))
        if outcome == "interrupted":
            continue  # the operator stopped it mid-trial
        reason = str(t.user_attrs.get("reason"))
        if outcome == "harness_error" and "launch failed" in reason:
            continue  # the machine refused the launch (e.g. memory a killed server held); requeued
        if outcome == "harness_error" and reason.startswith(STORAGE_FAILED):
            storage_failures += 1
            continue  # the database restarted (or was locked) as it was told: a machine failure
        if outcome not in allowed(fault):
            wrong.append(f"trial {t.number}: fault {fault or 'none'} → {outcome}")
    problems: list[str] = []
    twice: list[str] = []
    dirs: collections.Counter[str] = collections.Counter()
    for w in workers:
        where = w.folder(study_dir)
        mine = [t for t in trials if _under(t.user_attrs.get(keys.TRIAL_DIR), where)]
        loose = [t for t in trials if not t.user_attrs.get(keys.TRIAL_DIR)]
        problems += [p for p in audit.problems([*mine, *loose], where) if p not in problems]
        held = [g for g in read_gpu_state(where / "sim-gpu") if g.used_bytes]
        if held:
            wrong.append(f"GPU memory still held ({w.name}): {held}")
    for t in trials:
        view_counted = counted([t]) == 1
        if view_counted and t.user_attrs.get(keys.TRIAL_DIR):
            dirs[str(t.user_attrs[keys.TRIAL_DIR])] += 1
    twice = [f"{d} counted {n} times" for d, n in dirs.items() if n > 1]
    done = counted(trials)
    if done != trials_wanted:
        wrong.append(f"{done} trials count toward the budget, not {trials_wanted}")
    leftovers = audit.leftovers(str(folder), spare=_ancestors())
    return {
        "trials_in_storage": len(trials),
        "trials_counted": done,
        "orphans": [f"{p.pid} {p.cmdline[:120]}" for p in leftovers],
        "lost": problems,
        "wrong_records": wrong,
        "counted_twice": twice,
        "recorded_as_storage_failures": storage_failures,
        "outcomes": dict(sorted(outcomes.items())),
        "faults_injected": dict(sorted(faults.items())),
    }


def _ancestors() -> set[int]:
    """This process's parents (a `timeout` wrapper names the folder on its command line too)."""
    from autotune.server import procs

    out, pid = set(), os.getppid()
    while pid > 1:
        out.add(pid)
        info = procs.read_proc(pid)
        pid = info.ppid if info else 0
    return out


def _under(path: object, folder: Path) -> bool:
    return isinstance(path, str) and Path(path).parent.parent == folder


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--trials", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kill-rate", type=float, default=0.06, help="chance per trial of a SIGKILL")
    p.add_argument("--max-restarts", type=int, default=40, help="per worker")
    p.add_argument("--folder", type=Path, help="where to run (default: a temporary folder)")
    p.add_argument("--storage", help="a shared storage URL (PostgreSQL for --workers)")
    p.add_argument("--workers", type=int, default=1, help="workers sharing the study (max 4)")
    p.add_argument("--pg-restart", help="command that restarts the database, e.g. pg_ctlcluster")
    p.add_argument("--pg-restarts", type=int, default=3, help="how many times to restart it")
    p.add_argument("--pg-every", type=float, default=30.0, help="seconds between restarts")
    p.add_argument("--no-review", dest="review", action="store_false")
    p.add_argument("--no-clock-jumps", dest="clock_jumps", action="store_false")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--gpus", help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args)
    if args.workers > 1 and not args.storage:
        p.error("--workers needs a shared --storage (PostgreSQL)")
    keep = args.folder is not None
    folder = (args.folder or Path(tempfile.mkdtemp(prefix="autotune-soak-"))).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    shape = WORKERS if args.workers > 1 else SINGLE
    (folder / f"{NAME}.toml").write_text(STUDY.format(trials=args.trials, seed=args.seed, **shape))
    if args.workers > 1:
        groups = GROUPS[: min(args.workers, 4)]
        workers = [Worker(f"worker {g}", g, free_port("127.0.0.1")) for g in groups]
    else:
        workers = [Worker("worker", None, None)]
    t0 = time.monotonic()
    operator = night(args, folder, workers)
    wall = time.monotonic() - t0
    figures = {
        **check(folder, args.trials, args.seed, args.storage, workers),
        **operator,
        "wall_s": round(wall, 1),
    }
    ok = (
        not figures["orphans"]
        and not figures["lost"]
        and not figures["wrong_records"]
        and not figures["counted_twice"]
        and not figures.get("review_problems")
        and figures["foreign_alive"]
    )
    figures["ok"] = bool(ok)
    if args.json:
        print(json.dumps(figures))
    else:
        print(f"soak: {args.trials} trials, seed {args.seed}, folder {folder}")
        for key, value in figures.items():
            print(f"  {key}: {value}")
    if not keep and ok:
        shutil.rmtree(folder, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
