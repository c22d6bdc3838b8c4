"""`autotune export`: the winning launch command, ready to paste.

The command is the study's base command, its fixed flags and the tuned flags, built by
`autotune.config.space.server_argv` — the same function every trial's command came from — so what is
exported is what ran (`params_from_flags` reads the parameters back). Formats:

* `flags`: the flags alone, one shell-quoted line (fixed, then tuned);
* `shell`: the full command with a comment header, one flag per line;
* `json`: headline, study, trial, params, argv, capacity_tokens, throughput_tok_s, headroom_gib
  (free at the worst moment), margin, confirmed, sglang_version and how the winner was chosen;
* `systemd`: a drop-in that replaces `ExecStart=` (and sets the study's environment).

Every format starts with the headline (`autotune.review.headline`; for `flags` it goes to
stderr, so the line on stdout stays pasteable). A setting that failed (out of memory, crashed,
infeasible, or never finished) is refused unless forced; a forced export carries the marker flag
`--autotune-forced-export=trial-N-OUTCOME` in its command, which SGLang rejects as an unknown
argument, so it cannot start by accident, and `json` says so in `forced` as well.

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
from autotune.record.view import TrialView
from autotune.review import figures as fig
from autotune.review.headline import Answer, headline
from autotune.review.source import Review

FORMATS = ("flags", "shell", "json", "systemd")
FORCED_FLAG = "--autotune-forced-export"
"""The marker a forced export carries: no SGLang flag starts with it, so SGLang's parser stops
with `unrecognized arguments` until someone removes it on purpose."""


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
    """Free at the worst moment (the headroom the constraint checks)."""
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
    headline: str = ""
    forced: str = ""
    """Why this setting was refused, when `--force` exported it anyway ("" otherwise)."""
    forced_flag: str = ""
    """The marker flag of a forced export (`--autotune-forced-export=trial-6-runtime_oom`)."""

    @property
    def flags(self) -> tuple[str, ...]:
        """Everything after the program (fixed and tuned flags), the forced marker first."""
        marker = (self.forced_flag,) if self.forced_flag else ()
        return (*marker, *self.argv[len(self.program) :])

    @property
    def command(self) -> tuple[str, ...]:
        """The whole command as printed: the program, then `flags`."""
        return (*self.program, *self.flags)

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
    failed: TrialView | None
    """The trial that ran these settings and failed, when one did."""


def _pick(review: Review, trial: int | None) -> _Pick:
    """Trial `trial` as it ran, else the winner; a clear error while there is none."""
    if trial is not None:
        t = review.trial(trial)
        return _Pick(
            params=dict(t.params),
            figures=(t.capacity_tokens, t.throughput_tok_s, t.free_at_peak_gib, False),
            margin={"steps": 0, "headroom_gib": None},
            number=t.number,
            tolerance=None,
            chosen=None,
            notes=(),
            version=t.sglang_version,
            failed=None if t.feasible else t,
        )
    w = review.winner
    if w is None:
        raise UsageError(
            f"study {review.name} has no feasible trial to export yet; pass --trial N to "
            "export one as it ran"
        )
    return _Pick(
        params=dict(w.params),
        figures=(w.capacity_tokens, w.throughput_tok_s, w.free_at_peak_gib, w.predicted),
        margin={
            **w.margin.to_dict(),
            "steps": w.steps_back,
            **(
                {"soak_factor": w.soak.factor, "soak_plan": w.soak.describe()}
                if w.soak is not None
                else {}
            ),
        },
        number=w.trial,
        tolerance=w.tolerance,
        chosen=w.chosen.number,
        notes=w.notes,
        version=(w.source or w.chosen).sglang_version,
        failed=w.source if w.source is not None and not w.source.feasible else None,
    )


def refusal(t: TrialView) -> str:
    """Why a trial's setting is not exported: `trial 6 ran out of memory (runtime_oom: …)`."""
    return f"trial {t.number} {fig.ending(t)}"


def build_export(
    review: Review, cfg: StudyConfig, *, trial: int | None = None, force: bool = False
) -> Export:
    """The winner (or trial `trial` as it ran) as an `Export` (pure). A setting that a trial ran
    and failed is refused (a `UsageError` naming the trial and `--force`) unless `force`."""
    backend = cfg.server.backend
    pick = _pick(review, trial)
    params, figures, margin, number, tolerance, chosen, notes, version, failed = pick
    forced = refusal(failed) if failed is not None else ""
    if forced and not force:
        raise UsageError(
            f"{forced}; refusing to export it (pass --force to export it anyway, marked so "
            "that SGLang will not start it until the marker flag is removed)"
        )
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
    answer = Answer(params, figures[0], figures[2], figures[3], trial=trial, forced=forced)
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
        headline=headline(review, answer),
        forced=forced,
        forced_flag=_forced_flag(failed) if failed is not None else "",
    )


def _forced_flag(t: TrialView) -> str:
    return f"{FORCED_FLAG}=trial-{t.number}-{t.outcome or t.kind}"


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
    """The export in `fmt`; `flags` is the flags line alone (its headline goes to stderr)."""
    if fmt == "flags":
        return _join([*ex.flags]) + (" " + _key_shell(ex) if ex.api_key_env else "") + "\n"
    if fmt == "shell":
        return shell(ex)
    if fmt == "json":
        return json.dumps(to_json(ex), indent=2, ensure_ascii=False) + "\n"
    if fmt == "systemd":
        return systemd(ex)
    raise UsageError(f"--format {fmt}: unknown; use one of {', '.join(FORMATS)}")


def to_json(ex: Export) -> dict[str, object]:
    return {
        "headline": ex.headline,
        "forced": {"reason": ex.forced, "marker": ex.forced_flag} if ex.forced else None,
        "study": ex.study,
        "trial": ex.trial,
        "params": dict(ex.params),
        "argv": list(ex.command),
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
        figures.append(f"{fig.gib(ex.headroom_gib)} GiB {fig.FREE_AT_WORST}")
    how = " (predicted)" if ex.predicted else ""
    margin = ex.margin
    if isinstance(margin.get("soak_plan"), str):
        m = str(margin["soak_plan"])
    elif margin.get("headroom_gib") is not None:
        m = f"{margin['headroom_gib']:g} GiB {fig.FREE_AT_WORST}"
    else:
        m = f"{margin.get('steps', 0)} step(s) of mem_fraction_static"
    lines = [ex.headline] if ex.headline else []
    if ex.forced:
        lines.append(
            f"FORCED EXPORT: {ex.forced}; the command carries {ex.forced_flag}, which SGLang "
            "rejects: remove it only if you mean to launch this"
        )
    lines += [
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
    head = [f"# {line}" for line in _header(ex)]
    out = [
        *head[:1],
        "# drop-in for the SGLang service, e.g. /etc/systemd/system/sglang.service.d/autotune.conf",
        *head[1:],
        "[Service]",
    ]
    out += [f"Environment={_sd_env(f'{k}={v}')}" for k, v in ex.env.items()]
    words = [_sd_quote(a) for a in ex.command]
    if ex.api_key_env:
        words += ["--api-key", f"${{{ex.api_key_env}}}"]
    out += ["ExecStart=", "ExecStart=" + " ".join(words)]
    return "\n".join(out) + "\n"


_SD_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_@%+=:,./-$")


def _sd_quote(word: str) -> str:
    """A word for ExecStart=: `%` (specifiers) and `$` (variables) doubled; double-quoted, with
    `\\` and `"` escaped, whenever it holds anything but plain characters (a single quote would
    otherwise open quoting and systemd would drop the whole line)."""
    w = word.replace("%", "%%").replace("$", "$$")
    if w and all(c in _SD_PLAIN for c in w):
        return w
    return '"' + w.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _sd_env(assignment: str) -> str:
    """An `Environment=` assignment: `%` doubled (specifiers expand there), `$` left alone (it
    has no meaning in Environment=), double-quoted with `\\` and `"` escaped."""
    w = assignment.replace("%", "%%")
    if w and all(c in _SD_PLAIN for c in w):
        return w
    return '"' + w.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _join(words: Sequence[str]) -> str:
    return " ".join(shlex.quote(w) for w in words)
