"""`python -m autotune.sim <SGLang flags> [--sim-*]`: launch one simulated SGLang server.

Owns only the process entry: find the profile and the release (`--sim-version`, else the
profile's `sglang_version`), parse the command line with that release's flags, run `SimServer`.
A bad profile exits 2 like a bad flag. It is kept apart so the simulator is launched the way
SGLang's `python -m sglang.launch_server` is: one module, SGLang's flags, one server process
(which starts its scheduler and detokenizer children, `tree`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

from autotune.sim.flags import parse_command_line, preparse
from autotune.sim.profiles import ProfileError, load_profile
from autotune.sim.server import SimServer
from autotune.sim.startup import LAUNCH_WARNING
from autotune.sim.versions import VERSIONS


def main(argv: Sequence[str] | None = None) -> int:
    """Run one simulated server for `argv` (default `sys.argv[1:]`): the profile and release first,
    then SGLang's command line parsed with that release's flags; a bad profile exits 2, as a bad
    flag does."""
    args = list(sys.argv[1:] if argv is None else argv)
    profile_name, named = preparse(args)
    try:
        profile = load_profile(profile_name)
    except ProfileError as exc:
        sys.stderr.write(f"python -m autotune.sim: error: --sim-profile: {exc}\n")
        return 2
    release = VERSIONS.get(named or profile.sglang_version)
    if release is not None and release.launch_warning:
        sys.stderr.write(LAUNCH_WARNING + "\n")
        sys.stderr.flush()
    cmd = parse_command_line(
        args,
        env=os.environ,
        default_version=profile.sglang_version,
        architecture=profile.model.architecture,
    )
    return SimServer(cmd, profile, os.environ).run()


if __name__ == "__main__":
    raise SystemExit(main())
