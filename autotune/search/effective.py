"""A point SGLang would run as one already measured (`duplicate_of`): not worth a launch.

SGLang lowers `--max-running-requests` to what the KV pool holds (0.5.23 `resolve_max_num_reqs`:
`min(asked, max_total_num_tokens // 2)`) and drops the decode graph sizes above the request
table (`get_batch_sizes_to_capture`); `logparse.clamps` reads both from a trial's ledger. The
pool is sized before either is applied, so at the same other settings (the fraction, the cache,
…) every request count at or above the clamp a trial measured runs as that trial did, and so
does every graph batch at or above the one the table allowed. Such a candidate is recorded as
skipped, naming the measured trial, instead of being launched: its measurement would be that
trial's again.

Only the rules whose result does not depend on the asked value are used (`EXACT_RULES`):
post-capture sizing recomputes the request slots from a pool that the request table itself
shrank, so a point it clamped is launched as usual. Points are compared by their identity
(`config.space.point_key`), with the clamped values replaced by what SGLang ran.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from autotune.config.schema import Scalar
from autotune.config.space import Space, point_key
from autotune.logparse.clamps import Clamp
from autotune.record.view import TrialView

EXACT_RULES = {"max_running_requests": "kv_capacity", "cuda_graph_max_bs": "request_table"}
"""The parameter each exact clamp applies to, and the rule (`Clamp.rule`) that makes it exact."""


@dataclass(frozen=True)
class Duplicate:
    """A candidate SGLang would run as trial `trial` ran, and the clamps that make it so."""

    trial: int
    clamps: tuple[Clamp, ...]

    @property
    def reason(self) -> str:
        """The skipped trial's reason: which trial it stands for, and each clamp."""
        what = "; ".join(c.text() for c in self.clamps)
        return f"not launched: SGLang runs this point as trial {self.trial} ran it ({what})"


def exact_clamps(view: TrialView) -> dict[str, Clamp]:
    """The clamps of a launched trial that decide its effective point (`EXACT_RULES`), by
    parameter name; only those of a searched count the trial set itself."""
    out: dict[str, Clamp] = {}
    for c in view.clamps.clamped:
        if EXACT_RULES.get(c.name) != c.rule or not _count(c.effective):
            continue
        if _count(view.params.get(c.name)):
            out[c.name] = c
    return out


def effective_point(params: Mapping[str, Scalar], clamps: Mapping[str, Clamp]) -> dict[str, Scalar]:
    """`params` with each clamped value at most what SGLang ran (`min(asked, effective)`)."""
    out = dict(params)
    for name, c in clamps.items():
        asked, ran = out.get(name), c.effective
        if isinstance(asked, int) and isinstance(ran, int) and _count(asked) and _count(ran):
            out[name] = min(asked, ran)
    return out


def duplicate_of(
    params: Mapping[str, Scalar], measured: Iterable[TrialView], space: Space | None = None
) -> Duplicate | None:
    """The first launched trial in `measured` whose effective point equals the one SGLang would
    run `params` as, predicted with that trial's clamps; None when no trial's does."""
    for view in measured:
        if not view.launched or not view.ledger.max_total_num_tokens:
            continue
        clamps = exact_clamps(view)
        if not clamps:
            continue
        ran = point_key(effective_point(view.params, clamps), space)
        if point_key(effective_point(params, clamps), space) == ran:
            return Duplicate(view.number, tuple(clamps.values()))
    return None


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
