"""The one vocabulary of head scores: Eq. 1 (copy), Eq. 2 (reasoning share), the active set D_t, ``ScoreSpec``.

- ``copy`` (Eq. 1, binary): a head copies at step t when its most-attended key is a needle token of the prompt
  that holds the token the model predicts.
- ``reasoning`` (Eq. 2, continuous): the head's attention mass on the needle over its mass outside the
  attention sink (first ``sink_size`` keys) and the local window (last ``local_window`` keys); needle keys are
  never excluded. The probe (``dynheads.probe``) sums the masses; the ratio is ``StepStats.reasoning_scores``.
- ``SpanScore`` (continuous, over spans; in-context re-ranking): a head's score of key span s is the attention that
  the query rows (a question's tokens) put on the span's keys, summed over those rows and keys (ICR, Chen et al.
  2025; QRHead, Zhang et al. 2025). The probe reduces it in its pass; ``calibrated_span_scores`` subtracts the same
  pass with a content-free query (ICR's calibration) and ``span_ranking`` sums chosen heads into one score per span.
- D_t, the dynamic (active) heads of a step: copy score 1, or reasoning score above ``threshold``
  (``dynheads.thresholds``: an absolute score or a multiple of the step's chance share).

The defaults of every score setting (sink, local window, Eq. 2 threshold) are declared here once;
everything that scores heads reads them from here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
import torch

from dynheads.errors import DynheadsError
from dynheads.heads import Head
from dynheads.thresholds import DEFAULT_REASONING_THRESHOLD, LOCAL_WINDOW, SINK_SIZE, ReasoningThreshold

ScoreKind = Literal["copy", "reasoning"]  # Eq. 1 (binary, NIAH) or Eq. 2 (continuous, HotpotQA)
SCORE_KINDS: tuple[str, ...] = get_args(ScoreKind)

__all__ = ["DEFAULT_REASONING_THRESHOLD", "LOCAL_WINDOW", "SCORE_KINDS", "SINK_SIZE", "ScoreKind", "ScoreSpec",
           "SpanScore", "active_heads", "calibrated_span_scores", "check_kind", "copy_scores", "ranked_heads",
           "reasoning_scores", "span_ranking"]


def check_kind(kind: str) -> ScoreKind:
    """``kind`` when it names a score, else a one-line error."""
    if kind not in SCORE_KINDS:
        raise DynheadsError(f"score must be one of {', '.join(SCORE_KINDS)}, got {kind!r}")
    return kind  # type: ignore[return-value]


@dataclass(frozen=True)
class ScoreSpec:
    """How a head is scored and when it counts as active: the score kind, the Eq. 2 threshold and window."""

    kind: ScoreKind = "copy"
    threshold: str = DEFAULT_REASONING_THRESHOLD  # Eq. 2 only: "0.1" (absolute) or "relative:3" (x chance)
    sink_size: int = SINK_SIZE
    local_window: int = LOCAL_WINDOW

    def __post_init__(self) -> None:
        check_kind(self.kind)
        ReasoningThreshold.parse(self.threshold)  # a bad threshold fails before any work
        if self.sink_size < 0 or self.local_window < 0:
            raise DynheadsError(f"sink size and local window must be >= 0, got {self.sink_size}, "
                                f"{self.local_window}")

    def trace_scores(self, copy: np.ndarray, reasoning: np.ndarray) -> np.ndarray:
        """``[step, layer, head]``: the bool Eq. 1 array or the float Eq. 2 array of a trace, by ``kind``."""
        return copy if self.kind == "copy" else reasoning

    def active(self, copy: np.ndarray, reasoning: np.ndarray, chance: np.ndarray | float | None) -> np.ndarray:
        """Bool D_t ``[step, layer, head]`` (or one step's ``[layer, head]`` with a float ``chance``)."""
        if self.kind == "copy":
            return np.asarray(copy, dtype=bool)
        return ReasoningThreshold.parse(self.threshold).active(reasoning, chance)

    def step_heads(self, copy: torch.Tensor | None, max_prob: torch.Tensor, reasoning: torch.Tensor | None,
                   chance: float) -> list[Head]:
        """D_t of one live step (all ``[L, H]``), ranked: ``copy`` heads by their attention on the copied position
        (a copying head's argmax key is that position, so its ``max_prob`` is that weight); ``reasoning`` heads by
        their Eq. 2 score (their max_prob is usually the sink's weight, not attention on the supporting facts)."""
        if self.kind == "copy":
            assert copy is not None, "copy scores are needed for Eq. 1"
            return ranked_heads(copy, max_prob)
        assert reasoning is not None, "reasoning scores are needed for Eq. 2"
        return ranked_heads(reasoning > ReasoningThreshold.parse(self.threshold).cutoff(chance), reasoning)


def copy_scores(argmax_pos: torch.Tensor, is_needle: torch.Tensor, prompt_length: int, ids: torch.Tensor,
                predicted: int) -> torch.Tensor:
    """Eq. 1, bool ``[L, H]``: the head's argmax key (``argmax_pos [L, H]``, absolute positions) is a needle token
    (``is_needle [L, H]``) of the prompt and carries the predicted token (``ids``: the sequence's token buffer)."""
    return is_needle & (argmax_pos < prompt_length) & (ids[argmax_pos] == predicted)


def reasoning_scores(needle_mass: torch.Tensor, kept_mass: torch.Tensor) -> torch.Tensor:
    """Eq. 2, ``[..., L, H]``: needle mass over the mass outside sink and local window (needle keys never
    excluded); 0 where that mass is 0.

    ``kept_mass`` is summed from the kept keys by the probe, never ``total - excluded``: with 99.9 % of the mass
    on the sink that difference keeps only a few fp32 digits (or snaps to 0).
    """
    return torch.where(kept_mass > 0, needle_mass / kept_mass.clamp_min(1e-30), 0.0)


def ranked_heads(active: torch.Tensor, weights: torch.Tensor) -> list[Head]:
    """D_t as ``(layer, head)`` pairs from bool ``active [L, H]``, highest ``weights [L, H]`` first, ties by index
    (the order progressive ablation removes them in)."""
    heads = torch.nonzero(active).tolist()
    values = weights[active].tolist()
    order = sorted(range(len(heads)), key=lambda i: (-values[i], heads[i]))
    return [(heads[i][0], heads[i][1]) for i in order]


def active_heads(active: np.ndarray) -> list[Head]:
    """The ``(layer, head)`` pairs of one step's bool ``[L, H]`` active set, in index order."""
    return [(int(layer), int(head)) for layer, head in np.argwhere(active)]


@dataclass(frozen=True)
class SpanScore:
    """The span score of one pass: query rows ``query = (start, stop)`` and key ``spans``, all ``[start, stop)``
    absolute token positions; the query positions must all be fed in the pass that measures it."""

    query: tuple[int, int]
    spans: tuple[tuple[int, int], ...]

    def __post_init__(self) -> None:
        start, stop = self.query
        if not 0 <= start < stop:
            raise DynheadsError(f"a span score needs query positions start < stop, got {self.query}")
        if not self.spans or any(not 0 <= a < b for a, b in self.spans):
            raise DynheadsError(f"a span score needs non-empty key spans [start, stop), got {self.spans}")
        ordered = sorted(self.spans)
        if any(b > c for (_, b), (c, _) in zip(ordered, ordered[1:], strict=False)):
            raise DynheadsError("the key spans of a span score overlap")

    def key_weights(self) -> torch.Tensor:
        """Float ``[positions, S]``: 1 where key position p lies in span s (what the probe multiplies rows by)."""
        size = max(stop for _, stop in self.spans)
        weights = torch.zeros(size, len(self.spans), dtype=torch.float32)
        for index, (start, stop) in enumerate(self.spans):
            weights[start:stop, index] = 1.0
        return weights


def calibrated_span_scores(real: np.ndarray, content_free: np.ndarray) -> np.ndarray:
    """ICR's calibration, ``[..., L, H, S]``: the span mass under the real query minus that under a content-free
    query in the same position (the share a span draws whatever is asked: position, length, sink-like tokens)."""
    if real.shape != content_free.shape:
        raise DynheadsError(f"calibration needs equal shapes, got {real.shape} and {content_free.shape}")
    return np.asarray(real, dtype=np.float64) - np.asarray(content_free, dtype=np.float64)


def span_ranking(scores: np.ndarray, heads: list[Head] | None = None) -> np.ndarray:
    """``[S]`` from one question's ``scores [L, H, S]``: the sum over ``heads`` (None: every head, as ICR)."""
    if heads is None:
        return scores.sum(axis=(0, 1))
    if not heads:
        raise DynheadsError("a head-based ranking needs at least one head")
    layers, indices = zip(*heads, strict=True)
    return scores[list(layers), list(indices)].sum(axis=0)
