"""Starting one server's process: the machine checked, the command started in its own session
with its output going into the trial's server.log, and the pidfile written.

`spawn(spec)` checks that the port is free, that no server autotune started earlier is still
running, and that no other process holds memory on the GPUs it will use (reading their baseline);
then it starts the command in its own session (so its whole tree can be signalled as one group),
with stdout and stderr going straight into the log, through the masking writer
(`server.logpipe`) when there is a secret to mask, and writes a pidfile that names the process,
its owner and its log writer, its argv with the secrets masked.

Kept apart from the handle that follows the server from then on (`server.lifecycle.Server`,
whose `launch` calls this): starting is done once, before there is anything to follow, and
either hands over a running process with its pidfile or raises `HarnessError` with nothing left
running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from autotune import masking as scrub
from autotune.errors import HarnessError
from autotune.server import pidfile, preflight, procs
from autotune.server.gpu import GpuMemory, GpuProbe
from autotune.server.launchspec import LaunchSpec
from autotune.server.logpipe import LogWriter
from autotune.server.teardown import Clock, Sleep


@dataclass(frozen=True)
class Spawned:
    """A server process just started, and what the handle that follows it is given with it: its
    pidfile record and path, the GPUs' memory before it, and the masking log writer (None when
    there is no secret to mask)."""

    process: subprocess.Popen[bytes]
    record: pidfile.PidRecord
    record_path: Path
    baseline: list[GpuMemory]
    writer: LogWriter | None


def spawn(spec: LaunchSpec, probe: GpuProbe | None, clock: Clock, sleep: Sleep) -> Spawned:
    """Start the server; raises HarnessError when the machine is not ready for it."""
    command = spec.command()
    preflight.check_no_server_running(spec.run_dir)
    preflight.check_port(spec.host, spec.port)
    baseline: list[GpuMemory] = []
    if probe is not None:
        baseline = preflight.gpu_baseline(
            probe, spec.devices(), spec.foreign_gpu, spec.foreign_wait_s, clock, sleep
        )
    spec.log_path.parent.mkdir(parents=True, exist_ok=True)
    secrets = spec.secrets()
    writer: LogWriter | None = None
    try:
        # Appending, so that a copytruncate rotation leaves no hole; owner-only.
        out = os.open(spec.log_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    except OSError as exc:
        raise HarnessError(f"cannot write {spec.log_path}: {exc.strerror or exc}") from exc
    try:
        if secrets:
            os.close(out)
            writer, out = LogWriter.start(spec.log_path, secrets)
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=spec.environment(),
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        if writer is not None:
            os.close(out)
            out = -1
            writer.finish(time.monotonic, time.sleep, 5.0)
        raise HarnessError(f"could not start {command[0]!r}: {exc}") from exc
    finally:
        if out >= 0:
            os.close(out)
    record = _pid_record(spec, process.pid, command, writer)
    try:
        path = pidfile.write(spec.run_dir, record)
    except OSError as exc:
        procs.signal_group(record.pgid, record.start_ticks, signal.SIGKILL)
        process.wait()
        if writer is not None:
            writer.finish(clock, sleep, 5.0)
        raise HarnessError(f"could not write the pidfile in {spec.run_dir}: {exc}") from exc
    return Spawned(process, record, path, baseline, writer)


def _pid_record(
    spec: LaunchSpec, pid: int, command: tuple[str, ...], writer: LogWriter | None
) -> pidfile.PidRecord:
    """What the pidfile keeps about a server just started: who it is, who owns it, its log
    writer, its argv with the secrets masked."""
    info = procs.read_proc(pid)
    owner_pid, owner_ticks = pidfile.owner()
    return pidfile.PidRecord(
        pid=pid,
        pgid=info.pgid if info else pid,
        sid=info.sid if info else pid,
        start_ticks=info.start_ticks if info else 0,
        boot_id=procs.boot_id(),
        host=spec.host,
        port=spec.port,
        log_path=str(spec.log_path),
        argv=scrub.masked_argv(command, [spec.api_key] if spec.api_key else []),
        launched_at=time.time(),
        owner_pid=owner_pid,
        owner_start_ticks=owner_ticks,
        study=spec.study,
        members=(writer.identity,) if writer is not None else (),
    )
