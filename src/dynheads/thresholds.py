"""The Eq. 2 threshold that turns continuous reasoning scores into dynamic sets D_t.

One option with a mode, written as text everywhere (CLI, configs, manifests):

- ``"0.1"`` or ``"absolute:0.1"``: a head is active when its Eq. 2 score exceeds 0.1 (the paper's reading).
- ``"relative:3"``: active when the score exceeds 3x *chance*, the score of a head that attends uniformly:
  ``|needle| / |keys outside sink and local window|`` at that step (``Trace.chance``,
  ``AttentionProbe.chance_share``). Supporting facts are 10-20 % of a 250-1000-token context, so an absolute
  0.1 lets heads that attend uniformly count as reasoning heads; a multiple of chance does not.
- ``"calibrated:12"``: a multiple of chance *fitted* so that the mean |D_t| over every step of a fitting stream is
  12 (``fit_relative``), then applied as ``relative:K`` to the evaluated samples. For a score that is not an
  attention share (the write score, in logits) the fit is an absolute value instead (``fit_absolute``), applied as
  itself. ``relative:3`` marked a quarter to a third of all heads of the embedded model at every step; the paper's
  sets hold about 5-20 heads. A calibrated
  threshold, not a per-step top-k: |D_t| still varies from step to step (Table 1's Std, empty steps, Claim 1's
  statistics mean something), and only its mean is set, on questions that are never evaluated. It must be fitted
  before it can say which heads are active (``cutoff`` refuses it): ``dynheads.views.threshold_fit``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, cast, overload

import numpy as np

from dynheads.errors import DynheadsError

ThresholdMode = Literal["absolute", "relative", "calibrated", "null"]
FITTED = ("calibrated", "null")  # rules fitted on a fitting stream (null: a traced decoy run) before they decide

# The one default of the threshold (``dynheads.scores.ScoreSpec`` reads it).
# Chosen on the embedded model, 18 synthetic HotpotQA questions (docs/hotpotqa.md, "Eq. 2 threshold").
# Eq. 2's windows (dynheads.scores re-exports them; declared here, in a module without torch, so that configs can
# read them without importing torch).
SINK_SIZE = 4  # first keys excluded from the denominator as the attention sink
LOCAL_WINDOW = 32  # last keys excluded from the denominator as local attention (current token included)
DEFAULT_REASONING_THRESHOLD = "relative:3"


def chance_share(needle: Iterable[int], last_position: int, sink_size: int, local_window: int) -> float:
    """Eq. 2 score of a head attending uniformly over keys ``0..last_position``: needle keys / scored keys,
    where scored = every key but the sink and local positions that are not needle positions."""
    needle = {int(p) for p in needle if p <= last_position}
    excluded = set(range(min(sink_size, last_position + 1)))
    excluded |= set(range(max(last_position - local_window + 1, 0), last_position + 1))
    scored = last_position + 1 - len(excluded - needle)
    return len(needle) / scored if scored > 0 else 0.0


def chance_per_step(
    needle: Iterable[int], prompt_length: int, steps: int, sink_size: int, local_window: int
) -> np.ndarray:
    """``[steps]`` float32 chance shares of a trace: step t's query sits at position ``prompt_length - 1 + t``."""
    needle = list(needle)
    return np.array(
        [chance_share(needle, prompt_length - 1 + t, sink_size, local_window) for t in range(steps)], dtype=np.float32
    )


@dataclass(frozen=True)
class ReasoningThreshold:
    mode: ThresholdMode
    value: float

    @classmethod
    def parse(cls, spec: str | float | ReasoningThreshold) -> ReasoningThreshold:
        """``0.1``, ``"0.1"``, ``"absolute:0.1"``, ``"relative:3"`` or ``"calibrated:12"``; refuses anything else in
        one line."""
        if isinstance(spec, ReasoningThreshold):
            return spec
        text = str(spec).strip()
        mode, sep, number = text.partition(":")
        if not sep:
            mode, number = "absolute", text
        try:
            value = float(number)
        except ValueError:
            value = math.nan
        if mode not in ("absolute", "relative", "calibrated", "null") or not math.isfinite(value) or value < 0:
            raise DynheadsError(
                f"cannot read threshold {text!r}: use a score such as 0.1, a multiple of chance such as "
                "relative:3, a mean set size to fit such as calibrated:12, or the heads per step to allow on decoy "
                "spans such as null:0.1"
            )
        if mode in FITTED and value <= 0:
            raise DynheadsError(f"a {mode} threshold needs a mean set size > 0, got {text!r}")
        return cls(cast(ThresholdMode, mode), value)  # one of the modes, checked above

    def __str__(self) -> str:
        return f"{self.value:g}" if self.mode == "absolute" else f"{self.mode}:{self.value:g}"

    def describe(self, score: str = "Eq. 2 reasoning score", share: bool = True) -> str:
        """For reports: what 'active' means under this threshold, for the continuous ``score`` (its label; ``share``:
        an attention share, whose calibrated threshold is a multiple of chance, else an absolute value)."""
        if self.mode == "absolute":
            return f"{score} > {self.value:g}"
        if self.mode == "calibrated":
            fitted = "K x chance, K" if share else "a value"
            return f"{score} > {fitted} fitted to a mean of {self.value:g} heads per step on a fitting stream"
        if self.mode == "null":
            fitted = "K x chance, K" if share else "a value"
            return (
                f"{score} > {fitted} at which decoy spans (no needle) mark {self.value:g} heads per step on a "
                "fitting stream"
            )
        return f"{score} > {self.value:g} x chance (|needle| / keys outside sink and local)"

    @overload
    def cutoff(self, chance: float | None) -> float: ...
    @overload
    def cutoff(self, chance: np.ndarray | None) -> float | np.ndarray: ...

    def cutoff(self, chance: float | np.ndarray | None) -> float | np.ndarray:
        """The score to exceed: the value itself, or value x chance (per step; ``chance [T]`` -> ``[T, 1, 1]``)."""
        if self.mode == "absolute":
            return self.value
        if self.mode in FITTED:
            raise DynheadsError(
                f"the threshold {self} is a rule to fit, not a cutoff: fit it on a fitting stream first "
                "(dynamism --fit-run DIR, or reproduce), or pass the value it fitted"
            )
        if chance is None:
            raise DynheadsError(
                f"the threshold {self} needs the per-step chance share, which this trace lacks "
                "(written before it was recorded): re-trace, or use an absolute threshold such as 0.1"
            )
        chance = np.asarray(chance, dtype=np.float64)
        if chance.ndim == 0:  # one step (the live ablation): a plain float compares with torch tensors too
            return self.value * float(chance)
        return self.value * (chance[:, None, None] if chance.ndim == 1 else chance)

    def active(self, scores: np.ndarray, chance: float | np.ndarray | None) -> np.ndarray:
        """Bool D_t: ``scores [T, L, H]`` with ``chance [T]``, or one step's ``[L, H]`` with a float chance."""
        return np.asarray(scores) > self.cutoff(chance)


def fit_absolute(scores: Sequence[np.ndarray], mean_size: float) -> float:
    """The value that ``score > value`` exceeds at ``mean_size`` heads per step on average over every step of
    ``scores`` (``[T, L, H]`` per sample): ``fit_relative`` with a chance of 1 at every step; never below 0 (a head
    whose score is negative is never active, whatever the target)."""
    ones = [np.ones(s.shape[0], dtype=np.float32) for s in scores]
    return max(fit_relative(scores, ones, mean_size), 0.0)


def fit_relative(scores: Sequence[np.ndarray], chances: Sequence[np.ndarray], mean_size: float) -> float:
    """The multiple K of chance for which ``score > K x chance`` marks ``mean_size`` heads per step on average over
    every step of ``scores`` (``[T, L, H]`` per sample, with ``chance [T]``): the pooled ratios' value below the
    ``round(mean_size x steps)`` largest ones. A step with no chance share (no needle) marks nothing. 0 when the
    target exceeds every positive ratio."""
    ratios = [
        np.divide(s, c[:, None, None], out=np.zeros(s.shape), where=c[:, None, None] > 0)
        for s, c in zip(scores, chances, strict=True)
    ]
    pooled = np.concatenate([r.ravel() for r in ratios]) if ratios else np.zeros(0)
    steps = sum(r.shape[0] for r in ratios)
    if not steps:
        raise DynheadsError("cannot fit a calibrated threshold on no step: the fitting run generated no token")
    keep = round(mean_size * steps)
    if keep >= pooled.size:
        return 0.0
    return float(-np.partition(-pooled, keep)[keep])  # the (keep + 1)-th largest ratio
