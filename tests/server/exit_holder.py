"""Holds a process in its exit for S seconds after it is SIGKILLed: `python exit_holder.py PID S`.

The stand-in for a server process the kernel keeps after SIGKILL (SGLang's pinned host buffers
can keep a dying scheduler in uninterruptible sleep, state D, for tens of seconds). A real D
state needs the kernel's help; this uses ptrace instead: it seizes PID with PTRACE_O_TRACEEXIT,
so that when PID dies, however it dies, the kernel stops it at PTRACE_EVENT_EXIT, before it
releases anything. /proc shows it alive (state `t`) and every resource it holds stays held, its
simulated GPU memory included, until this program lets it finish S seconds later (or exits).
Prints `seized` once tracing, `exit-stop` when PID is held; exit code 3 when ptrace is refused.
"""

from __future__ import annotations

import ctypes
import os
import sys
import time

PTRACE_CONT = 7
PTRACE_SEIZE = 0x4206
PTRACE_O_TRACEEXIT = 0x40
PTRACE_EVENT_EXIT = 6
WALL = 0x40000000


def main() -> int:
    pid, hold = int(sys.argv[1]), float(sys.argv[2])
    libc = ctypes.CDLL(None, use_errno=True)
    libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
    libc.ptrace.restype = ctypes.c_long
    if libc.ptrace(PTRACE_SEIZE, pid, None, ctypes.c_void_p(PTRACE_O_TRACEEXIT)) != 0:
        print(f"ptrace refused: {os.strerror(ctypes.get_errno())}", flush=True)
        return 3
    print("seized", flush=True)
    while True:
        try:
            _, status = os.waitpid(pid, WALL)
        except ChildProcessError:
            return 0
        if os.WIFEXITED(status) or os.WIFSIGNALED(status):
            return 0
        if not os.WIFSTOPPED(status):
            continue
        if status >> 8 == (5 | (PTRACE_EVENT_EXIT << 8)):
            print("exit-stop", flush=True)
            time.sleep(hold)
            libc.ptrace(PTRACE_CONT, pid, None, None)
            continue
        # A signal on its way to the process (or an event stop): let it through unchanged.
        sig = os.WSTOPSIG(status) if status >> 16 == 0 else 0
        libc.ptrace(PTRACE_CONT, pid, None, ctypes.c_void_p(sig))


if __name__ == "__main__":
    sys.exit(main())
