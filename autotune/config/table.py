"""The one reader of a configuration table: a study file's TOML tables, the `[workload]` table
and its phases, and each JSON object of a workload dataset.

`Table` is a typed view of one table that knows its dotted path, so every error is one line
naming the key (`workload.phases[1].rate: must be ≥ 0.001; got 0`). It remembers
which keys were read: `only(...)` refuses a key outside a given list, `finish()` one that was
never read, each with the closest known key as a hint. Values are never coerced: a whole number
is never a string, `true` is never 1.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping, Sequence
from typing import TypeVar

from autotune.errors import ConfigError

_T = TypeVar("_T")


def kind_of(v: object) -> str:
    """How an error names a value's type (and the value, where short)."""
    if isinstance(v, bool):
        return f"a boolean ({str(v).lower()})"
    if isinstance(v, int | float):
        return f"a number ({v})"
    if isinstance(v, str):
        return f"a string ({v!r})"
    if isinstance(v, list):
        return "a list"
    if isinstance(v, dict):
        return "a table"
    return type(v).__name__


def _bounds(low: float | None, high: float | None) -> str:
    if low is not None and high is not None:
        return f" in [{low}, {high}]"
    if low is not None:
        return f" ≥ {low}"
    return f" ≤ {high}" if high is not None else ""


class Table:
    """One table at dotted path `prefix` ("" for the file itself)."""

    def __init__(self, data: Mapping[str, object], prefix: str) -> None:
        self._data = data
        self._prefix = prefix
        self._used: set[str] = set()

    @staticmethod
    def of(raw: object, key: str) -> Table:
        """`raw` read as the table at `key`; an error when it is not a table."""
        if not isinstance(raw, Mapping):
            raise ConfigError(key, f"must be a table, not {kind_of(raw)}")
        return Table(raw, key)

    # -- keys -------------------------------------------------------------------------------

    def key(self, k: str = "") -> str:
        """The dotted path of key `k` (of the table itself when empty)."""
        if not k:
            return self._prefix
        return f"{self._prefix}.{k}" if self._prefix else k

    def keys(self) -> list[str]:
        """The keys the table holds, in the file's order."""
        return list(self._data)

    def __contains__(self, k: str) -> bool:
        return k in self._data

    def raw(self, k: str) -> object:
        """The value of `k` as parsed (None when absent); `k` counts as read."""
        self._used.add(k)
        return self._data.get(k)

    def only(self, *allowed: str) -> None:
        """Refuse any key outside `allowed`, naming a near spelling when there is one."""
        for k in self._data:
            if k not in allowed:
                close = [a for a in allowed if a.replace("_", "") == k.replace("_", "").lower()]
                hint = f"did you mean {close[0]}?" if close else f"known keys: {', '.join(allowed)}"
                raise ConfigError(self.key(k), f"unknown key; {hint}")

    def finish(self) -> None:
        """Refuse any key that was never read (the keys read are the ones this table knows)."""
        self.only(*sorted(self._used))

    def _missing(self, k: str, what: str) -> ConfigError:
        """The error for a required key that is absent: a near unknown key is named as the
        likely typo, else `k` is said to be missing, with what it takes."""
        unknown = [u for u in self._data if u not in self._used and u != k]
        close = difflib.get_close_matches(k, unknown, n=1, cutoff=0.75)
        if close:
            return ConfigError(self.key(close[0]), f"unknown key; did you mean {k}?")
        return ConfigError(self.key(k), f"is missing; it takes {what}")

    def _given(self, k: str, v: _T | None, default: _T, required: bool, what: str) -> _T:
        """`v`, or `default` when it is absent (the `_missing` error, naming `what` it takes, when
        `k` is `required`)."""
        if v is None:
            if required:
                raise self._missing(k, what)
            return default
        return v

    # -- tables and strings -----------------------------------------------------------------

    def table(self, k: str, *, required: bool = False) -> Table:
        """The sub-table `k` (an empty one when absent and not `required`)."""
        v = self.raw(k)
        if v is None:
            if required:
                raise ConfigError(self.key(k), f"is missing; add a [{self.key(k)}] table")
            return Table({}, self.key(k))
        if not isinstance(v, dict):
            raise ConfigError(self.key(k), f"must be a table ([{self.key(k)}]), not {kind_of(v)}")
        return Table(v, self.key(k))

    def string(self, k: str, *, default: str = "", required: bool = False) -> str:
        """A string, "" allowed."""
        v = self.raw(k)
        if v is None:
            if required:
                raise self._missing(k, "a string")
            return default
        if not isinstance(v, str):
            raise ConfigError(self.key(k), f"must be a string, not {kind_of(v)}")
        return v

    def maybe_string(self, k: str, *, choices: Sequence[str] = ()) -> str | None:
        """A non-empty string (one of `choices` when given), None when absent."""
        v = self.raw(k)
        if v is None:
            return None
        if not isinstance(v, str) or not v:
            raise ConfigError(self.key(k), f"must be a non-empty string, not {kind_of(v)}")
        if choices and v not in choices:
            raise ConfigError(self.key(k), f"{v!r} is not one of {', '.join(choices)}")
        return v

    def string_list(self, k: str, *, default: list[str]) -> list[str]:
        """A list of strings."""
        v = self.raw(k)
        if v is None:
            return list(default)
        if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
            raise ConfigError(self.key(k), f"must be a list of strings, not {kind_of(v)}")
        return [str(x) for x in v]

    def choice(self, k: str, allowed: Sequence[str], *, default: str) -> str:
        """One of `allowed`."""
        v = self.string(k, default=default)
        if v not in allowed:
            raise ConfigError(self.key(k), f"{v!r} is not one of {', '.join(allowed)}")
        return v

    def boolean(self, k: str, *, default: bool) -> bool:
        """true or false."""
        v = self.raw(k)
        if v is None:
            return default
        if not isinstance(v, bool):
            raise ConfigError(self.key(k), f"must be true or false, not {kind_of(v)}")
        return v

    # -- numbers ----------------------------------------------------------------------------

    def maybe_number(
        self, k: str, *, low: float | None = None, high: float | None = None
    ) -> float | None:
        """A finite number within the bounds, as written (a whole number stays an int, so a
        range of whole numbers stays one), None when absent."""
        v = self.raw(k)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int | float):
            raise ConfigError(
                self.key(k), f"must be a number{_bounds(low, high)}, not {kind_of(v)}"
            )
        if not math.isfinite(v):
            raise ConfigError(self.key(k), f"must be a finite number; got {v}")
        self._within(k, v, low, high)
        return v

    def number(
        self,
        k: str,
        *,
        default: float = 0.0,
        required: bool = False,
        low: float | None = None,
        high: float | None = None,
    ) -> float:
        """`maybe_number`, with `default` when absent (an error when `required`)."""
        v = self.maybe_number(k, low=low, high=high)
        return self._given(k, v, default, required, f"a number{_bounds(low, high)}")

    def positive(self, k: str, *, default: float = 1.0) -> float:
        """A number > 0."""
        v = self.number(k, default=default)
        if v <= 0:
            raise ConfigError(self.key(k), f"must be > 0; got {v}")
        return v

    def maybe_integer(
        self, k: str, *, low: int | None = None, high: int | None = None
    ) -> int | None:
        """A whole number within the bounds, None when absent."""
        v = self.raw(k)
        if v is None:
            return None
        if isinstance(v, bool) or not isinstance(v, int):
            raise ConfigError(
                self.key(k), f"must be a whole number{_bounds(low, high)}, not {kind_of(v)}"
            )
        self._within(k, v, low, high)
        return v

    def integer(
        self,
        k: str,
        *,
        default: int = 0,
        required: bool = False,
        low: int | None = None,
        high: int | None = None,
    ) -> int:
        """`maybe_integer`, with `default` when absent (an error when `required`)."""
        v = self.maybe_integer(k, low=low, high=high)
        return self._given(k, v, default, required, f"a whole number{_bounds(low, high)}")

    def _within(self, k: str, v: float, low: float | None, high: float | None) -> None:
        """The bound `v` breaks, named alone (`must be ≥ 1; got 0`)."""
        if low is not None and v < low:
            raise ConfigError(self.key(k), f"must be ≥ {low}; got {v}")
        if high is not None and v > high:
            raise ConfigError(self.key(k), f"must be ≤ {high}; got {v}")
