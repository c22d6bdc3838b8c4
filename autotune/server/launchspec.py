"""How to launch and judge one server (`LaunchSpec`): its command line, environment, address,
GPUs, the secrets to keep out of its log, and every time limit the handle enforces.

Kept apart from the handle (`server.lifecycle.Server`) because a spec is a pure value: the
trial's live launcher, the confirm command and the tests build one without starting anything.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from autotune import masking as scrub
from autotune.errors import UsageError
from autotune.logparse.phase import PhaseLimits
from autotune.server.gpu import MiB, visible_devices


@dataclass(frozen=True)
class LaunchSpec:
    """How to launch and judge one server. `argv` is the full command without `--host`/`--port`
    (added from `host`/`port`); `env` is added to (or, with `inherit_env=False`, replaces) the
    environment. `api_key` authenticates autotune's own HTTP checks and is masked wherever
    autotune writes the command line; it is not added to `argv`."""

    argv: tuple[str, ...]
    log_path: Path
    run_dir: Path
    host: str = "127.0.0.1"
    port: int = 30000
    env: Mapping[str, str] = field(default_factory=dict)
    inherit_env: bool = True
    api_key: str | None = None
    study: str = ""
    """The study this server runs for, recorded in its pidfile."""
    phase_limits: PhaseLimits = field(default_factory=PhaseLimits)
    startup_s: float = 7200.0
    stall_s: float = 600.0
    ready_check_s: float = 120.0
    health_timeout_s: float = 30.0
    poll_s: float = 0.05
    exit_wait_s: float = 10.0
    health_interval_s: float = 5.0
    unhealthy_s: float = 60.0
    stop_grace_s: float = 30.0
    release_s: float = 120.0
    kernel_log: Path | None = None
    """A simulated machine's kernel log, where its OOM killer names what it killed (the
    simulator keeps it in its state folder); None: the host's own kernel (`/dev/kmsg` and the
    server's memory cgroup, `deaths.KernelOomWatch`)."""
    gpu_indices: tuple[int, ...] | None = None
    foreign_gpu: str = "refuse"
    foreign_wait_s: float = 600.0
    gpu_tolerance_bytes: int = 256 * MiB

    @property
    def base_url(self) -> str:
        """`http://host:port`, an IPv6 host in brackets."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def command(self) -> tuple[str, ...]:
        """`argv` with autotune's `--host` and `--port`; a UsageError when `argv` sets them."""
        if any(a.split("=", 1)[0] in ("--host", "--port") for a in self.argv):
            raise UsageError("the server command must not set --host or --port; autotune sets them")
        return (*self.argv, "--host", self.host, "--port", str(self.port))

    def environment(self) -> dict[str, str]:
        """The server's environment. CUDA numbers devices fastest-first unless told otherwise;
        `CUDA_DEVICE_ORDER=PCI_BUS_ID` makes CUDA_VISIBLE_DEVICES (and --gpus) mean the NVML
        indices the GPU checks read, unless the study sets an order itself."""
        base = dict(os.environ) if self.inherit_env else {}
        base.update(self.env)
        base.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
        return base

    def secrets(self) -> tuple[str, ...]:
        """What must never reach the log in clear: the API key and every secret flag's value."""
        found = [self.api_key] if self.api_key else []
        for i, arg in enumerate(self.argv):
            flag, eq, value = arg.partition("=")
            if flag in scrub.SECRET_FLAGS:
                found.append(value if eq else (self.argv[i + 1] if i + 1 < len(self.argv) else ""))
        return tuple(dict.fromkeys(s for s in found if s))

    def devices(self) -> tuple[int, ...] | None:
        """The GPUs the server uses: `gpu_indices`, else CUDA_VISIBLE_DEVICES of its
        environment (None: every GPU)."""
        if self.gpu_indices is not None:
            return self.gpu_indices
        return visible_devices(self.environment())
