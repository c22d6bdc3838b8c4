"""`autotune export`: the winning launch command, ready to paste, as one `Export`.

The command is the study's base command, its fixed flags and the tuned flags, built by
`autotune.config.space.server_argv` — the same function every trial's command came from — so what is
exported is what ran (`params_from_flags` reads the parameters back). `build_export` gathers it
with everything the formats print: the figures, the margin, the confirmation, how the winner was
chosen, its share of the box's ceiling, the headline (`autotune.review.headline`) and each flag's
study-file key. The formats that write an `Export` are `autotune.review.exportformats`'s.

A setting that failed (out of memory, crashed, infeasible, or never finished) is refused unless
forced; a forced export carries the marker flag `--autotune-forced-export=trial-N-OUTCOME` in its
command, which SGLang rejects as an unknown argument, so it cannot start by accident, and `json`
says so in `forced` as well.

Host and port are the operator's (`server.export_host`, `server.export_port`, which `init` copies
from their command or log), else the study file's when it names a port (trials pick free ports).
An API key is
never written: when the workload reads one from an environment variable, the command refers to
that variable instead.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from autotune.config.schema import REQUESTS, Scalar, StudyConfig, flag_of
from autotune.config.space import (
    base_command,
    params_from_flags,
    server_argv,
    settings_of,
)
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
    host = "server.export_host" if cfg.server.export_host is not None else "server.host"
    port = "server.export_port" if cfg.server.export_port is not None else "server.port"
    out.update({"--host": host, "--port": port, FORCED_FLAG: "--force"})
    return out


def _forced_flag(t: TrialView) -> str:
    return f"{FORCED_FLAG}=trial-{t.number}-{t.outcome or t.kind}"


def _num(v: object) -> float | None:
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


def _int(v: object) -> int | None:
    return int(v) if isinstance(v, int | float) and not isinstance(v, bool) and v > 0 else None


def launch_argv(cfg: StudyConfig, params: Mapping[str, Scalar], *, backend: str) -> list[str]:
    """Base command + fixed flags + tuned flags + the address it serves on: the study's export
    address (`server.export_host`, `server.export_port`, the operator's own), else its fixed
    trial address; none where the trials took free ports and the study names no other."""
    settings = settings_of(params, cfg.search)
    return server_argv(cfg.server, settings, backend=backend, extra=export_address(cfg))


def export_address(cfg: StudyConfig) -> list[str]:
    """`--host H --port P` of the exported command (see `launch_argv`)."""
    s = cfg.server
    host = s.export_host if s.export_host is not None else (s.host if s.port else None)
    port = s.export_port if s.export_port is not None else (s.port or None)
    return [*(["--host", host] if host else []), *(["--port", str(port)] if port else [])]


def round_trip(argv: Sequence[str], cfg: StudyConfig) -> dict[str, Scalar]:
    """The parameters read back out of an exported command."""
    return params_from_flags(list(argv), cfg.search)


def _api_key_env(cfg: StudyConfig) -> str | None:
    return cfg.workload.api_key_env or None
