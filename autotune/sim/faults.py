"""Reliability faults injected with `--sim-fault KIND[=ARG]` and what each one changes.

Owns the mapping from the parsed faults to the switches the server reads (`FaultSet`), so the
tuner's failure handling can be tested against misbehaviour a real SGLang shows only rarely:

hang-weight-load     startup stops after "Load weight begin" and never continues
health-empty         /health and /health_generate close the connection with no answer
                     while serving works (the operator's anomaly)
health-fail          /health and /health_generate answer 503 while serving works
crash-mid-load       a non-OOM exception half-way through the weight load (crash path)
hold-gpu=SECONDS     GPU memory stays counted in the state directory for SECONDS after the
                     process ends, however it ends
ignore-sigterm       SIGTERM is ignored from the start (only SIGKILL stops the server)
slow-startup=FACTOR  every startup phase takes FACTOR times longer
oom-kill-startup     the OS OOM killer SIGKILLs scheduler rank 0 half-way through the weight
                     load: the main process reports the dead scheduler and exits 1
oom-kill=SECONDS     SECONDS after the server is ready the OS OOM killer SIGKILLs scheduler
                     rank 0: 0.5.23's SubprocessWatchdog logs it and the whole tree is killed
                     (rc -9); 0.5.9 has no watchdog, so the server stays up and stops answering
                     (health checks fail after 20 s)
rank-dies=SECONDS    SECONDS after the server is ready the last TP rank's scheduler process dies
                     of a segfault (faulthandler's `Fatal Python error: Segmentation fault`);
                     its peers wait in the collective it never joins. 0.5.23's
                     SubprocessWatchdog reports it within a second and the tree is killed; on
                     0.5.9 nothing watches the children, so once a batch runs the peers' own
                     watchdogs log `Scheduler watchdog timeout` after --watchdog-timeout, SIGQUIT
                     the main process 5 s later and the tree is killed (rc -9)
orphan-scheduler     the scheduler processes ask for no parent-death signal: a main process
                     SIGKILLed (or exiting) leaves them running, each holding its GPU memory
                     under its own pid, until someone kills them (the process group does)
refuse-generate      every generation request is answered HTTP 500 while the server stays up,
                     its health routes answer 200 and its log shows no failure (a server
                     that does not fit its requests: a broken tokenizer, proxy or template)
bad-server-info      /server_info and /get_server_info answer 200 with a JSON object that has no
                     `internal_states` and no `version` (a server of another shape)
reword-log           the ranks print P reworded (`Weight loading begins, free memory: X GB`
                     for `Load weight begin. avail mem=X GB`) and the weights' usage with it
                     (`the weights took X GB` for `mem usage=X GB`, which with A gives P), as
                     a release that rewords its memory lines would: the log no longer shows P

The host's own faults need no switch, because the simulator meets the real thing as SGLang does:
another process listening on its port (uvicorn's `[Errno 98]` line, then the warm-up gives up:
`SimServer._bind_failed`), a full disk under `TRITON_CACHE_DIR` (the graph capture fails with
`[Errno 28]`: `startup`), a full disk under `--sim-gpu-dir` (never fatal: `gpustate`), a
signal from anyone (SIGTERM drains as SGLang does; SIGKILL is SIGKILL).
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.sim.flags import SimOptions


@dataclass(frozen=True)
class FaultSet:
    """The faults of one run, resolved to the values the server consults."""

    hang_weight_load: bool = False
    health_empty: bool = False
    health_fail: bool = False
    crash_mid_load: bool = False
    hold_gpu_s: float | None = None
    ignore_sigterm: bool = False
    startup_factor: float = 1.0
    oom_kill_startup: bool = False
    oom_kill_after_s: float | None = None
    rank_dies_after_s: float | None = None
    orphan_scheduler: bool = False
    bad_server_info: bool = False
    refuse_generate: bool = False
    reword_log: bool = False

    @property
    def health_faults(self) -> frozenset[str]:
        """The HTTP faults in force (`health-empty`, `health-fail`, `bad-server-info`,
        `refuse-generate`), the set the HTTP side consults."""
        out = set()
        if self.health_empty:
            out.add("health-empty")
        if self.health_fail:
            out.add("health-fail")
        if self.bad_server_info:
            out.add("bad-server-info")
        if self.refuse_generate:
            out.add("refuse-generate")
        return frozenset(out)


def resolve(sim: SimOptions) -> FaultSet:
    """The parsed `--sim-fault` options resolved to the switches the server reads (absent ones off,
    `slow-startup` 1.0 without a factor)."""
    hold = sim.fault("hold-gpu")
    slow = sim.fault("slow-startup")
    kill = sim.fault("oom-kill")
    dies = sim.fault("rank-dies")
    return FaultSet(
        hang_weight_load=sim.fault("hang-weight-load") is not None,
        health_empty=sim.fault("health-empty") is not None,
        health_fail=sim.fault("health-fail") is not None,
        crash_mid_load=sim.fault("crash-mid-load") is not None,
        hold_gpu_s=hold.arg if hold is not None else None,
        ignore_sigterm=sim.fault("ignore-sigterm") is not None,
        startup_factor=slow.arg if slow is not None and slow.arg else 1.0,
        oom_kill_startup=sim.fault("oom-kill-startup") is not None,
        oom_kill_after_s=kill.arg if kill is not None else None,
        rank_dies_after_s=dies.arg if dies is not None else None,
        orphan_scheduler=sim.fault("orphan-scheduler") is not None,
        bad_server_info=sim.fault("bad-server-info") is not None,
        refuse_generate=sim.fault("refuse-generate") is not None,
        reword_log=sim.fault("reword-log") is not None,
    )
