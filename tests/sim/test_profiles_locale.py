"""The shipped simulator profiles hold non-ASCII text; they load under an ASCII locale too
(`LC_ALL=C` with `PYTHONUTF8=0`), where Python's default file encoding is ASCII."""

from __future__ import annotations

import os
import subprocess
import sys

from autotune.sim import profiles


def test_profiles_load_under_an_ascii_locale() -> None:
    code = (
        "import locale, sys\n"
        "from autotune.sim.profiles import load_profile\n"
        "assert locale.getpreferredencoding(False).lower() in ('ascii', 'ansi_x3.4-1968')\n"
        "print(load_profile(sys.argv[1]).name)\n"
    )
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"}
    name = "kimi-k2.5-tp8-96g"
    assert profiles.load_profile(name).name == name
    done = subprocess.run(
        [sys.executable, "-c", code, name], env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == name
