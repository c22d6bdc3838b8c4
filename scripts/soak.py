"""Soak: a long study on the simulator with random faults, then a count of what was left behind.

    .venv/bin/python scripts/soak.py --trials 50 --seed 0

The study runs in a child process (this script with --child) that wraps autotune's live launcher
so each launch gets a fault drawn from a seeded `random.Random` (none, or one of the simulator's
`--sim-fault` kinds). The parent plays the operator's night: now and then it SIGKILLs the child
mid-trial or stops it with SIGINT, and it restarts the child whenever it exits before the budget
is spent (a killed run, or a run that stopped itself after repeated machine failures), just as
re-running the same command resumes a study. A foreign `sleep` runs alongside the whole time.

At the end it prints: orphans (live processes that mention the soak folder), lost trials
(`autotune.testing.audit.problems`: trials left RUNNING, missing or disagreeing records),
consistency
(every injected fault ended in an outcome that fault can cause; the GPUs are all released; the
budget is met), outcome counts and wall time. Exit code 0 when all of it holds.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from autotune.testing import audit  # noqa: E402

NAME = "soak"
STUDY = """
[server]
backend = "sim"
sim_profile = "kimi-k2.5-tp8-96g"
sim_time_scale = 30000

[server.flags]
model-path = "moonshotai/Kimi-K2.5"
tp = 8
speculative-algorithm = "EAGLE3"
speculative-draft-model-path = "lightseekorg/kimi-k2.5-eagle3"
speculative-num-steps = 3
speculative-eagle-topk = 1
speculative-num-draft-tokens = 4

[server.limits]
startup_s = 30
stall_s = 1.5
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
duration_s = 0.5

[[workload.phases]]
kind = "stress"
rounds = 1
requests = 1
input_len = 9000
output_len = 4

[budget]
n_trials = {trials}

[sampler]
name = "tpe"
seed = {seed}
"""

FAULTS: tuple[tuple[str, float], ...] = (
    ("", 0.45),
    ("hang-weight-load", 0.08),
    ("health-empty", 0.08),
    ("health-fail", 0.08),
    ("crash-mid-load", 0.08),
    ("hold-gpu=0.5", 0.08),
    ("ignore-sigterm", 0.08),
    ("slow-startup=2", 0.07),
)
"""Fault kinds and how often each is drawn per launch ("" = no fault)."""

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
}
"""Outcomes each injected fault may be recorded with; anything else is an inconsistency."""


def draw_fault(seed: int, number: int) -> str:
    rng = random.Random(f"fault-{seed}-{number}")
    kinds = [kind for kind, _ in FAULTS]
    weights = [weight for _, weight in FAULTS]
    return str(rng.choices(kinds, weights=weights)[0])


# ------------------------------------------------------------------------------------------------
# The child: autotune run with a fault per launch
# ------------------------------------------------------------------------------------------------


def child(folder: Path, seed: int) -> int:
    from autotune.cli.common import stop_signals
    from autotune.config.studyfile import load_study
    from autotune.errors import AutotuneError
    from autotune.server.hostcheck import check_host
    from autotune.study.runner import run, study_lock
    from autotune.study.storage import default_storage_url
    from autotune.trial.run import Launcher, ServerRun, TrialPlan, live_launcher

    class FaultLauncher:
        """The live launcher, with `--sim-fault KIND` added to each launch drawn for it."""

        def __init__(self, inner: Launcher) -> None:
            self.inner = inner

        def extra_args(self) -> tuple[str, ...]:
            return self.inner.extra_args()

        def stop_orphans(self) -> list[str]:
            return self.inner.stop_orphans()

        def launch(self, plan: TrialPlan) -> ServerRun:
            fault = draw_fault(seed, plan.number)
            argv = (*plan.argv, "--sim-fault", fault) if fault else plan.argv
            return self.inner.launch(replace(plan, argv=argv))

    try:
        cfg = load_study(folder / f"{NAME}.toml")
        check_host(cfg)
        study_dir = folder / "results" / NAME
        study_dir.mkdir(parents=True, exist_ok=True)
        with study_lock(study_dir), stop_signals():
            launcher = FaultLauncher(live_launcher(cfg, study_dir))
            return run(cfg, study_dir, default_storage_url(study_dir), launcher, sys.stdout)
    except AutotuneError as exc:
        sys.stderr.write(f"autotune: error: {exc}\n")
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


# ------------------------------------------------------------------------------------------------
# The parent: the operator's night
# ------------------------------------------------------------------------------------------------


def _ready_trial(study_dir: Path) -> int | None:
    """The newest trial whose server says it is ready, if any."""
    logs = sorted(study_dir.glob("trials/*/server.log"))
    if not logs:
        return None
    try:
        text = logs[-1].read_text(errors="replace")
    except OSError:
        return None
    return int(logs[-1].parent.name) if "fired up and ready" in text else None


def night(folder: Path, seed: int, kill_rate: float, max_restarts: int) -> dict[str, object]:
    study_dir = folder / "results" / NAME
    rng = random.Random(f"operator-{seed}")
    decided: set[int] = set()
    events: collections.Counter[str] = collections.Counter()
    log = open(folder / "soak.log", "a")  # noqa: SIM115
    foreign = subprocess.Popen(["sleep", "3600"], start_new_session=True)
    try:
        for _ in range(max_restarts + 1):
            proc = subprocess.Popen(
                [sys.executable, __file__, "--child", "--folder", str(folder), "--seed", str(seed)],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=folder,
            )
            while proc.poll() is None:
                number = _ready_trial(study_dir)
                if number is not None and number not in decided:
                    decided.add(number)
                    draw = rng.random()
                    if draw < kill_rate:
                        os.kill(proc.pid, signal.SIGKILL)
                        events["SIGKILL mid-trial"] += 1
                    elif draw < kill_rate * 1.25:
                        os.kill(proc.pid, signal.SIGINT)
                        events["SIGINT mid-trial"] += 1
                time.sleep(0.05)
            rc = proc.wait()
            events[f"run exit {rc}"] += 1
            if rc == 0:
                break
        foreign_alive = foreign.poll() is None
    finally:
        foreign.kill()
        foreign.wait()
        log.close()
    return {"events": dict(events), "foreign_alive": foreign_alive}


def check(folder: Path, trials_wanted: int, seed: int) -> dict[str, object]:
    import optuna

    from autotune.sim.gpustate import read_gpu_state
    from autotune.study.storage import counted, default_storage_url

    study_dir = folder / "results" / NAME
    trials = optuna.load_study(study_name=NAME, storage=default_storage_url(study_dir)).get_trials()
    outcomes = collections.Counter(str(t.user_attrs.get("outcome", t.state.name)) for t in trials)
    faults: collections.Counter[str] = collections.Counter()
    inconsistent: list[str] = []
    for t in trials:
        record = t.user_attrs.get("record")
        if not isinstance(record, dict):
            continue
        fault = draw_fault(seed, t.number)  # what FaultLauncher added to this launch
        faults[fault or "none"] += 1
        outcome = str(t.user_attrs.get("outcome"))
        if outcome == "interrupted":
            continue  # the operator stopped it mid-trial
        if outcome == "harness_error" and "launch failed" in str(t.user_attrs.get("reason")):
            continue  # the machine refused the launch (e.g. memory a killed server held); requeued
        if outcome not in EXPECTED[fault]:
            inconsistent.append(f"trial {t.number}: fault {fault or 'none'} → {outcome}")
    done = counted(trials)
    if done != trials_wanted:
        inconsistent.append(f"{done} trials count toward the budget, not {trials_wanted}")
    held = [g for g in read_gpu_state(study_dir / "sim-gpu") if g.used_bytes]
    if held:
        inconsistent.append(f"GPU memory still held: {held}")
    leftovers = audit.leftovers(str(folder))
    return {
        "trials_in_storage": len(trials),
        "trials_counted": done,
        "orphans": [f"{p.pid} {p.cmdline[:120]}" for p in leftovers],
        "lost": audit.problems(trials, study_dir),
        "inconsistent": inconsistent,
        "outcomes": dict(sorted(outcomes.items())),
        "faults_injected": dict(sorted(faults.items())),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--trials", type=int, default=50)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kill-rate", type=float, default=0.06, help="chance per trial of a SIGKILL")
    p.add_argument("--max-restarts", type=int, default=30)
    p.add_argument("--folder", type=Path, help="where to run (default: a temporary folder)")
    p.add_argument("--json", action="store_true", help="print the figures as one JSON line")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(args.folder, args.seed)
    keep = args.folder is not None
    folder = (args.folder or Path(tempfile.mkdtemp(prefix="autotune-soak-"))).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{NAME}.toml").write_text(STUDY.format(trials=args.trials, seed=args.seed))
    t0 = time.monotonic()
    operator = night(folder, args.seed, args.kill_rate, args.max_restarts)
    wall = time.monotonic() - t0
    figures = {**check(folder, args.trials, args.seed), **operator, "wall_s": round(wall, 1)}
    ok = (
        not figures["orphans"]
        and not figures["lost"]
        and not figures["inconsistent"]
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
