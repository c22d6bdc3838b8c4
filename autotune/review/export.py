"""`autotune export`: the winning launch command, ready to paste.

The command is the study's base command, its fixed flags and the tuned flags, built by
`autotune.config.space.server_argv` — the same function every trial's command came from — so what is
exported is what ran (`params_from_flags` reads the parameters back). Formats:

* `flags`: the flags alone, one shell-quoted line (fixed, then tuned);
* `shell`: the full command with a comment header, one flag per line;
* `json`: study, trial, params, argv, capacity_tokens, throughput_tok_s, headroom_gib, margin,
  confirmed, sglang_version and how the winner was chosen;
* `systemd`: a drop-in that replaces `ExecStart=` (and sets the study's environment).

Host and port are the study file's when it names a port (trials pick free ports). An API key is
never written: when the workload reads one from an environment variable, the command refers to
that variable instead.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

from autotune.config.space import (
    Settings,
    base_command,
    params_from_flags,
    server_argv,
    tuned_flags,
)
from autotune.config.studyfile import Scalar, StudyConfig
from autotune.errors import UsageError
from autotune.review.source import Review

FORMATS = ("flags", "shell", "json", "systemd")


@dataclass(frozen=True)
class Export:
    """One exported setting with everything the formats print."""

    study: str
    trial: int
    params: Mapping[str, Scalar]
    argv: tuple[str, ...]
    env: Mapping[str, str]
    api_key_env: str | None
    capacity_tokens: int | None
    throughput_tok_s: float | None
    headroom_gib: float | None
    predicted: bool
    margin: Mapping[str, object]
    tolerance: float | None
    chosen_trial: int | None
    confirmed: bool | None
    confirmed_label: str
    sglang_version: str | None
    backend: str
    notes: tuple[str, ...]

    program: tuple[str, ...] = ()
    """The base command at the start of `argv`."""

    @property
    def flags(self) -> tuple[str, ...]:
        """Everything after the program (fixed and tuned flags)."""
        return self.argv[len(self.program) :]

    def key_args(self) -> tuple[str, ...]:
        return ("--api-key", f"${{{self.api_key_env}}}") if self.api_key_env else ()


class _Pick(NamedTuple):
    """What is exported: the trial's (or the winner's) parameters and figures, and why."""

    params: Mapping[str, Scalar]
    figures: tuple[int | None, float | None, float | None, bool]
    """capacity, throughput, headroom, and whether they are predicted."""
    margin: dict[str, object]
    number: int
    tolerance: float | None
    chosen: int | None
    notes: tuple[str, ...]
    version: str | None


def _pick(review: Review, trial: int | None) -> _Pick:
    """Trial `trial` as it ran, else the winner; a clear error while there is none."""
    if trial is not None:
        t = review.trial(trial)
        return _Pick(
            params=dict(t.params),
            figures=(t.capacity_tokens, t.throughput_tok_s, t.headroom_gib, False),
            margin={"steps": 0, "headroom_gib": None},
            number=t.number,
            tolerance=None,
            chosen=None,
            notes=() if t.feasible else (f"trial {t.number} was {t.kind}",),
            version=t.sglang_version,
        )
    w = review.winner
    if w is None:
        raise UsageError(
            f"study {review.name} has no feasible trial to export yet; pass --trial N to "
            "export one as it ran"
        )
    return _Pick(
        params=dict(w.params),
        figures=(w.capacity_tokens, w.throughput_tok_s, w.headroom_gib, w.predicted),
        margin=w.margin.to_dict(),
        number=w.trial,
        tolerance=w.tolerance,
        chosen=w.chosen.number,
        notes=w.notes,
        version=(w.source or w.chosen).sglang_version,
    )


def build_export(review: Review, cfg: StudyConfig, *, trial: int | None = None) -> Export:
    """The winner (or trial `trial` as it ran) as an `Export` (pure)."""
    backend = cfg.server.backend
    params, figures, margin, number, tolerance, chosen, notes, version = _pick(review, trial)
    missing = [p.name for p in cfg.search.params if p.name not in params]
    if missing:
        raise UsageError(
            f"trial {number} has no value for {', '.join(missing)}: the study file's search "
            "space changed since; export with the study file the trials ran with (--config)"
        )
    argv = launch_argv(cfg, params, backend=backend)
    soaked = review.confirmation_of(params)
    confirmed = soaked.passed if soaked is not None else None
    if soaked is not None and soaked.passed and figures[3]:
        # a setting that never ran in the search was measured by its confirmation soak
        r = soaked.record
        figures = (_int(r.get("capacity_tokens")), _num(r.get("throughput_tok_s")),
                   _num(r.get("headroom_gib")), False)  # fmt: skip
        notes = (*notes, "figures measured by the confirmation soak")
    key_env = _api_key_env(cfg)
    return Export(
        study=review.name,
        trial=number,
        params=params,
        argv=tuple(argv),
        env=dict(cfg.server.env),
        api_key_env=key_env,
        capacity_tokens=figures[0],
        throughput_tok_s=figures[1],
        headroom_gib=figures[2],
        predicted=figures[3],
        margin=margin,
        tolerance=tolerance,
        chosen_trial=chosen,
        confirmed=confirmed,
        confirmed_label=review.confirmed_label(params),
        sglang_version=version,
        backend=backend,
        notes=tuple(notes),
        program=base_command(cfg.server, backend),
    )


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _int(v: object) -> int | None:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) and v > 0 else None


def launch_argv(cfg: StudyConfig, params: Mapping[str, Scalar], *, backend: str) -> list[str]:
    """Base command + fixed flags + tuned flags (+ host and port when the study fixes them)."""
    settings = Settings(params=params, flags=tuned_flags(params, cfg.search))
    extra: list[str] = []
    if cfg.server.port:
        extra = ["--host", cfg.server.host, "--port", str(cfg.server.port)]
    return server_argv(cfg.server, settings, backend=backend, extra=extra)


def round_trip(argv: Sequence[str], cfg: StudyConfig) -> dict[str, Scalar]:
    """The parameters read back out of an exported command."""
    return params_from_flags(list(argv), cfg.search)


def _api_key_env(cfg: StudyConfig) -> str | None:
    return cfg.workload.api_key_env or None


# ------------------------------------------------------------------------------------------------
# Formats (pure)
# ------------------------------------------------------------------------------------------------


def render(ex: Export, fmt: str) -> str:
    if fmt == "flags":
        return _join([*ex.flags]) + (" " + _key_shell(ex) if ex.api_key_env else "") + "\n"
    if fmt == "shell":
        return shell(ex)
    if fmt == "json":
        return json.dumps(to_json(ex), indent=2) + "\n"
    if fmt == "systemd":
        return systemd(ex)
    raise UsageError(f"--format {fmt}: unknown; use one of {', '.join(FORMATS)}")


def to_json(ex: Export) -> dict[str, object]:
    return {
        "study": ex.study,
        "trial": ex.trial,
        "params": dict(ex.params),
        "argv": list(ex.argv),
        "api_key_env": ex.api_key_env,
        "env": dict(ex.env),
        "capacity_tokens": ex.capacity_tokens,
        "throughput_tok_s": ex.throughput_tok_s,
        "headroom_gib": ex.headroom_gib,
        "predicted": ex.predicted,
        "margin": dict(ex.margin),
        "tolerance": ex.tolerance,
        "chosen_trial": ex.chosen_trial,
        "confirmed": ex.confirmed,
        "confirmation": ex.confirmed_label,
        "sglang_version": ex.sglang_version,
        "backend": ex.backend,
        "notes": list(ex.notes),
    }


def _header(ex: Export) -> list[str]:
    figures = []
    if ex.capacity_tokens is not None:
        figures.append(f"{ex.capacity_tokens:,} KV tokens")
    if ex.throughput_tok_s is not None:
        figures.append(f"{ex.throughput_tok_s:,.1f} tok/s")
    if ex.headroom_gib is not None:
        figures.append(f"{ex.headroom_gib:.2f} GiB free at the stress peak")
    how = " (predicted)" if ex.predicted else ""
    margin = ex.margin
    if margin.get("headroom_gib") is not None:
        m = f"{margin['headroom_gib']:g} GiB free at the stress peak"
    else:
        m = f"{margin.get('steps', 0)} step(s) of mem_fraction_static"
    lines = [
        f"autotune study {ex.study}, trial {ex.trial}: {', '.join(figures) or 'no figures'}{how}",
        f"margin: {m}; {ex.confirmed_label}",
        f"sglang {ex.sglang_version or 'version unknown'}, backend {ex.backend}",
    ]
    lines += [f"note: {n}" for n in ex.notes]
    return lines


def shell(ex: Export) -> str:
    out = ["#!/bin/sh", *(f"# {line}" for line in _header(ex))]
    env = [f"{k}={shlex.quote(v)}" for k, v in ex.env.items()]
    if env:
        out.append("export " + " ".join(env))
    program = list(ex.program)
    body = [_join(program)]
    flags = list(ex.flags)
    i = 0
    while i < len(flags):
        tok = [flags[i]]
        i += 1
        while i < len(flags) and not flags[i].startswith("--"):
            tok.append(flags[i])
            i += 1
        body.append("  " + _join(tok))
    if ex.api_key_env:
        body.append("  " + _key_shell(ex))
    out.append("exec " + " \\\n".join(body))
    return "\n".join(out) + "\n"


def _key_shell(ex: Export) -> str:
    return f'--api-key "${{{ex.api_key_env}}}"'


def systemd(ex: Export) -> str:
    out = [
        "# drop-in for the SGLang service, e.g. /etc/systemd/system/sglang.service.d/autotune.conf",
        *(f"# {line}" for line in _header(ex)),
        "[Service]",
    ]
    out += [f"Environment={_sd_quote(f'{k}={v}')}" for k, v in ex.env.items()]
    words = [_sd_quote(a) for a in ex.argv]
    if ex.api_key_env:
        words += ["--api-key", f"${{{ex.api_key_env}}}"]
    out += ["ExecStart=", "ExecStart=" + " ".join(words)]
    return "\n".join(out) + "\n"


def _sd_quote(word: str) -> str:
    """A word for ExecStart=: `%` and `$` doubled, quoted when it has spaces or quotes."""
    w = word.replace("%", "%%").replace("$", "$$")
    if any(c.isspace() for c in w) or '"' in w or "\\" in w or not w:
        return '"' + w.replace("\\", "\\\\").replace('"', '\\"') + '"'
    return w


def _join(words: Sequence[str]) -> str:
    return " ".join(shlex.quote(w) for w in words)
