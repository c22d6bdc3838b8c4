"""Whether the launches contradict the memory model beyond its own noise, and what that changes
(pure).

The calibration (`search.calibration`) widens the model's margins by the root mean square of its
misses, which assumes the misses are the model's own normal spread, only wider. Some worlds are
not that: a peak with a heavy tail, a transient that grows with the live context, an allocator
that keeps memory after every request. There a handful of launches that happened to hold say
little, and a normal tail over a widened spread still calls a setting safe that fails one launch
in ten. So before each proposal the search asks whether the launches are consistent with the
model at all, each judged by the model's own uncertainty:

* a stress peak `DOUBT_Z` or more standard deviations above what the model fitted on every
  *other* launch predicts for it (leave one out: the peak's residual against the fit's own
  spread, widened by the slopes' uncertainty away from what was measured);
* a headroom `DOUBT_Z` or more standard deviations below what the model fitted on the launches
  *before* it predicted (`calibration.Check`, which scores a runtime OOM as a headroom of 0);
* free memory that is not static: a launch whose allocator kept `DOUBT_Z` or more times the
  model's uncertainty of the static free memory once its workload was over (`growth_gib`, read
  right after `/flush_cache`), which the model takes as 0.

Under the normal spread the model assumes, a launch lands `DOUBT_Z` = 3 sd on its side about
once in 700; the search's first launches of a study never do on a box that follows the model
(`tests/search/test_doubt.py`). When one does, the plan changes (`Doubt.wrong`):

* a wider margin: every p(stable) is judged against a Student-t tail with `TAIL_DOF` degrees of
  freedom over the (calibrated) spread instead of a normal one: p ≥ 0.977 needs 3.1 sd of margin
  instead of 2, p ≥ 0.9 needs 1.6 instead of 1.3 (only where the evidence is about the peak or
  the headroom; growth alone moves every launch alike);
* repeats near the edge: the best stable setting runs until it held `REPEATS` times before the
  search ends or turns to throughput (`holding.recheck`);
* the proposal's why and the closing reason say so, with the evidence, instead of "what is left
  to learn is smaller than one step".

The search cannot ask for a longer workload (the workload is the study file's, the same for
every trial); growth within one trial is part of its measured peak, and the export's soak margin
(`review.soak`) covers a soak's longer growth.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from autotune.logparse.outcome import Outcome
from autotune.memory.fit import fit
from autotune.memory.model import Estimate
from autotune.search.calibration import Calibration
from autotune.search.points import Point

DOUBT_Z = 3.0
"""A launch this many of the model's standard deviations off (on the side that costs memory)
contradicts the model."""
TAIL_DOF = 3
"""The degrees of freedom of the Student-t tail a doubted model's margins are judged against."""
REPEATS = 2
"""Under doubt, the best stable setting runs until it held this many times."""


def student_cdf(t: float, dof: int = TAIL_DOF) -> float:
    """Student's t distribution function (unit scale) with 3 degrees of freedom, in closed form;
    the normal one for any other `dof`."""
    if dof == 3:
        x = t / math.sqrt(3.0)
        return 0.5 + (math.atan(x) + x / (1.0 + x * x)) / math.pi
    return 0.5 * (1.0 + math.erf(t / math.sqrt(2.0)))


@dataclass(frozen=True)
class Evidence:
    """One launch that contradicts the model: which trial, of what (`peak`, `headroom`,
    `growth`), by how many of the model's standard deviations, and the sentence the why shows."""

    number: int
    kind: str
    z: float
    text: str


@dataclass(frozen=True)
class Doubt:
    """The launches that contradict the model beyond its noise (none: the model stands)."""

    evidence: tuple[Evidence, ...] = ()

    @property
    def wrong(self) -> bool:
        """Whether any launch contradicts the model: the plan repeats the edge and says so."""
        return bool(self.evidence)

    @property
    def tails(self) -> bool:
        """Whether the evidence is about the peak or the headroom (a tail heavier than the
        model's): margins are judged against a Student-t tail then."""
        return any(e.kind in ("peak", "headroom") for e in self.evidence)

    def p_above(self, margin: float, sd: float) -> float:
        """The chance a value `margin` above its threshold with spread `sd` stays above it: the
        Student-t tail under doubt about the tails, the normal one otherwise."""
        if sd <= 0:
            return float(margin >= 0)
        z = margin / sd
        if self.tails:
            return student_cdf(z)
        return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))

    def describe(self) -> str:
        """The clause the why and the closing reason carry ("" while the model stands): the
        worst evidence of each kind, and what the search does about it."""
        if not self.evidence:
            return ""
        worst: dict[str, Evidence] = {}
        for e in self.evidence:
            if e.kind not in worst or e.z > worst[e.kind].z:
                worst[e.kind] = e
        told = "; ".join(e.text for e in worst.values())
        repeat = f"runs the best setting until it held {REPEATS} times"
        then = (
            f"judges its margins against Student-t tails ({TAIL_DOF} dof) and {repeat}"
            if self.tails
            else repeat
        )
        return (
            f"; the launches contradict the memory model beyond its noise ({told}), so the "
            f"search {then}"
        )


def doubt(known: Sequence[Point], cal: Calibration) -> Doubt:
    """The evidence against the model in the finished launches `known` (in order), with the
    calibration of their headrooms (`calibration.calibrate`)."""
    found: list[Evidence] = []
    for c in cal.checks:
        if c.sd > 0 and -c.z >= DOUBT_Z:
            found.append(
                Evidence(
                    c.number,
                    "headroom",
                    -c.z,
                    f"trial {c.number} kept {c.measured:.2f} GiB under the stress peak where the "
                    f"launches before it predicted {c.predicted:.2f} ± {c.sd:.2f}, "
                    f"{-c.z:.1f} sd less",
                )
            )
    found += _peaks(known)
    found += _growth(known)
    return Doubt(tuple(found))


def _peaks(known: Sequence[Point]) -> list[Evidence]:
    """Each measured stress peak against the model fitted on every other launch."""
    out = []
    obs = [p.observation for p in known]
    for i, p in enumerate(known):
        o = p.observation
        if o is None or Outcome.of(o.outcome) != Outcome.OK:
            continue
        peak = o.measured_peak_gib
        if peak is None:
            continue
        others = [q for j, q in enumerate(obs) if j != i and q is not None]
        model = fit(others)
        if model.peak is None:
            continue
        tokens = float(o.tokens) if o.tokens else None
        pred = model.peak.at(o.slots, o.chunk, tokens)
        z = _z(peak, pred)
        if z >= DOUBT_Z:
            out.append(
                Evidence(
                    p.number,
                    "peak",
                    z,
                    f"trial {p.number}'s stress peak {peak:.2f} GiB is {z:.1f} sd above the "
                    f"{pred} GiB the other launches predict for it",
                )
            )
    return out


def _growth(known: Sequence[Point]) -> list[Evidence]:
    """Launches whose allocator kept memory once the workload was over, beyond the model's
    uncertainty of the static free memory (the model takes it as static)."""
    out = []
    started = [p.observation for p in known if p.observation and p.observation.started]
    model = fit(started) if started else None
    for p in known:
        o = p.observation
        if o is None or not o.growth_gib or o.growth_gib <= 0 or model is None:
            continue
        free = model.static_free(o.setting, o.slots)
        noise = max(free.sd if free is not None else 0.0, _LOG_GIB)
        z = o.growth_gib / noise
        if z >= DOUBT_Z:
            out.append(
                Evidence(
                    p.number,
                    "growth",
                    z,
                    f"trial {p.number}'s allocator kept {o.growth_gib:.2f} GiB after its "
                    f"workload, {z:.0f}× the model's uncertainty of the static free memory "
                    f"(± {noise:.2f} GiB), which it takes as static",
                )
            )
    return out


_LOG_GIB = 0.01
"""The least uncertainty of a free-memory figure: SGLang prints GiB to two decimals."""


def _z(measured: float, pred: Estimate) -> float:
    return (measured - pred.mean) / pred.sd if pred.sd > 0 else 0.0
