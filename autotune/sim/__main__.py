"""`python -m autotune.sim <SGLang flags> [--sim-*]`: launch one simulated SGLang server.

Owns only the process entry: parse the command line, load the profile (a bad one exits 2 like a
bad flag), run `SimServer`. It is kept apart so the simulator is launched the way SGLang's
`python -m sglang.launch_server` is: one module, SGLang's flags, one server process.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from autotune.sim.flags import parse_command_line
from autotune.sim.profiles import ProfileError, load_profile
from autotune.sim.server import SimServer


def main(argv: Sequence[str] | None = None) -> int:
    cmd = parse_command_line(sys.argv[1:] if argv is None else argv, env=os.environ)
    try:
        profile = load_profile(cmd.sim.profile)
    except ProfileError as exc:
        sys.stderr.write(f"python -m autotune.sim: error: --sim-profile: {exc}\n")
        return 2
    return SimServer(cmd, profile, os.environ).run()


if __name__ == "__main__":
    raise SystemExit(main())
