"""SGLang's process tree, with real processes: one scheduler per TP rank and a detokenizer, each a
child of the main (HTTP and tokenizer) process, each holding its own simulated GPU memory.

What SGLang 0.5.23 does, and this module repeats:

* `Engine._launch_subprocesses` (`entrypoints/engine.py`) starts the scheduler processes
  (`_launch_scheduler_processes`: one `mp.Process(target=run_scheduler_process, …)` per TP rank,
  in rank order) and then the detokenizer (`_launch_detokenizer_subprocesses`), all children of
  the main process. `mp.Process` calls neither `setsid` nor `setpgid`, so every child stays in
  the server's process group and session: a SIGKILL to the group reaches them all.
* Each child first calls `kill_itself_when_parent_died` (`utils/common.py`:
  `prctl(PR_SET_PDEATHSIG, SIGKILL)`), then names itself with `setproctitle`:
  `sglang::scheduler_TP{r}` (`managers/scheduler.py` `configure_scheduler_process`: `TP{r}` only
  when tp > 1, so one rank is `sglang::scheduler`) and `sglang::detokenizer`
  (`managers/detokenizer_manager.py` `run_detokenizer_process`). The main process keeps its
  command line. Without the `setproctitle` package the title is written where the kernel keeps
  the command line (`/proc/self/mem` at `arg_start`) and the short name set with `PR_SET_NAME`,
  which is what `setproctitle` does on Linux.
* A scheduler that hits an exception logs `Scheduler hit an exception: <traceback>` and sends
  SIGQUIT to its parent (`run_scheduler_process`); the parent's SIGQUIT handler kills the tree
  (`kill_process_tree`). A scheduler that dies without a word (a signal: the OOM killer's
  SIGKILL, a segfault) is found by polling: `_wait_for_scheduler_ready` during startup, the
  `SubprocessWatchdog` (`utils/watchdog.py`, every second, 0.5.23 only) once every scheduler
  reported ready. A scheduler whose forward makes no progress for `--watchdog-timeout` (its peers
  waiting in a collective for a rank that died) logs `Scheduler watchdog timeout (…)`, waits 5 s
  and SIGQUITs its parent (`WatchdogRaw._watchdog_once`).

The serving model stays in the main process; the children are the tree and its deaths. A child
runs a small loop on a command pipe from the parent: write these lines to the log, then SIGQUIT
the parent (`fail`); die of a signal (`die`); log a watchdog timeout after a delay and SIGQUIT
the parent (`watchdog`). Its GPU memory is written under its own pid by the parent
(`RankMemory`), so the GPU state shows each rank's memory held by its scheduler's pid, counted
while that process lives: a scheduler that outlives its parent (the `orphan-scheduler` fault: no
parent-death signal reaches it) keeps its memory until someone kills it.

The children are forked before the main process starts its event loop (no thread, no loop yet),
which costs a few milliseconds each (about 40 ms for a TP8 tree on two busy cores).
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime as dt
import json
import os
import resource
import select
import signal
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from autotune.sim import gpustate

PR_SET_NAME = 15
PR_SET_PDEATHSIG = 1
ACK_TIMEOUT_S = 5.0
STAMP = "{stamp}"
"""Where a child puts the time it writes a line (the log's `YYYY-MM-DD HH:MM:SS`)."""


def scheduler_title(rank: int, tp: int) -> str:
    """`sglang::scheduler_TP3` (`configure_scheduler_process`: the TP tag only when tp > 1)."""
    return f"sglang::scheduler_TP{rank}" if tp > 1 else "sglang::scheduler"


DETOKENIZER_TITLE = "sglang::detokenizer"


def set_title(title: str) -> None:
    """Name this process `title` in `ps` as `setproctitle.setproctitle` does: through the package
    where it is installed, else by writing over the command line the kernel shows
    (`/proc/self/mem` from `arg_start` to `arg_end`, NUL-padded) and `PR_SET_NAME`."""
    try:
        import setproctitle  # optional, as in SGLang's venv
    except ImportError:
        pass
    else:
        setproctitle.setproctitle(title)
        return
    with contextlib.suppress(OSError, ValueError, IndexError, AttributeError):
        stat = Path("/proc/self/stat").read_text()
        fields = stat[stat.rfind(")") + 2 :].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49)
        data = title.encode()[: max(0, end - start - 1)]
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            mem.write(data + b"\0" * (end - start - len(data)))
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).prctl(PR_SET_NAME, title.encode()[:15], 0, 0, 0)


def _stamp() -> str:
    return dt.datetime.now().strftime("%Y-%m-%d %H:%M:%S")


@dataclass
class Child:
    """One child process of the server: its name as SGLang's SubprocessWatchdog calls it
    (`scheduler_3`, `detokenizer`), its title, pid, the parent's ends of its pipes, and its exit
    code once reaped (multiprocessing's convention: minus the signal that ended it)."""

    name: str
    title: str
    pid: int
    control: int
    acks: int
    rank: int | None = None
    exit_code: int | None = None

    @property
    def alive(self) -> bool:
        """Whether the process still runs (it is reaped here when it ended)."""
        if self.exit_code is not None:
            return False
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            self.exit_code = self.exit_code if self.exit_code is not None else 0
            return False
        if pid == 0:
            return True
        self.exit_code = os.waitstatus_to_exitcode(status)
        return False

    def send(self, command: Mapping[str, object]) -> bool:
        """Write one command line to the child; False when it is gone."""
        try:
            os.write(self.control, (json.dumps(command) + "\n").encode())
        except OSError:
            return False
        return True

    def wait_ack(self, timeout: float = ACK_TIMEOUT_S) -> bool:
        """Wait until the child says it did what it was told (False: it died or took too long)."""
        ready, _, _ = select.select([self.acks], [], [], timeout)
        if not ready:
            return False
        try:
            return os.read(self.acks, 1) == b"k"
        except OSError:
            return False


class ProcessTree:
    """The main process's children: the schedulers in rank order, then the detokenizer."""

    def __init__(self, children: Sequence[Child]) -> None:
        self.children = list(children)
        self.noticed: set[int] = set()
        """Pids whose death the parent already acted on (the SubprocessWatchdog reports once)."""

    @classmethod
    def spawn(cls, tp: int, *, orphan: bool = False) -> ProcessTree:
        """Fork `tp` scheduler processes and the detokenizer, as `_launch_subprocesses` starts
        them. With `orphan` the schedulers ask for no parent-death signal and outlive the main
        process (the `orphan-scheduler` fault)."""
        parent = os.getpid()
        specs: list[tuple[str, str, int | None]] = [
            (f"scheduler_{r}", scheduler_title(r, tp), r) for r in range(tp)
        ]
        specs.append(("detokenizer", DETOKENIZER_TITLE, None))
        children: list[Child] = []
        for name, title, rank in specs:
            control_r, control_w = os.pipe()
            ack_r, ack_w = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: never returns
                os.close(control_w)
                os.close(ack_r)
                for other in children:
                    for fd in (other.control, other.acks):
                        with contextlib.suppress(OSError):
                            os.close(fd)
                deathsig = not (orphan and rank is not None)
                _child_main(title, control_r, ack_w, parent, deathsig)
            os.close(control_r)
            os.close(ack_w)
            children.append(Child(name, title, pid, control_w, ack_r, rank))
        return cls(children)

    # ---- who is who ---------------------------------------------------------------------------

    @property
    def schedulers(self) -> list[Child]:
        """The scheduler processes, rank 0 first."""
        return [c for c in self.children if c.rank is not None]

    def scheduler(self, rank: int) -> Child:
        """The scheduler process of TP rank `rank`."""
        return self.schedulers[rank]

    @property
    def pids(self) -> list[int]:
        """Every child's pid."""
        return [c.pid for c in self.children]

    # ---- deaths -------------------------------------------------------------------------------

    def fail(self, texts: Mapping[int, str]) -> None:
        """Each rank of `texts` (rank -> its log text, already prefixed) writes its text to the log
        (its standard error, the server's) and SIGQUITs the parent, as a scheduler that hit an
        exception does; one rank after the other, each once it confirmed, so the log holds every
        rank's lines in rank order before the parent's handler runs."""
        for rank, text in sorted(texts.items()):
            child = self.scheduler(rank)
            if child.send({"op": "fail", "text": text}):
                child.wait_ack()

    def die(self, rank: int, sig: int, text: str = "") -> int | None:
        """Rank `rank`'s scheduler writes `text` (if any) and dies of `sig`, untold to its parent;
        returns its exit code (minus the signal) once reaped, None if it did not end in time."""
        child = self.scheduler(rank)
        if child.send({"op": "die", "signal": int(sig), "text": text}):
            child.wait_ack()
        return self.reap(child, ACK_TIMEOUT_S)

    def oom_killed(self, rank: int) -> int | None:
        """The kernel's OOM killer SIGKILLs rank `rank`'s scheduler; its exit code once reaped."""
        child = self.scheduler(rank)
        with contextlib.suppress(ProcessLookupError):
            os.kill(child.pid, signal.SIGKILL)
        return self.reap(child, ACK_TIMEOUT_S)

    def watchdog(self, texts: Mapping[int, str], after_s: float, quit_after_s: float) -> None:
        """Arm the scheduler watchdog of each rank of `texts`: `after_s` from now it writes its
        text (`{stamp}` becomes the time), and `quit_after_s` later SIGQUITs the parent."""
        for rank, text in sorted(texts.items()):
            command = {"op": "watchdog", "after": after_s, "text": text, "quit_after": quit_after_s}
            self.scheduler(rank).send(command)

    def crashed(self) -> list[Child]:
        """Children that ended with a non-zero code since last asked (SubprocessWatchdog's
        `_check_processes`: `proc.is_alive() or proc.exitcode == 0` is fine)."""
        out = []
        for child in self.children:
            if child.pid in self.noticed or child.alive:
                continue
            if child.exit_code != 0:
                self.noticed.add(child.pid)
                out.append(child)
        return out

    @staticmethod
    def reap(child: Child, timeout: float) -> int | None:
        """Wait up to `timeout` for `child` to end; its exit code, or None."""
        deadline = time.monotonic() + timeout
        while child.alive:
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.002)
        return child.exit_code

    def kill(self, wait_s: float = 0.0) -> None:
        """`kill_process_tree`'s part for the children: SIGKILL each one still alive, then (with
        `wait_s`) wait until each is reaped, as 0.5.23's `wait_timeout` does."""
        live = [c for c in self.children if c.alive]
        for child in live:
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signal.SIGKILL)
        if wait_s > 0:
            for child in live:
                self.reap(child, wait_s)

    def shutdown(self) -> None:
        """A graceful stop (`ShutdownReq`): each child exits 0 and is reaped."""
        for child in self.children:
            if child.alive:
                child.send({"op": "exit"})
        for child in self.children:
            self.reap(child, ACK_TIMEOUT_S)


class RankMemory:
    """The GPU state of a tree: one entry per scheduler process, under its pid, for the one GPU
    its rank runs on (a rank with no GPU, past `CUDA_VISIBLE_DEVICES`, holds none)."""

    def __init__(
        self,
        directory: Path,
        tree: ProcessTree,
        gpus: Sequence[int],
        total_bytes: int,
        hold_seconds: float | None,
    ) -> None:
        self.directory = Path(directory)
        self.tree = tree
        self.writers: dict[int, gpustate.GpuStateWriter] = {}
        for child in tree.schedulers:
            assert child.rank is not None
            if child.rank < len(gpus):
                self.writers[child.rank] = gpustate.GpuStateWriter(
                    self.directory, child.pid, {gpus[child.rank]: total_bytes}, hold_seconds
                )

    @property
    def pids(self) -> list[int]:
        """The pids that hold (or will hold) this server's memory."""
        return [w.pid for w in self.writers.values()]

    def set_all(self, used_bytes: int) -> None:
        """Every live rank holds `used_bytes` on its GPU."""
        for rank, writer in self.writers.items():
            if self.tree.scheduler(rank).alive:
                writer.set_all(used_bytes)

    def heartbeat(self) -> None:
        """Beat the entry of every rank still alive (a dead rank's hold runs from its last beat)."""
        for rank, writer in self.writers.items():
            if self.tree.scheduler(rank).alive:
                writer.heartbeat()

    def release(self) -> None:
        """The server is exiting: drop every rank's entry, or stamp the end of its hold."""
        for writer in self.writers.values():
            writer.release()


# ---- the child ---------------------------------------------------------------------------------


def _child_main(title: str, control: int, acks: int, parent: int, deathsig: bool) -> NoReturn:
    """A child process's whole life: set up as SGLang's children do, then obey the parent."""
    code = 0
    try:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a simulated segfault leaves no core
        if deathsig:
            ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
            if os.getppid() != parent:  # the parent died before the prctl
                os._exit(0)
        set_title(title)
        _obey(control, acks, parent, orphan=not deathsig)
    except BaseException:  # a child never unwinds into the parent's code
        code = 1
    os._exit(code)


def _write_log(text: str) -> None:
    if text:
        with contextlib.suppress(OSError):
            os.write(2, text.replace(STAMP, _stamp()).encode())


def _quit(parent: int) -> None:
    """`parent_process.send_signal(signal.SIGQUIT)`, if the parent is still ours."""
    if os.getppid() == parent:
        with contextlib.suppress(ProcessLookupError):
            os.kill(parent, signal.SIGQUIT)


def _obey(control: int, acks: int, parent: int, orphan: bool) -> None:
    """Read commands until the parent closes the pipe (it died: an orphan lives on, as a scheduler
    blocked in its event loop does; any other child ends)."""
    timers: list[tuple[float, str, str]] = []  # (when, what, text)
    buf = b""
    while True:
        now = time.monotonic()
        for item in sorted(t for t in timers if t[0] <= now):
            timers.remove(item)
            if item[1] == "log":
                _write_log(item[2])
            else:
                _quit(parent)
        wait = max(0.0, min(t[0] for t in timers) - now) if timers else None
        ready, _, _ = select.select([control], [], [], wait)
        if not ready:
            continue
        data = os.read(control, 65536)
        if not data:
            if orphan:
                while True:
                    signal.pause()
            return
        buf += data
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            cmd = json.loads(line)
            op = cmd.get("op")
            if op == "fail":
                _write_log(str(cmd.get("text", "")))
                os.write(acks, b"k")
                _quit(parent)
            elif op == "die":
                _write_log(str(cmd.get("text", "")))
                os.write(acks, b"k")
                sig = int(cmd["signal"])
                signal.signal(sig, signal.SIG_DFL)
                os.kill(os.getpid(), sig)
                time.sleep(1.0)
                os._exit(128 + sig)
            elif op == "watchdog":
                at = time.monotonic() + float(cmd["after"])
                timers.append((at, "log", str(cmd.get("text", ""))))
                timers.append((at + float(cmd["quit_after"]), "quit", ""))
            elif op == "exit":
                return
