"""Write a flag table (`flagtables/X.Y.Z.json`) from a real SGLang's own parser.

Run it with the Python that has that SGLang installed (it imports nothing of autotune):

    /path/to/sglang-venv/bin/python autotune/sim/flagdump.py > autotune/sim/flagtables/0.5.23.json

`--stub-torchvision` installs an empty `torchvision` package first, for a CPU-only venv where
no torchvision matches torch (SGLang's VLM configs import it; the parser does not use it).
For an older release unpack its wheel and put it first on PYTHONPATH.

The table holds every action `ServerArgs.add_cli_args` declares (option strings in SGLang's
order, dest, value type by name, nargs, choices, default) and `ServerArgs`' fields in order with
their raw defaults, which the startup `server_args=` line and `/server_info` list.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.abc
import importlib.machinery
import importlib.metadata
import json
import sys
import types
from typing import Any

_PLAIN = (type(None), bool, int, float, str)


def stub_torchvision() -> None:
    """An empty `torchvision` package for a CPU-only venv where none matches torch (also used by
    the tests' probe of SGLang's response code, which loads this file by path)."""
    import sglang  # noqa: F401

    with contextlib.suppress(ImportError):  # transformers looks for torchvision on import
        import transformers  # noqa: F401

    class _Stub(types.ModuleType):
        def __getattr__(self, name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)
            return type(name, (), {"__init__": lambda s, *a, **k: None})

    class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
            if name.split(".")[0] == "torchvision":
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec: Any) -> Any:
            return _Stub(spec.name)

        def exec_module(self, module: Any) -> None:
            module.__path__ = []

    sys.meta_path.insert(0, _Finder())


def plain(value: Any) -> Any:
    """A value Python's repr can write back: primitives, lists/tuples/dicts of them."""
    if isinstance(value, _PLAIN):
        return value
    if isinstance(value, list | tuple):
        return type(value)(plain(v) for v in value)
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if not isinstance(value, type) and field_names(type(value)):
        return {name: plain(getattr(value, name)) for name in field_names(type(value))}
    return repr(value)


def field_defaults(cls: type) -> list[tuple[str, Any]]:
    """A dataclass's fields and their declared defaults (None where there is none)."""
    out = []
    for f in dataclasses.fields(cls):
        value: Any = None
        if f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        out.append((f.name, value))
    return out


def field_names(cls: type) -> tuple[str, ...]:
    """A dataclass's or msgspec Struct's field names, in order (SGLang 0.5.23 uses Structs)."""
    struct_fields = getattr(cls, "__struct_fields__", None)
    if struct_fields is not None:
        return tuple(struct_fields)
    if dataclasses.is_dataclass(cls):
        return tuple(f.name for f in dataclasses.fields(cls))
    return ()


ACTIONS = {
    "_StoreAction": "store",
    "_StoreTrueAction": "store_true",
    "_StoreFalseAction": "store_false",
    "_StoreConstAction": "store_const",
    "BooleanOptionalAction": "bool_optional",
    "LoRAPathAction": "lora_paths",
    "DeprecatedAction": "deprecated",
    "DeprecatedStoreTrueAction": "deprecated_true",
    "DeprecatedStoreConstAction": "deprecated_const",
    "DeprecatedAliasStoreAction": "deprecated_alias",
}


_FLAG_DEFAULTS = {"action": "store", "type": None, "nargs": None, "choices": None}


def flag_entry(action: argparse.Action) -> str:
    """One argparse action as its flag table line, a JSON object of the `Flag` fields: only what
    differs from a plain store is written, set choices sorted (SGLang's order would be the hash
    order)."""
    kind = ACTIONS.get(type(action).__name__)
    if kind is None:
        raise SystemExit(f"flagdump: unknown action {type(action).__name__} for {action.dest}")
    entry: dict[str, Any] = {"names": list(action.option_strings), "dest": action.dest}
    entry["action"] = kind
    if action.type is not None:
        entry["type"] = getattr(action.type, "__name__", repr(action.type))
    entry["nargs"] = action.nargs
    if action.choices is not None:
        choices = [plain(c) for c in action.choices]
        if isinstance(action.choices, set | frozenset):  # SGLang's order is the hash order
            choices.sort(key=repr)
        entry["choices"] = choices
    entry = {k: v for k, v in entry.items() if _FLAG_DEFAULTS.get(k, ...) != v}
    default = plain(action.default)
    if default is not None:
        entry["default"] = default
    const = getattr(action, "const_value", None) if kind == "deprecated_const" else action.const
    if const is not None and kind not in ("store_true", "store_false", "deprecated_true"):
        entry["const"] = plain(const)
    new_flag = getattr(action, "new_flag", None)
    if new_flag:
        entry["new_flag"] = new_flag
    error = getattr(action, "error_message", None)
    if error:
        entry["error_message"] = error
    return json.dumps(entry, ensure_ascii=False)


def main() -> int:
    """Print the flag table of the SGLang installed in this Python as JSON, a flag or field a
    line: every action of `ServerArgs.add_cli_args`, the fields of `ServerArgs` with their raw
    defaults."""
    if "--stub-torchvision" in sys.argv[1:]:
        stub_torchvision()
    from sglang.srt.server_args import ServerArgs, prepare_server_args

    version = importlib.metadata.version("sglang")
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    actions = [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]
    try:
        raw: Any = prepare_server_args(["--model-path", "MODEL"])
        fields = [(name, plain(getattr(raw, name, None))) for name in field_names(ServerArgs)]
    except Exception:  # an older release resolves at construction and needs an accelerator
        fields = [(name, plain(value)) for name, value in field_defaults(ServerArgs)]
    fields = [(name, None if name == "model_path" else value) for name, value in fields]
    rows = ",\n".join(json.dumps([name, value], ensure_ascii=False) for name, value in fields)
    out = [
        "{",
        f'"version": {json.dumps(version)},',
        '"flags": [',
        ",\n".join(flag_entry(a) for a in actions),
        "],",
        '"fields": [',
        rows,
        "]",
        "}",
        "",
    ]
    sys.stdout.write("\n".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
