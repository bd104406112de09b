"""Intervals and three-way decisions for the study's verdicts.

Every verdict tests an effect (a difference of means, a share, a correlation gap) measured over whole samples
(NIAH samples, questions). Its 95 % interval comes from a bootstrap over those samples: the same resampled samples
for every arm of a comparison (paired), so what two strategies share per sample cancels. The statistic sees the
resampled *sample indices*, so one function covers per-sample means and pooled statistics alike (the entropy of
head use pooled over the resampled samples). ``scipy.stats.bootstrap`` draws the resamples; the interval is its
percentile interval (BCa is undefined when every resample gives one value, as identical arms do).

This module is the one place an interval is computed: every table's mean (``mean_interval``), paired difference,
AUROC over whole groups (``group_interval``) and verdict; each caller says its seed and resamples in the
``EvidenceSettings`` it passes (tests/test_evidence.py refuses a bootstrap or percentile call anywhere else).

A proportion (successes of n units, each 0 or 1: NIAH accuracy, EM, a 0/1 win) gets the exact (Clopper-Pearson)
interval instead (``proportion_interval``; ``fraction_interval`` picks it for per-unit values that are all 0 or 1):
it is defined from n = 1 and never has zero width, where a bootstrap of 100 correct samples is [1, 1]. A mean of
per-unit values in [0, 1] that are not all 0 or 1 (ROUGE-L, F1, a per-question win rate) keeps the bootstrap, with
the exact ``identical_interval`` when every value is one value, so no printed interval of a share has zero width.

A family of paired differences read together (every strategy against one baseline, on every metric) is adjusted
with Holm's step-down procedure (``holm_differences``), family-wise at 1 - confidence; ``holm_rejections`` is the
textbook procedure on p-values.

Decision against a margin m, for an effect that supports the claim when it is large (``above``; ``below`` mirrors):
supported when the whole interval lies beyond m (low > m), not supported when it lies wholly on the other side
(high < m), inconclusive otherwise: an interval that contains m, too few samples (the floor), an undefined effect.
An effect exactly at the margin with a zero-width interval (a tie) is inconclusive.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Literal

import numpy as np

Status = Literal["supported", "not supported", "inconclusive"]
Direction = Literal["above", "below"]

DEFAULT_FLOOR = 30
DEFAULT_RESAMPLES = 2000
DEFAULT_CONFIDENCE = 0.95


@dataclass(frozen=True)
class EvidenceSettings:
    """How every verdict is decided; recorded with the report."""

    floor: int = DEFAULT_FLOOR  # fewest samples (per arm) a verdict is decided on
    resamples: int = DEFAULT_RESAMPLES
    confidence: float = DEFAULT_CONFIDENCE
    seed: int = 0


@dataclass(frozen=True)
class Interval:
    """An effect over ``n`` samples with its bootstrap interval; NaN bounds when it is undefined."""

    effect: float
    low: float
    high: float
    n: int

    @property
    def defined(self) -> bool:
        return not any(math.isnan(value) for value in (self.effect, self.low, self.high))

    def text(self, spec: str = ".3f") -> str:
        if not self.defined:
            return f"undefined (n={self.n})"
        return f"{format(self.effect, spec)} [{format(self.low, spec)}, {format(self.high, spec)}] (n={self.n})"

    def to_dict(self) -> dict:
        return asdict(self)


UNDEFINED = Interval(math.nan, math.nan, math.nan, 0)


def interval(
    n: int, statistic: Callable[[np.ndarray], float], settings: EvidenceSettings, *, skip_undefined: bool = False
) -> Interval:
    """``statistic(indices)`` on all ``n`` samples and its percentile bootstrap interval over resampled indices.

    ``statistic`` takes an int array of sample indices (with repeats) and returns a float. An effect that is NaN
    on all samples is undefined; one sample has an effect but no interval. A resample whose statistic is NaN makes
    the interval undefined, unless ``skip_undefined``: then it is left out (an AUROC of a resample that drew one
    class only) and the interval is undefined only when every resample is.
    """
    if n < 1:
        return UNDEFINED
    effect = float(statistic(np.arange(n)))
    if math.isnan(effect) or n == 1:
        return Interval(effect, math.nan, math.nan, n)
    if not skip_undefined:
        result = _bootstrap(n, statistic, settings)
        return Interval(effect, float(result.confidence_interval.low), float(result.confidence_interval.high), n)
    from scipy.stats import DegenerateDataWarning  # scipy is imported when an interval is computed, not before

    with warnings.catch_warnings():  # scipy warns that NaN resamples leave its own interval undefined
        warnings.simplefilter("ignore", DegenerateDataWarning)
        distribution = _bootstrap(n, statistic, settings).bootstrap_distribution.ravel()
    defined = distribution[~np.isnan(distribution)]
    if not defined.size:
        return Interval(effect, math.nan, math.nan, n)
    return Interval(effect, *_percentiles(defined, settings), n)


def group_interval(
    groups: np.ndarray,
    statistic: Callable[[np.ndarray], float],
    settings: EvidenceSettings,
    *,
    skip_undefined: bool = False,
) -> Interval:
    """``interval`` over whole groups of units (the answers of one question, the tokens of one answer: units of a
    group correlate): each resample draws the distinct groups with repeats and ``statistic`` gets the indices of
    their units; n = the groups."""
    groups = np.asarray(groups)
    members = [np.flatnonzero(groups == group) for group in np.unique(groups)]
    return interval(
        len(members),
        lambda idx: statistic(np.concatenate([members[i] for i in idx])),
        settings,
        skip_undefined=skip_undefined,
    )


def pooled_interval(parts: Sequence[tuple[int, Callable[[np.ndarray], float]]], settings: EvidenceSettings) -> Interval:
    """One effect measured on several seeded splits of the samples, each ``(n, statistic)`` as for ``interval``
    (its own samples, resampled on their own): the effect is the mean of the splits' effects and the interval the
    percentiles of their pooled bootstrap distributions, so the spread between splits lies inside it. ``n`` is
    the fewest samples of a split. Undefined when a split's effect is; no interval when a split has one sample."""
    if not parts or min(n for n, _ in parts) < 1:
        return UNDEFINED
    effects = [float(statistic(np.arange(n))) for n, statistic in parts]
    effect, fewest = float(np.mean(effects)), min(n for n, _ in parts)
    if math.isnan(effect) or fewest == 1:
        return Interval(effect, math.nan, math.nan, fewest)
    pooled = np.concatenate(
        [_bootstrap(n, statistic, settings).bootstrap_distribution.ravel() for n, statistic in parts]
    )
    return Interval(effect, *_percentiles(pooled, settings), fewest)


def _percentiles(distribution: np.ndarray, settings: EvidenceSettings) -> tuple[float, float]:
    """The percentile interval of a bootstrap distribution at ``settings.confidence``."""
    tail = 100 * (1 - settings.confidence) / 2
    low, high = np.percentile(distribution, [tail, 100 - tail])
    return float(low), float(high)


@dataclass(frozen=True)
class BatchedStatistic:
    """A statistic that can also be computed for many resamples at once: ``one(indices) -> float`` and
    ``many(indices [B, n]) -> [B]``, ``one`` of each row up to floating-point rounding. The effect is ``one`` on all
    samples; the bootstrap draws the same resamples as for a plain statistic and calls ``many`` on them in one go
    (a pooled statistic that concatenates per-sample arrays costs a Python call per resample otherwise)."""

    one: Callable[[np.ndarray], float]
    many: Callable[[np.ndarray], np.ndarray]

    def __call__(self, indices: np.ndarray) -> float:
        return self.one(indices)


def _bootstrap(n: int, statistic: Callable[[np.ndarray], float], settings: EvidenceSettings):
    """scipy's percentile bootstrap of ``statistic`` over resampled sample indices ``0..n-1``."""
    from scipy.stats import bootstrap

    resampling = {
        "n_resamples": settings.resamples,
        "confidence_level": settings.confidence,
        "method": "percentile",
        "rng": np.random.default_rng(settings.seed),
    }
    if isinstance(statistic, BatchedStatistic):
        many = statistic.many
        return bootstrap(
            (np.arange(n),),
            lambda idx, axis=-1: many(np.atleast_2d(idx).astype(int)).reshape(np.shape(idx)[:-1]),
            vectorized=True,
            **resampling,
        )
    return bootstrap((np.arange(n),), lambda idx: float(statistic(idx.astype(int))), vectorized=False, **resampling)


def mean_interval(
    values: np.ndarray | Sequence[float],
    settings: EvidenceSettings,
    *,
    width: float | None = None,
    bounds: tuple[float, float] | None = None,
) -> Interval:
    """The mean of per-sample values (NaN values, samples where the quantity is undefined, left out first);
    ``width`` and ``bounds`` as for ``paired_difference`` ((0, 1) for a proportion)."""
    values = np.asarray(values, dtype=float)
    return _mean(values[~np.isnan(values)], settings, width, bounds)


def proportion_interval(successes: int, n: int, settings: EvidenceSettings) -> Interval:
    """A proportion, ``successes`` of ``n`` units, with its exact (Clopper-Pearson) interval at
    ``settings.confidence`` (``scipy.stats.binomtest``): defined for n >= 1 (1 of 1 gives [0.025, 1] at 95 %, 100
    of 100 [0.964, 1]), undefined at n = 0."""
    if n < 1:
        return UNDEFINED
    if not 0 <= successes <= n:
        raise ValueError(f"{successes} successes of {n} units is not a proportion")
    from scipy.stats import binomtest

    bounds = binomtest(int(successes), int(n)).proportion_ci(confidence_level=settings.confidence, method="exact")
    return Interval(successes / n, float(bounds.low), float(bounds.high), int(n))


def above_chance_p_value(successes: int, n: int, chance: float) -> float:
    """The one-sided exact binomial p-value (``scipy.stats.binomtest``, alternative "greater") that a proportion of
    ``successes`` in ``n`` units lies above ``chance``; NaN at n = 0. Against the project's 95 % rule read it at
    (1 - confidence) / 2 = 0.025: p below it exactly when the exact two-sided 95 % interval lies above chance."""
    if n < 1:
        return math.nan
    from scipy.stats import binomtest

    return float(binomtest(int(successes), int(n), chance, alternative="greater").pvalue)


def fraction_interval(values: np.ndarray | Sequence[float], settings: EvidenceSettings) -> Interval:
    """The mean of per-unit values in [0, 1] (NaN values left out first): the exact ``proportion_interval`` when
    every value is 0 or 1 (accuracy, EM, a 0/1 win), else the bootstrap with ``bounds=(0, 1)`` (ROUGE-L, F1, a share
    per unit: exact when all values are one value; one value gives ``identical_interval`` too), so the interval is
    never of zero width."""
    defined = _defined(values)
    if defined.size and (defined.min() < 0 or defined.max() > 1):
        raise ValueError("fraction_interval takes values in [0, 1]")
    if np.isin(defined, (0.0, 1.0)).all():
        return proportion_interval(int(defined.sum()), len(defined), settings)
    if len(defined) == 1:
        return identical_interval(defined, math.inf, settings, bounds=(0.0, 1.0))
    return _mean(defined, settings, None, (0.0, 1.0))


def paired_difference(
    treated: np.ndarray,
    control: np.ndarray,
    settings: EvidenceSettings,
    *,
    width: float | None = None,
    bounds: tuple[float, float] | None = None,
) -> Interval:
    """mean(treated - control) over the same samples (position i is one sample in both), with its interval.

    ``width``: the widest a per-sample difference can stray from another (1 for a proportion); ``bounds``: the
    range a per-sample difference lies in ((-1, 1) for two proportions), the tighter of the two. Given either,
    identical differences get ``identical_interval`` instead of a bootstrap that has nothing to resample."""
    return _mean(np.asarray(treated, dtype=float) - np.asarray(control, dtype=float), settings, width, bounds)


def _mean(
    values: np.ndarray, settings: EvidenceSettings, width: float | None, bounds: tuple[float, float] | None
) -> Interval:
    """The mean of ``values`` with its bootstrap interval, or the exact one when a bounded metric's values are
    identical."""
    if (width is not None or bounds is not None) and all_identical(values):
        return identical_interval(values, width if width is not None else math.inf, settings, bounds=bounds)
    return interval(len(values), lambda idx: float(values[idx].mean()), settings)


def all_identical(values: np.ndarray) -> bool:
    """Whether there are at least two values and all are one value (a bootstrap over them is one point)."""
    values = np.asarray(values, dtype=float)
    return len(values) > 1 and not np.isnan(values).any() and bool(np.ptp(values) == 0)


def identical_interval(
    values: np.ndarray, width: float, settings: EvidenceSettings, *, bounds: tuple[float, float] | None = None
) -> Interval:
    """The exact interval of a mean when all ``n`` values are one value c: no sample of n differed, so the share
    of the population that differs is at most the exact (Clopper-Pearson) upper bound u of 0/n
    (``scipy.stats.binomtest``), and the mean lies within c ± u x ``width``; with ``bounds`` (lo, hi) on a
    value, within [c - u (c - lo), c + u (hi - c)] (tighter, and never outside the range). Undefined when neither
    is finite (an unbounded metric has no exact interval)."""
    values = np.asarray(values, dtype=float)
    n, c = len(values), float(values[0])
    from scipy.stats import binomtest

    upper = float(binomtest(0, n).proportion_ci(confidence_level=settings.confidence, method="exact").high)
    low, high = c - upper * width, c + upper * width
    if bounds is not None:
        low, high = max(low, c - upper * (c - bounds[0])), min(high, c + upper * (bounds[1] - c))
    if not (math.isfinite(low) and math.isfinite(high)):
        return Interval(c, math.nan, math.nan, n)
    return Interval(c, low, high, n)


@dataclass(frozen=True)
class Effect:
    """One tested effect of a verdict: what it is, its interval, the margin and which side supports the claim."""

    name: str  # e.g. "static - dynamic accuracy"
    interval: Interval
    margin: float
    direction: Direction = "above"
    undefined_reason: str = ""  # why the effect is undefined, when it is

    @property
    def rule(self) -> str:
        return f"{'>' if self.direction == 'above' else '<'} {self.margin:g}"

    def decide(self, floor: int) -> tuple[Status, str]:
        """(status, reason) of this effect alone."""
        if not self.interval.defined:
            return "inconclusive", f"{self.name} is undefined" + (
                f": {self.undefined_reason}" if self.undefined_reason else ""
            )
        if self.interval.n < floor:
            return "inconclusive", f"{self.name}: n={self.interval.n} is below the floor of {floor} samples"
        low, high = self.interval.low, self.interval.high
        beyond = low > self.margin if self.direction == "above" else high < self.margin
        short = high < self.margin if self.direction == "above" else low > self.margin
        if beyond:
            return "supported", f"{self.name}: the interval lies {self.direction} {self.margin:g}"
        if short:
            return "not supported", f"{self.name}: the interval lies on the other side of {self.margin:g}"
        return "inconclusive", f"{self.name}: the interval contains {self.margin:g}"

    def line(self) -> str:
        """One line a reader can check: the effect, its interval and n, the rule, and the smallest effect this n
        detects (``minimum_detectable_effect``)."""
        detectable = minimum_detectable_effect(self.interval)
        power = f"; detects {detectable:.3g} at {DEFAULT_POWER * 100:.0f} % power" if math.isfinite(detectable) else ""
        return f"{self.name} {self.interval.text()}, rule {self.rule}{power}"


DEFAULT_POWER = 0.8


def minimum_detectable_effect(
    found: Interval, confidence: float = DEFAULT_CONFIDENCE, power: float = DEFAULT_POWER
) -> float:
    """The smallest true distance from the margin that an interval of this width finds at ``power``: with the
    interval's half-width z_(1-a/2) x SE (normal approximation of the bootstrap), (z_(1-a/2) + z_power) x SE. NaN for
    an undefined or zero-width interval. A verdict whose effect of interest lies below it is underpowered."""
    if not found.defined or found.high <= found.low:
        return math.nan
    from scipy.stats import norm

    z = float(norm.ppf(1 - (1 - confidence) / 2))
    return (z + float(norm.ppf(power))) * (found.high - found.low) / (2 * z)


def combine(effects: list[Effect], floor: int) -> tuple[Status, str]:
    """All effects must be supported for the claim; one that is not supported decides against it; otherwise the
    verdict is inconclusive with the reasons of the effects that did not decide."""
    decisions = [effect.decide(floor) for effect in effects]
    statuses = [status for status, _ in decisions]
    if "not supported" in statuses:
        return "not supported", "; ".join(reason for status, reason in decisions if status == "not supported")
    if all(status == "supported" for status in statuses) and statuses:
        return "supported", "every effect lies beyond its margin"
    return "inconclusive", "; ".join(reason for status, reason in decisions if status == "inconclusive")


# ---- family-wise adjustment (Holm) ---------------------------------------------------------------------------------
def holm_rejections(p_values: Sequence[float], alpha: float = 1 - DEFAULT_CONFIDENCE) -> list[bool]:
    """Holm's step-down procedure: sort the m p-values, reject the i-th smallest (i = 1..m) while it is at most
    alpha / (m - i + 1), and stop at the first that is not; the family-wise error rate is at most alpha. Returns,
    in the given order, whether each hypothesis is rejected."""
    order = sorted(range(len(p_values)), key=lambda i: p_values[i])
    rejected = [False] * len(p_values)
    for rank, index in enumerate(order):
        if not p_values[index] <= alpha / (len(p_values) - rank):
            break
        rejected[index] = True
    return rejected


@dataclass(frozen=True)
class HolmDecision:
    """One difference of a Holm-adjusted family: its interval at the step-down ``confidence`` it was decided at, and
    whether that interval excludes the margin (rejected: the difference is not the margin, family-wise)."""

    adjusted: Interval
    confidence: float
    rejected: bool

    def text(self, spec: str = ".3f") -> str:
        if not self.adjusted.defined:
            return "undefined"
        mark = "≠ 0" if self.rejected else "n.s."
        return f"[{format(self.adjusted.low, spec)}, {format(self.adjusted.high, spec)}] {mark}"


def holm_differences(
    family: Mapping[str, np.ndarray | Sequence[float]],
    settings: EvidenceSettings,
    *,
    margin: float = 0.0,
    width: float | None = None,
    bounds: tuple[float, float] | None = None,
) -> dict[str, HolmDecision]:
    """Holm's procedure over a family of per-unit paired differences (name -> array, as for ``paired_difference``;
    ``width``/``bounds`` likewise), two-sided against ``margin``, family-wise at alpha = 1 - settings.confidence.

    Chosen design: Holm by inverting this module's own intervals, not on separate bootstrap p-values. With r
    hypotheses still open, each open difference's interval is computed at confidence 1 - alpha / r (the same seed,
    hence the same resamples, at every level, so the intervals are nested and a difference's implied p-value, the
    smallest alpha' whose interval excludes the margin, is well defined); every open difference whose interval
    excludes the margin is rejected (its p-value is at most alpha / r, so Holm rejects it at this step or the next),
    r shrinks by them, and the step repeats until none is rejected. That is Holm's step-down on those implied
    p-values, and identical differences get the exact ``identical_interval`` as everywhere else. Each decision
    carries the interval at the level it was decided at (rejected: the step that rejected it; open: the last
    step's 1 - alpha / r), so a reader sees how far each adjusted interval lies from the margin. These are not
    simultaneous intervals; the guarantee is Holm's: the chance of rejecting any true null of the family is at
    most alpha."""
    alpha, open_names = 1 - settings.confidence, list(family)
    decided: dict[str, HolmDecision] = {}
    while open_names:
        confidence = 1 - alpha / len(open_names)
        at_level = replace(settings, confidence=confidence)
        intervals = {name: _mean(_defined(family[name]), at_level, width, bounds) for name in open_names}
        rejected = [name for name in open_names if _excludes(intervals[name], margin)]
        for name in rejected or open_names:
            decided[name] = HolmDecision(intervals[name], confidence, bool(rejected))
        if not rejected:
            break
        open_names = [name for name in open_names if name not in rejected]
    return {name: decided[name] for name in family}


def _defined(values: np.ndarray | Sequence[float]) -> np.ndarray:
    values = np.asarray(values, dtype=float)
    return values[~np.isnan(values)]


def _excludes(found: Interval, margin: float) -> bool:
    return found.defined and (found.low > margin or found.high < margin)
