"""One SGLang command-line flag as data: what `ServerArgs.add_cli_args` declares for it.

The tables `flagtables/<release>.json` (one per SGLang version the simulator speaks) hold these
and ServerArgs' fields, written by `flagdump.py` from the real parser of that version;
`flags.py` builds an argparse parser from a table that behaves like SGLang's (same option
strings in the same order, value types, nargs, choices, defaults), so abbreviations, ambiguities
and bad values are argparse's own.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources


@dataclass(frozen=True)
class Flag:
    """One argparse action of SGLang's parser.

    `action` is `store`, `store_true`, `store_false`, `store_const`, `bool_optional`
    (argparse.BooleanOptionalAction), `lora_paths`, or one of SGLang's retired-flag actions:
    `deprecated` (warns, or stops with `error_message`), `deprecated_true` (warns, stores True),
    `deprecated_const` (warns, stores `const`), `deprecated_alias` (warns, stores the value).
    `type` names the converter (`int`, `float`, `str`, `loads`, `human_readable_int`, ...).
    """

    names: tuple[str, ...]
    dest: str
    action: str = "store"
    type: str | None = None
    nargs: int | str | None = None
    choices: tuple[object, ...] | None = None
    default: object = None
    const: object = None
    new_flag: str | None = None
    error_message: str | None = None

    @property
    def name(self) -> str:
        """The first option string, as SGLang declares it (argparse's canonical spelling)."""
        return self.names[0]

    @property
    def is_bool(self) -> bool:
        """A flag that takes no value."""
        return self.nargs == 0 or self.action in ("store_true", "store_false", "bool_optional")


@dataclass(frozen=True)
class ReleaseTable:
    """One release's parser as data: its flags in SGLang's order and ServerArgs' fields in
    declaration order with their raw defaults (what `server_args=` and `/server_info` list)."""

    version: str
    flags: tuple[Flag, ...]
    fields: tuple[tuple[str, object], ...]


@cache
def release_table(version: str) -> ReleaseTable:
    """Read `flagtables/<version>.json`, shipped with the package. JSON has no tuples: option
    strings and choices come back as tuples, defaults as written (SGLang's list defaults stay
    lists)."""
    text = resources.files("autotune.sim").joinpath(f"flagtables/{version}.json").read_text()
    data = json.loads(text)
    flags = []
    for entry in data["flags"]:
        entry["names"] = tuple(entry["names"])
        if entry.get("choices") is not None:
            entry["choices"] = tuple(entry["choices"])
        flags.append(Flag(**entry))
    fields = tuple((name, value) for name, value in data["fields"])
    return ReleaseTable(version=data["version"], flags=tuple(flags), fields=fields)
