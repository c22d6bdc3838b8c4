"""One SGLang command-line flag as data: what `ServerArgs.add_cli_args` declares for it.

The tables `flagtable_*.py` (one per SGLang version the simulator speaks) are lists of these,
written by `flagdump.py` from the real parser of that version; `flags.py` builds an argparse
parser from a table that behaves like SGLang's (same option strings in the same order, value
types, nargs, choices, defaults), so abbreviations, ambiguities and bad values are argparse's own.
"""

from __future__ import annotations

from dataclasses import dataclass


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
