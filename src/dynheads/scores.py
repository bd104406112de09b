"""The one vocabulary of head scores: the registry of per-step head scores (Eq. 1, Eq. 2, ...), the active set D_t,
``ScoreSpec``.

A head score is data (``HeadScore``), in the manner of TransformerLens's head detector (a head kind is a pattern
plus a reduction): it reduces one step's probe statistics of every head (``StepMeasures``: argmax key, masses on
the needle, the kept keys and the context) with the decoded row (``ScoredRow``: needle, prompt length, token
buffer) and the predicted token to one ``[L, H]`` tensor, binary or continuous. ``HEAD_SCORES`` holds the
registered ones by name; every trace stores each of them by that name and every analysis takes a name, so a new
score is one ``register_score`` call (in any module, a test file included):

- ``copy`` (Eq. 1, binary): a head copies at step t when its most-attended key is a needle token of the prompt
  that holds the token the model predicts.
- ``reasoning`` (Eq. 2, continuous): the head's attention mass on the needle over its mass outside the
  attention sink (first ``sink_size`` keys) and the local window (last ``local_window`` keys); needle keys are
  never excluded. The probe (``dynheads.engine.probe``) sums the masses; the ratio is ``StepStats.reasoning_scores``.
- ``SpanScore`` (continuous, over spans; in-context re-ranking): a head's score of key span s is the attention that
  the query rows put on the span's keys, averaged over those rows and summed over the keys (ICR, Chen et al.
  2025; QRHead, Zhang et al. 2025; both take the rows from the instruction after the candidates through the end of
  the prompt). The probe reduces it in its pass; ``calibrated_span_scores`` subtracts the same pass with a
  content-free query (ICR's calibration: the row mean makes the two passes comparable although the real query has
  more rows) and ``span_ranking`` sums chosen heads into one score per span.
- ``write`` (continuous, in logits; LOCOS, arXiv 2607.01002, per step): what the head's needle keys add directly
  to the logit of the token the step emits, ``u_yᵀ W_O^{l,h} sum_{j in needle} a_j v_j``, minus what its other keys
  add, rescaled to a span of the needle's length (``x |needle| / |other keys|``, over every key up to the step's
  query). ``u_y``: the unembedding row of y; ``W_O^{l,h}``: the head's columns of its layer's output projection
  (``dynheads.engine.readout``); the final norm is not folded in. Where Eq. 1 sees only literal copying, this
  sees what a head writes toward the answer from the needle, copied or not. It reads each head's output, which the
  probe measures only when asked (``head_outputs``): a trace records it with ``head_outputs=True``
  (``--write-score``), a live step ranking by it asks by itself.
- D_t, the dynamic (active) heads of a step: a binary score 1, or a continuous score above ``threshold``
  (``dynheads.thresholds``: an absolute score or, for scores of attention shares such as Eq. 2, a multiple of the
  step's Eq. 2 chance share).

The defaults of every score setting (sink, local window, Eq. 2 threshold) are declared here once;
everything that scores heads reads them from here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import numpy as np

from dynheads.errors import DynheadsError
from dynheads.heads import Head
from dynheads.registry import Registry
from dynheads.thresholds import DEFAULT_REASONING_THRESHOLD, LOCAL_WINDOW, SINK_SIZE, ReasoningThreshold

if TYPE_CHECKING:  # torch is imported where a tensor is made, so reading the vocabulary does not load it
    import torch

__all__ = [
    "DEFAULT_REASONING_THRESHOLD",
    "HEAD_SCORES",
    "LOCAL_WINDOW",
    "SINK_SIZE",
    "HeadScore",
    "ScoreKind",
    "ScoreSpec",
    "ScoredRow",
    "SpanScore",
    "StepMeasures",
    "active_heads",
    "calibrated_span_scores",
    "check_kind",
    "copy_scores",
    "ranked_heads",
    "reads_head_outputs",
    "score_values",
    "reasoning_scores",
    "register_score",
    "span_ranking",
]

ScoreKind = str  # the name of a registered head score ("copy", "reasoning", ...)


class StepMeasures(Protocol):
    """What a head score reads of one step's probe statistics (``dynheads.engine.probe.StepStats``), each ``[L, H]``."""

    argmax_pos: torch.Tensor  # int64, absolute position of the most-attended key
    max_prob: torch.Tensor  # attention weight on that key
    needle_mass: torch.Tensor  # mass on the needle positions
    excluded_mass: torch.Tensor  # mass on (sink U local window) \ needle
    total_mass: torch.Tensor  # sum of the row
    kept_mass: torch.Tensor  # mass outside (sink U local window) \ needle
    context_mass: torch.Tensor  # mass on the context (prompt) positions
    context_entropy: torch.Tensor  # entropy of the row renormalised over the context

    def logit_contributions(self, token: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``[L, H]`` twice: what each head's needle keys and its other keys add directly to ``token``'s logit."""
        ...


class ScoredRow(Protocol):
    """What a head score reads of the sequence being decoded (``dynheads.engine.decoding.Row``)."""

    prompt_length: int
    length: int  # tokens in the cache: the step's query sits at position length - 1
    ids: torch.Tensor  # [capacity] the token buffer (absolute positions)
    needle: list[int]  # sorted needle positions
    sink_size: int
    local_window: int

    def is_needle(self, positions: torch.Tensor) -> torch.Tensor: ...

    def chance_share(self) -> float: ...


@dataclass(frozen=True)
class HeadScore:
    """A per-step head score: ``reduce(stats, row, predicted)`` is every head's score ``[L, H]`` at one step
    (``predicted``: the token the step emits, ŷ of Eq. 1). A ``binary`` score is its own active set and ranks its
    heads by the attention on their argmax key; a continuous one is active above a threshold and ranks by value."""

    reduce: Callable[[StepMeasures, ScoredRow, int], torch.Tensor]
    binary: bool
    label: str  # how reports name it ("Eq. 1 copy score")
    share: bool = True  # continuous scores: an attention share, so a threshold may be a multiple of chance
    head_outputs: bool = False  # reads each head's output (``StepMeasures.logit_contributions``): passes measure it


HEAD_SCORES = Registry[HeadScore]("head score")


def register_score(
    name: str,
    reduce: Callable[[StepMeasures, ScoredRow, int], torch.Tensor],
    *,
    binary: bool,
    label: str,
    help: str,
    replace: bool = False,
    share: bool = True,
    head_outputs: bool = False,
) -> HeadScore:
    """Declare a head score: traces record it by ``name`` (their column ``<name>_score``) from then on, and
    analyses accept the name. ``help``: one line. ``share=False``: a continuous score that is not an attention
    share (logits, say), which only an absolute threshold turns into D_t. ``head_outputs=True``: a score that
    reads each head's output (``logit_contributions``), which the probe measures only when a pass asks
    (``Measure.head_outputs``): traces record it when asked for (``trace(..., head_outputs=True)``, ``--write-score``),
    and a live step that ranks by it measures them."""
    if not name.isidentifier():
        raise DynheadsError(f"a head score's name is one word (letters, digits, _), got {name!r}")
    if not help.strip() or "\n" in help:
        raise DynheadsError(f"head score {name!r} needs a one-line help text")
    score = HeadScore(reduce, binary, label, share, head_outputs)
    HEAD_SCORES.register(name, score, help=help, replace=replace)
    return score


def score_values(scores: Mapping[str, np.ndarray], kind: str) -> np.ndarray:
    """``[step, layer, head]``: score ``kind``'s array among a trace's ``scores`` (by name), with no threshold: what
    reads a score's values (static lists, CCA, the head predictor) needs no ``ScoreSpec``."""
    if check_kind(kind) not in scores:
        how = "--write-score (head_outputs=True)" if reads_head_outputs(kind) else "the score registered"
        raise DynheadsError(f"this trace holds no {kind!r} score (it has {', '.join(scores)}): re-trace with {how}")
    return scores[kind]


def reads_head_outputs(kind: str) -> bool:
    """Whether score ``kind`` reads each head's output, which a pass measures only when asked
    (``HeadScore.head_outputs``; the write score)."""
    return HEAD_SCORES.get(check_kind(kind)).head_outputs


def check_kind(kind: str) -> ScoreKind:
    """``kind`` when it names a registered head score, else a one-line error."""
    if kind not in HEAD_SCORES:
        raise DynheadsError(f"score must be one of {HEAD_SCORES.choices()}, got {kind!r}")
    return kind


@dataclass(frozen=True)
class ScoreSpec:
    """How a head is scored and when it counts as active: the score's name, the threshold and the Eq. 2 window."""

    kind: ScoreKind = "copy"  # a registered head score
    threshold: str = DEFAULT_REASONING_THRESHOLD  # continuous scores only: "0.1" (absolute) or "relative:3" (x chance)
    sink_size: int = SINK_SIZE
    local_window: int = LOCAL_WINDOW

    def __post_init__(self) -> None:
        check_kind(self.kind)
        threshold = ReasoningThreshold.parse(self.threshold)  # a bad threshold fails before any work
        score = self.score
        if not score.binary and not score.share and threshold.mode == "relative":
            raise DynheadsError(
                f"the {score.label} is not an attention share: give it an absolute threshold (a number such as "
                f"1.0) or a mean set size to fit (calibrated:M), not {self.threshold!r} (a multiple of Eq. 2's "
                "chance share)"
            )
        if self.sink_size < 0 or self.local_window < 0:
            raise DynheadsError(f"sink size and local window must be >= 0, got {self.sink_size}, {self.local_window}")

    @property
    def score(self) -> HeadScore:
        return HEAD_SCORES.get(self.kind)

    def describe(self) -> str:
        """For reports: what 'active' means ("Eq. 1 copy score", or the continuous score above its threshold)."""
        score = self.score
        threshold = ReasoningThreshold.parse(self.threshold)
        return score.label if score.binary else threshold.describe(score.label, share=score.share)

    def trace_scores(self, scores: Mapping[str, np.ndarray]) -> np.ndarray:
        """``[step, layer, head]``: this score's array among a trace's ``scores`` (by name)."""
        return score_values(scores, self.kind)

    def active(self, scores: Mapping[str, np.ndarray], chance: np.ndarray | float | None) -> np.ndarray:
        """Bool D_t ``[step, layer, head]`` of a trace's ``scores`` (or of one step's ``[layer, head]`` arrays with
        a float ``chance``)."""
        values = self.trace_scores(scores)
        if self.score.binary:
            return np.asarray(values, dtype=bool)
        return ReasoningThreshold.parse(self.threshold).active(values, chance)

    def step_heads(self, stats: StepMeasures, row: ScoredRow, predicted: int) -> list[Head]:
        """D_t of one live step, ranked: binary scores by the heads' attention on their argmax key (a copying
        head's argmax key is the copied position, so its ``max_prob`` is that weight); continuous ones by their
        value (an Eq. 2 head's max_prob is usually the sink's weight, not attention on the supporting facts)."""
        score = self.score
        values = score.reduce(stats, row, predicted)
        if score.binary:
            return ranked_heads(values, stats.max_prob)
        return ranked_heads(values > ReasoningThreshold.parse(self.threshold).cutoff(row.chance_share()), values)

    def step_ranking(self, stats: StepMeasures, row: ScoredRow, predicted: int) -> list[Head]:
        """Every head of one live step, ranked for a dose of k heads: D_t first (``step_heads``' order), then the
        others by the score's value (binary scores: by their attention mass on the needle)."""
        return self.step_sets(stats, row, predicted)[1]

    def step_sets(self, stats: StepMeasures, row: ScoredRow, predicted: int) -> tuple[list[Head], list[Head]]:
        """``step_heads`` and ``step_ranking`` of one live step, D_t found once."""
        dynamic = self.step_heads(stats, row, predicted)
        score = self.score
        values = stats.needle_mass if score.binary else score.reduce(stats, row, predicted)
        import torch

        rest = torch.ones_like(values, dtype=torch.bool)
        for layer, head in dynamic:
            rest[layer, head] = False
        return dynamic, dynamic + ranked_heads(rest, values.float())


def copy_scores(stats: StepMeasures, row: ScoredRow, predicted: int) -> torch.Tensor:
    """Eq. 1, bool ``[L, H]``: the head's argmax key (absolute position) is a needle token of the prompt and
    carries the predicted token (``row.ids``: the sequence's token buffer)."""
    argmax_pos = stats.argmax_pos
    return row.is_needle(argmax_pos) & (argmax_pos < row.prompt_length) & (row.ids[argmax_pos] == predicted)


def reasoning_scores(needle_mass: torch.Tensor, kept_mass: torch.Tensor) -> torch.Tensor:
    """Eq. 2, ``[..., L, H]``: needle mass over the mass outside sink and local window (needle keys never
    excluded); 0 where that mass is 0.

    ``kept_mass`` is summed from the kept keys by the probe, never ``total - excluded``: with 99.9 % of the mass
    on the sink that difference keeps only a few fp32 digits (or snaps to 0).
    """
    import torch

    return torch.where(kept_mass > 0, needle_mass / kept_mass.clamp_min(1e-30), 0.0)


register_score(
    "copy",
    copy_scores,
    binary=True,
    label="Eq. 1 copy score",
    help="Eq. 1: the head's argmax key is a needle token of the prompt carrying the predicted token",
)
register_score(
    "reasoning",
    lambda stats, row, predicted: reasoning_scores(stats.needle_mass, stats.kept_mass),
    binary=False,
    label="Eq. 2 reasoning score",
    help="Eq. 2: needle mass over the mass outside the attention sink and the local window",
)


def write_scores(stats: StepMeasures, row: ScoredRow, predicted: int) -> torch.Tensor:
    """``[L, H]`` float32: the needle keys' direct contribution to the predicted token's logit minus the other
    keys', rescaled to the needle's length (LOCOS's per-step score; 0 where no needle key is in the keys yet)."""
    needle, other = stats.logit_contributions(predicted)
    inside = sum(1 for position in row.needle if position < row.length)  # needle keys among the step's keys
    others = row.length - inside
    return needle - other * (inside / others if others else 0.0)  # no needle key: needle part and scale are 0


register_score(
    "write",
    write_scores,
    binary=False,
    share=False,
    head_outputs=True,
    label="write score",
    help="LOCOS per step: the needle keys' direct write to the emitted token's logit minus the other keys'",
)


def ranked_heads(active: torch.Tensor, weights: torch.Tensor) -> list[Head]:
    """D_t as ``(layer, head)`` pairs from bool ``active [L, H]``, highest ``weights [L, H]`` first, ties by index
    (the order progressive ablation removes them in)."""
    import torch

    heads = torch.nonzero(active).tolist()
    values = weights[active].tolist()
    order = sorted(range(len(heads)), key=lambda i: (-values[i], heads[i]))
    return [(heads[i][0], heads[i][1]) for i in order]


def active_heads(active: np.ndarray) -> list[Head]:
    """The ``(layer, head)`` pairs of one step's bool ``[L, H]`` active set, in index order."""
    return [(int(layer), int(head)) for layer, head in np.argwhere(active)]


@dataclass(frozen=True)
class SpanScore:
    """The span score of one pass: query rows ``query = (start, stop)`` (their attention is averaged) and key
    ``spans`` (each summed), all ``[start, stop)`` absolute token positions; the query positions must all be fed in
    the pass that measures it."""

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

    @classmethod
    def per_key(cls, query: tuple[int, int], keys: int) -> SpanScore:
        """One span per key position ``0 .. keys - 1``: the mean attention row itself (``unit``)."""
        return cls(query, tuple((position, position + 1) for position in range(keys)))

    @property
    def unit(self) -> bool:
        """Span s is key position s, for every s: the probe adds the rows up per key, with no ``[keys, S]`` matrix
        (a span per key of a long prompt would make that matrix quadratic in its length)."""
        return all(span == (index, index + 1) for index, span in enumerate(self.spans))

    def key_weights(self) -> torch.Tensor:
        """Float ``[positions, S]``: 1 where key position p lies in span s (what the probe multiplies rows by)."""
        import torch

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
