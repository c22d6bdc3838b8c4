"""Errors autotune raises, and what each means for the user.

    AutotuneError               base; never escapes `cli.main` as a traceback
    ├── UsageError              bad input (study file, flags, paths): one line, exit code 2
    │   └── ConfigError         a study-file key with a bad value; names the key and the fix
    └── HarnessError            autotune or the machine failed (not the parameters): exit code 1

Expected trial outcomes (startup OOM, runtime OOM, crash, hang, timeout) are not exceptions:
they are values recorded on the trial.
"""

from __future__ import annotations


class AutotuneError(Exception):
    """Base of every error autotune raises on purpose."""

    exit_code = 1


class UsageError(AutotuneError):
    """The user's input is wrong; the message says which value and how to fix it."""

    exit_code = 2


class ConfigError(UsageError):
    """A study-file value is wrong: `key` is its dotted path, e.g. `search.mem_fraction_static`."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(f"{key}: {message}")
        self.key = key


class HarnessError(AutotuneError):
    """autotune or the machine failed in a way that is not the trial parameters' fault."""

    exit_code = 1
