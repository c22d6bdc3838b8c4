"""How a simulated SGLang server's process tree dies, the SGLang way, at startup or serving.

A scheduler that hits an exception writes `Scheduler hit an exception:` with its traceback and
SIGQUITs the main process; the main process's handler logs its SIGQUIT line (the launch-phase
text, or the running-phase one once a request installed it) and ends the tree as SGLang's
`kill_process_tree` does: SIGKILL to every child, then to itself (0.5.23 logs its
`kill_process_tree` call first). A scheduler the OS OOM killer takes during startup is reported
by the main process, which then exits 1. torch's CUDA out-of-memory text is written here too,
for the startup stages and the serving loop alike.

`ServerDeaths` is the base of `startup.StartupSequence` (the stages, which die by these paths
when the plan fails) and so of `server.SimServer` (serving, shutdown and signals); it is kept
apart from the stages because it does not depend on the release's order of stages.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from autotune.sim import gpustate, tracebacks
from autotune.sim.loglines import Lines, fmt_died_during_init, fmt_oom_error
from autotune.sim.logwriter import LogWriter
from autotune.sim.profiles import Profile
from autotune.sim.startupplan import StartupPlan
from autotune.sim.tree import ACK_TIMEOUT_S, ProcessTree, RankMemory
from autotune.sim.versions import SglangVersion

Frames = Sequence[tuple[str, int, str, str]]


class ServerDeaths:
    """The ways the main process and its schedulers end; the startup stages build on it."""

    profile: Profile
    log: LogWriter
    release: SglangVersion
    lines: Lines
    pid: int
    tree: ProcessTree
    memory: RankMemory | None
    machine_dir: Path | None
    """The simulated machine's state directory (its GPUs, its kernel log), None without one."""
    running_phase: bool
    plan: StartupPlan | None

    def die(self, code: int | None = None) -> NoReturn:
        """End like SGLang's kill_process_tree: SIGKILL ourselves (or exit with `code`). Children
        still alive die with us by their parent-death signal (`kill_itself_when_parent_died`),
        except the orphans of the `orphan-scheduler` fault."""
        if self.memory is not None:
            self.memory.release()
        for stream in (sys.stdout, sys.stderr):  # a full disk: what cannot be written is lost
            with contextlib.suppress(OSError):
                stream.flush()
        if code is not None:
            os._exit(code)
        os.kill(self.pid, signal.SIGKILL)
        os._exit(137)  # not reached

    def kill_tree(self, include_parent: bool = True) -> None:
        """`kill_process_tree(os.getpid(), include_parent)` (utils/common.py): its log line where
        the release prints one, then SIGKILL to every child; without the parent, wait until each
        is reaped (0.5.23's `wait_timeout`), since the process lives on. With the parent the
        caller dies next (`die`)."""
        line = self.lines.kill_tree(self.pid, include_parent)
        if line is not None:
            self.log.main(line)
        self.tree.kill(wait_s=0.0 if include_parent else 60.0)

    def scheduler_exception(self, ranks: Sequence[int], frames: Frames, final: str) -> None:
        """Each of `ranks` writes `Scheduler hit an exception:` with the traceback and SIGQUITs the
        main process, as `run_scheduler_process` does; the main process's handler
        (`sigquit_received`) takes it from there."""
        text = "Scheduler hit an exception: " + tracebacks.traceback_block(frames, final)
        self.tree.fail({r: self.log.rank_text(r, text) for r in ranks})

    def sigquit_received(self) -> NoReturn:
        """The main process's SIGQUIT handler: the running-phase one once a request installed it
        (`tokenizer_manager.py` `running_phase_sigquit_handler`, warm-up included), else the
        launch-phase one (`engine.py` `launch_phase_sigquit_handler`); then the whole tree is
        killed (`kill_process_tree(os.getpid())`)."""
        if self.running_phase:
            self.log.main(
                "SIGQUIT received. signum=None, frame=None. It usually means one child failed."
            )
        else:
            self.log.main(
                "Received sigquit from a child process. It usually means the child failed."
            )
        self.kill_tree()
        self.die()

    async def until_sigquit(self) -> NoReturn:
        """Wait for the SIGQUIT a failing child sends (its handler ends the process); should none
        come (every rank already dead), act as if it had."""
        await asyncio.sleep(ACK_TIMEOUT_S)
        self.sigquit_received()

    async def crash_startup(self, ranks: Sequence[int], frames: Frames, final: str) -> NoReturn:
        """Die of a failed startup stage the SGLang way: each failing rank's traceback and the
        SIGQUIT it sends, the main process's SIGQUIT line, then the tree killed."""
        self.scheduler_exception(ranks, frames, final)
        await self.until_sigquit()

    def oom_text(self, tried: float, free: float) -> str:
        """torch's CUDA out-of-memory message for an allocation of `tried` GiB with `free` GiB left,
        the graphs' private pools counted as PyTorch counts them."""
        total = self.profile.hardware.gpu_memory_mib / 1024
        in_use = total - free
        plan = self.plan
        graphs = 0.0
        if plan is not None:
            graphs = sum(plan.graph_phases().values()) if plan.spec else (plan.graph_gib or 0.0)
            graphs += 0.0 if plan.spec else (plan.prefill_graph_gib or 0.0)
        return fmt_oom_error(tried, total, free, in_use, graphs)

    async def scheduler_died(self, rank: int) -> NoReturn:
        """The OS OOM killer SIGKILLs scheduler `rank`'s process before it reported ready, and the
        main process, polling for it, says so with the exit code it reaped (0.5.9: `Rank i
        scheduler is dead`; 0.5.23: `_wait_for_scheduler_ready` raises `_scheduler_died_error`,
        launch_server's `finally` kills the other children) and exits 1; 0.5.9's children die with
        it by their parent-death signal."""
        victim = self.tree.scheduler(rank).pid
        reaped = self.tree.oom_killed(rank)
        code = -9 if reaped is None else reaped
        if self.machine_dir is not None:  # the kernel says so in its log, as a real one does
            gpustate.kernel_oom_kill(self.machine_dir, victim, "python")
        if self.release.subprocess_watchdog:
            self.kill_tree(include_parent=False)
            self.log.raw(
                tracebacks.traceback_block(
                    tracebacks.MAIN_INIT_FRAMES_0523,
                    f"RuntimeError: {fmt_died_during_init(rank, code)}",
                )
            )
            self.die(1)
        self.log.main(f"Rank {rank} scheduler is dead. Please check if there are relevant logs.")
        self.log.main(f"Exit code: {code}")
        self.log.raw(
            tracebacks.traceback_block(
                (
                    (
                        "/usr/local/lib/python3.12/dist-packages/sglang/srt/entrypoints/engine.py",
                        892,
                        "_wait_for_scheduler_ready",
                        "data = scheduler_pipe_readers[i].recv()",
                    ),
                ),
                "EOFError",
            )
        )
        self.die(1)
