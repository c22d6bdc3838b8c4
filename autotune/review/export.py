"""`autotune export`: the winning launch command, ready to paste.

The command is the study's base command, its fixed flags and the tuned flags, built by
`autotune.config.space.server_argv` — the same function every trial's command came from — so what is
exported is what ran (`params_from_flags` reads the parameters back). Formats:

* `flags`: the flags alone, one shell-quoted line (fixed, then tuned);
* `shell`: the full command with a comment header, one flag per line;
* `json`: headline, study, trial, params, argv, capacity_tokens, throughput_tok_s, headroom_gib
  (free at the worst moment), margin, confirmed, sglang_version, how the winner was chosen and
  its share of the box's ceiling (`ceiling`);
* `systemd`: a drop-in that replaces `ExecStart=` (and sets the study's environment).

Every format starts with the headline (`autotune.review.headline`; for `flags` it goes to
stderr, so the line on stdout stays pasteable). A setting that failed (out of memory, crashed,
infeasible, or never finished) is refused unless forced; a forced export carries the marker flag
`--autotune-forced-export=trial-N-OUTCOME` in its command, which SGLang rejects as an unknown
argument, so it cannot start by accident, and `json` says so in `forced` as well.

Host and port are the study file's when it names a port (trials pick free ports). An API key is
never written: when the workload reads one from an environment variable, the command refers to
that variable instead.

Each format is a `Format` in one registry (`FORMATS` are their names). Every value is written so
that the format's own reader reads back exactly the argv and the environment the trial ran with
(`shlex.quote` for `flags` and `shell`; JSON; systemd's quoting, escapes, `%%` and `$$` for
`systemd`), or refused in one line naming the value's study-file key and the fix (a NUL in any
format; in `systemd`, a control character other than newline and tab in an `Environment=`
value, and a program systemd would run another way). Comment lines escape control characters,
so no text in a header can start a command or a directive.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from autotune.config.schema import REQUESTS, Scalar, StudyConfig, flag_of
from autotune.config.space import (
    base_command,
    params_from_flags,
    server_argv,
    settings_of,
)
from autotune.config.studyfile import is_env_name
from autotune.errors import UsageError
from autotune.record.view import TrialView
from autotune.review import ceiling
from autotune.review import figures as fig
from autotune.review.headline import Answer, headline
from autotune.review.source import Review
from autotune.search.effective import effective_point, exact_clamps

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
    ceiling: Mapping[str, object] = field(default_factory=dict)
    """The exported setting's share of the box's ceiling (`review.ceiling.Share.to_dict`; its
    `line` is printed below the headline)."""
    origins: Mapping[str, str] = field(default_factory=dict)
    """Each flag's study-file key (`--model-path` → `server.flags.model-path`), so that a value a
    format cannot carry is refused by the key the user wrote it under."""
    asked: Mapping[str, Scalar] = field(default_factory=dict)
    """The parameters the trial asked for where SGLang ran another value (`logparse.clamps`);
    `params` and the command hold what it ran. Empty when SGLang ran what was asked."""
    ran_other: tuple[str, ...] = ()
    """One line per such parameter: asked, ran, why (each format prints them: a `note:`
    comment, `ran_other` in `json`, stderr beside `flags`)."""

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
        """`--api-key ${VAR}` when the workload reads its key from an environment variable: the
        command names the variable, never the key."""
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
            **(
                {"rise_gib": round(w.soak.rise_gib, 4), **w.soak.worst.to_dict()}
                if w.soak is not None and w.soak.worst is not None
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
    asked, ran_other = _ran(review, pick)
    if asked:
        params = _ran_params(review, pick)
        notes = (*notes, *ran_other)
    argv = launch_argv(cfg, params, backend=backend)
    soaked = review.confirmation_of(params)
    confirmed = soaked.passed if soaked is not None else None
    if soaked is not None and soaked.passed and figures[3]:
        # a setting that never ran in the search was measured by its confirmation soak
        figures = (soaked.capacity_tokens, soaked.throughput_tok_s, soaked.headroom_gib, False)
        notes = (*notes, "figures measured by the confirmation soak")
    key_env = _api_key_env(cfg)
    answer = Answer(params, figures[0], figures[2], figures[3], trial=trial, forced=forced)
    if trial is None:
        share = ceiling.of_winner(review)
    else:
        share = ceiling.of_trial(review, review.trial(trial))
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
        origins=_origins(cfg),
        ceiling=share.to_dict(),
        asked=asked,
        ran_other=ran_other,
    )


def _ran_view(review: Review, pick: _Pick) -> TrialView | None:
    """The trial whose launch shows what SGLang runs the exported point as: the exported trial,
    else (a winner backed off to a fraction never run) the trial it was chosen from."""
    for number in (pick.number, pick.chosen):
        if number is not None:
            try:
                return review.trial(number)
            except (KeyError, UsageError):
                continue
    return None


def _ran_params(review: Review, pick: _Pick) -> dict[str, Scalar]:
    """The exported parameters as SGLang runs them: each exact clamp the trial showed
    (`search.effective`) applied; request slots at most the exported pool's tokens ÷ 2 where
    the pool was what lowered them (0.5.23 `resolve_max_num_reqs`)."""
    t = _ran_view(review, pick)
    if t is None:
        return dict(pick.params)
    clamps = exact_clamps(t)
    out = effective_point(pick.params, clamps)
    tokens = pick.figures[0]
    rq = clamps.get(REQUESTS)
    asked = pick.params.get(REQUESTS)
    if rq is not None and tokens and isinstance(asked, int) and not isinstance(asked, bool):
        out[REQUESTS] = min(asked, tokens // 2)
    return out


def _ran(review: Review, pick: _Pick) -> tuple[dict[str, Scalar], tuple[str, ...]]:
    """What the trial asked where SGLang ran another value, and one line per such value."""
    t = _ran_view(review, pick)
    if t is None:
        return {}, ()
    ran = _ran_params(review, pick)
    clamps = {c.name: c for c in t.clamps.clamped}
    asked = {k: v for k, v in pick.params.items() if k in ran and ran[k] != v}
    lines = tuple(
        f"SGLang runs {k}={ran[k]}, not the {v} asked (trial {t.number}: "
        f"{clamps[k].reason if k in clamps else 'clamped'}); the command sets what it runs"
        for k, v in asked.items()
    )
    return asked, lines


def _origins(cfg: StudyConfig) -> dict[str, str]:
    """Flag → the study-file key it comes from."""
    out = {flag_of(name): f"server.flags.{name.replace('_', '-')}" for name, _ in cfg.server.flags}
    out.update({flag_of(p.name): f"search.{p.name}" for p in cfg.search.params})
    out.update({"--host": "server.host", "--port": "server.port", FORCED_FLAG: "--force"})
    return out


def _forced_flag(t: TrialView) -> str:
    return f"{FORCED_FLAG}=trial-{t.number}-{t.outcome or t.kind}"


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _int(v: object) -> int | None:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) and v > 0 else None


def launch_argv(cfg: StudyConfig, params: Mapping[str, Scalar], *, backend: str) -> list[str]:
    """Base command + fixed flags + tuned flags (+ host and port when the study fixes them)."""
    settings = settings_of(params, cfg.search)
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


@dataclass(frozen=True)
class Format:
    """One export format: its name and how it writes an `Export`.

    `write` writes every value so that the format's own reader reads back exactly the argv and
    the environment that the trial ran with (`shlex.split` and `sh` for `flags` and `shell`,
    `json.loads` for `json`, systemd's unit parser for `systemd`), or raises a one-line
    `UsageError` naming the value's study-file key and the fix where the format cannot carry it."""

    name: str
    write: Callable[[Export], str]


def render(ex: Export, fmt: str) -> str:
    """The export in `fmt`; `flags` is the flags line alone (its headline goes to stderr)."""
    f = _REGISTRY.get(fmt)
    if f is None:
        raise UsageError(f"--format {fmt}: unknown; use one of {', '.join(FORMATS)}")
    return f.write(ex)


def to_json(ex: Export) -> dict[str, object]:
    """The export as the `json` format's object: the headline, the forced marker, the command and
    its figures, the margin and confirmation, and how the winner was chosen."""
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
        "ceiling": dict(ex.ceiling) or None,
        "asked": dict(ex.asked) or None,
        "ran_other": list(ex.ran_other),
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
    if ex.ceiling.get("line"):
        lines.append(str(ex.ceiling["line"]))
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
    return [comment(line) for line in lines]


_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
"""C0 and C1 control characters, DEL included."""


def comment(text: str) -> str:
    """`# text` on one line whatever `text` holds: control characters written as escapes
    (`\n`, `\x1b`), so that a newline in a value (a headline naming a string choice, say)
    cannot end a comment and start a shell command or a systemd directive."""
    return "# " + _CONTROL.sub(lambda m: ascii(m.group())[1:-1], text)


def _shown(value: str) -> str:
    """A value as an error line names it: quoted, control characters escaped, at most 60
    characters."""
    return repr(value if len(value) <= 60 else value[:57] + "...")


def _labelled(ex: Export) -> list[tuple[str, str]]:
    """Each word of the exported command with the study-file key it comes from (the key of the
    flag a value follows; `server.command` for the program)."""
    out = [(w, "server.command") for w in ex.program]
    flag = ""
    for w in ex.flags:
        if w.startswith("--"):
            flag = w.split("=", 1)[0]
        out.append((w, ex.origins.get(flag, flag or "server.command")))
    return out


def _refuse_nul(ex: Export) -> None:
    """No format carries a NUL byte: argv and environ are C strings (the study file refuses one
    at load; a setting read back from storage is checked again here)."""
    for word, key in _labelled(ex):
        if "\0" in word:
            raise UsageError(f"{key}: {_shown(word)} holds a NUL byte, which no command line "
                             "can carry; remove it")  # fmt: skip
    for name, value in ex.env.items():
        if "\0" in value:
            raise UsageError(f"server.env.{name}: the value holds a NUL byte, which no "
                             "environment can carry; remove it")  # fmt: skip


def _key_name(ex: Export) -> None:
    """The API key is referred to as `${NAME}`: NAME must be a variable name, or the reference
    would be a shell or systemd expression of its own."""
    if ex.api_key_env and not is_env_name(ex.api_key_env):
        raise UsageError(
            f"workload.api_key_env: {_shown(ex.api_key_env)} is not an environment variable "
            "name; use ASCII letters, digits and _, not starting with a digit"
        )


def _shell_program(ex: Export) -> None:
    """`exec -x` is an option of bash's `exec`, not a program."""
    if ex.program and ex.program[0].startswith("-"):
        raise UsageError(
            f"server.command: the program {_shown(ex.program[0])} starts with '-', which exec "
            "reads as an option; name it by a path (./-…)"
        )


def flags_line(ex: Export) -> str:
    """The flags alone, shell-quoted (`shlex.quote`): one command line, where a value with a
    newline keeps it inside its quotes."""
    _refuse_nul(ex)
    _key_name(ex)
    return _join([*ex.flags]) + (" " + _key_shell(ex) if ex.api_key_env else "") + "\n"


def shell(ex: Export) -> str:
    """A POSIX `sh` script: the header as comments, `export` of the study's environment, then
    `exec` of the command, one flag per line; every word `shlex.quote`d."""
    _refuse_nul(ex)
    _key_name(ex)
    _shell_program(ex)
    out = ["#!/bin/sh", *_header(ex)]
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


def _json(ex: Export) -> str:
    _refuse_nul(ex)
    return json.dumps(to_json(ex), indent=2, ensure_ascii=False) + "\n"


def _key_shell(ex: Export) -> str:
    return f'--api-key "${{{ex.api_key_env}}}"'


def systemd(ex: Export) -> str:
    """A drop-in: `ExecStart=` emptied and set again, and `Environment=` for the study's
    environment, every word written by systemd's own rules (`_sd_word`, `_sd_env`)."""
    _refuse_nul(ex)
    _key_name(ex)
    _sd_program(ex)
    head = _header(ex)
    out = [
        *head[:1],
        "# drop-in for the SGLang service, e.g. /etc/systemd/system/sglang.service.d/autotune.conf",
        *head[1:],
        "[Service]",
    ]
    out += [f"Environment={_sd_env(k, v)}" for k, v in ex.env.items()]
    words = [_sd_word(a) for a in ex.command]
    if ex.api_key_env:
        words += ["--api-key", f"${{{ex.api_key_env}}}"]
    out += ["ExecStart=", "ExecStart=" + " ".join(words)]
    return "\n".join(out) + "\n"


# systemd's rules, from systemd.syntax(7) "Quoting", systemd.service(5) "Command lines" and
# systemd.exec(5) "Environment=" (checked against systemd 252's own parser, whose unit dump
# `SYSTEMD_LOG_LEVEL=debug systemd-analyze verify` prints, by tests/review/test_export_hostile.py):
# * a word is unquoted as a whole: a quote opens quoting only at its start, so a word holding
#   anything but plain characters is written inside double quotes;
# * C-style escapes are read everywhere: `\` and `"` are escaped, and control characters
#   written as `\n`, `\t`, `\xHH` (a raw newline would end the line: `ExecStartPre=` on the next
#   line would be a directive of its own);
# * `%` starts a specifier in `ExecStart=` and `Environment=` alike: written `%%`;
# * `$` expands a variable in `ExecStart=` (`${X}`, `$X`): written `$$`; in `Environment=` it
#   has no meaning and is kept as it is;
# * a lone `;` separates commands: quoted (`";"`) it is an argument.

_SD_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_@%+=:,./-$")
_SD_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r", "\a": "\\a",
               "\b": "\\b", "\f": "\\f", "\v": "\\v"}  # fmt: skip
_SD_PREFIXES = "-@:+!"
"""Characters that, first in `ExecStart=`'s program, systemd reads as prefixes
(systemd.service(5), "Special executable prefixes"), quoted or not."""


def _sd_escaped(text: str) -> str:
    """`text` for inside a double-quoted systemd word: C-style escapes for `\\`, `"` and every
    control character (C1 ones as `\\uHHHH`)."""
    out = []
    for c in text:
        if c in _SD_ESCAPES:
            out.append(_SD_ESCAPES[c])
        elif _CONTROL.fullmatch(c):
            out.append(f"\\x{ord(c):02x}" if ord(c) < 0x80 else f"\\u{ord(c):04x}")
        else:
            out.append(c)
    return "".join(out)


def _sd_quoted(text: str) -> str:
    if text and all(c in _SD_PLAIN for c in text):
        return text
    return '"' + _sd_escaped(text) + '"'


def _sd_word(word: str) -> str:
    """A word for `ExecStart=`: `%` and `$` doubled, then plain, or double-quoted and escaped
    (the empty word is `""`)."""
    return _sd_quoted(word.replace("%", "%%").replace("$", "$$"))


def _sd_program(ex: Export) -> None:
    """What systemd cannot take as `ExecStart=`'s program: a prefix character first; a quote,
    a backslash or a control character (systemd.service(5): control characters are not allowed
    in the command; systemd 252 also refuses quotes and backslashes in it, "Executable name
    contains special characters", and will not start the unit); or `$` (systemd expands
    variables in the arguments, argv[0] among them, but not in the path it executes, so `$$`
    would name another file)."""
    if not ex.program:
        return
    program = ex.program[0]
    why = ""
    if program[:1] in _SD_PREFIXES:
        why = f"starts with {program[0]!r}, which systemd reads as a prefix"
    elif _CONTROL.search(program) or any(c in program for c in "'\"\\"):
        why = "holds a quote, a backslash or a control character, which systemd refuses there"
    elif "$" in program:
        why = "holds '$', which systemd would expand in argv[0] but not in the path it runs"
    if why:
        raise UsageError(
            f"server.command: the program {_shown(program)} {why}; use a path without it, or "
            "--format shell"
        )


def _sd_env(name: str, value: str) -> str:
    """An `Environment=` assignment: `%` doubled, `$` kept; plain, or double-quoted and escaped.
    A newline or a tab is escaped (`\\n`, `\\t`); any other control character is refused:
    systemd.exec(5) says non-printable characters are rejected in values, and a systemd that
    rejects one drops the whole assignment (the server would start without the variable)."""
    bad = _CONTROL.search(value.replace("\n", "").replace("\t", ""))
    if bad:
        raise UsageError(
            f"server.env.{name}: the value holds the control character "
            f"{bad.group()!a}, which systemd's Environment= does not carry; remove it, "
            "or export --format shell or json"
        )
    return _sd_quoted(f"{name}={value}".replace("%", "%%"))


def _join(words: Sequence[str]) -> str:
    return " ".join(shlex.quote(w) for w in words)


_REGISTRY = {
    f.name: f
    for f in (
        Format("flags", flags_line),
        Format("shell", shell),
        Format("json", _json),
        Format("systemd", systemd),
    )
}
FORMATS = tuple(_REGISTRY)
