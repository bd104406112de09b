"""Per-step head ablation (paper Section 3.2): a clean pass finds the step's dynamic heads, a second pass
recomputes the same step with heads removed, and that token is emitted.

Only the last position is ever recomputed: the prompt minus its last token is prefilled once, and each step
feeds exactly one token. The clean pass leaves the cache untouched when a masked pass follows (its state is
saved and restored); the masked pass writes the cache, so later steps see the ablated history, as in the
paper. When a step masks nothing, the clean pass is kept and no second pass runs.

Strategies (``dynheads.ablation.strategies``, a registry): ``dynamic`` (mask D_t, or its first k heads ordered
by attention on the copied position), ``static`` (top heads of a static list), ``random`` (a seeded draw at each
step), ``fixed`` (one given head set at every step), ``none`` (plain greedy decoding), and any strategy registered
there.

How many heads the matched controls ``static`` and ``random`` mask (``matching``):

- ``per_step`` (default): at step t exactly |D_t| heads, where D_t is read off that step's clean pass of the
  control run itself. The question at step t is "how many heads would be dynamic now?", so the count follows
  the control run: when it derails the count follows its own clean passes, not the dynamic run's.
- ``mean``: at every step ``count`` heads, the dynamic run's average |D_t| rounded (the paper's sentence "as
  many heads as the average number of dynamic heads"). The dynamic run's D_t empties once masking derails it,
  so this count is often 0 or 1 while the dynamic run masked several heads at the copying steps.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from dynheads.ablation.strategies import ABLATION_STRATEGIES, MATCHINGS, MaskInputs
from dynheads.engine.decoding import (
    Action,
    DecodeInput,
    DecodingSession,
    Rerun,
    Row,
    StepPolicy,
    StepResult,
    decode,
    greedy,
)
from dynheads.engine.probe import STEP_STATS, AblationMode, Measure, RowEdit
from dynheads.errors import DynheadsError
from dynheads.heads import Head, check_heads
from dynheads.models import LoadedModel, decode_text
from dynheads.scores import DEFAULT_REASONING_THRESHOLD, LOCAL_WINDOW, SINK_SIZE, ScoreKind, ScoreSpec


@dataclass(frozen=True)
class AblationSettings:
    """How one ablated generation chooses and removes heads at each step: the ``strategy`` (a name in
    ``ABLATION_STRATEGIES``), the removal ``mode`` (zero, uniform, mean), how D_t is found (``score`` above
    ``threshold``), how many heads the other strategies mask (``matching``, ``count``, ``fraction``) and the head
    lists they read (``static_ranking``, ``fixed_heads``); see docs/ablation.md."""

    strategy: str = "dynamic"  # a name in ``ablation_strategies.ABLATION_STRATEGIES``
    mode: AblationMode = "zero"
    score: ScoreKind = "copy"  # how D_t is found: a registered head score (Eq. 1, or Eq. 2 above ``threshold``)
    threshold: str | float = DEFAULT_REASONING_THRESHOLD  # dynheads.thresholds: "0.1" or "relative:3"
    matching: str = "per_step"  # MATCHINGS: static/random mask |D_t| of each step's clean pass, or a fixed ``count``
    count: int | None = None  # matching="mean": heads per step for static/random (the dynamic run's mean |D_t|)
    max_dynamic: int | None = None  # progressive ablation: mask only the first k dynamic heads
    fraction: float | None = None  # dose-response: every strategy masks ceil(fraction x |D_t|) heads at each step
    static_ranking: tuple[Head, ...] = ()
    fixed_heads: tuple[Head, ...] = ()
    seed: int = 0
    sink_size: int = SINK_SIZE
    local_window: int = LOCAL_WINDOW
    contrast: ScoreKind | None = None  # the ``contrast`` arm: the step's top heads by this score (its own set first)
    contrast_threshold: str = DEFAULT_REASONING_THRESHOLD  # its own set, for a continuous contrast score

    def score_spec(self) -> ScoreSpec:
        return ScoreSpec(self.score, str(self.threshold), self.sink_size, self.local_window)

    def contrast_spec(self) -> ScoreSpec | None:
        """How the ``contrast`` arm ranks a step's heads: ``contrast``'s score above ``contrast_threshold``."""
        if self.contrast is None:
            return None
        return ScoreSpec(self.contrast, self.contrast_threshold, self.sink_size, self.local_window)

    def measure(self) -> Measure:
        """What each step's pass measures beyond the step statistics: the heads' outputs when D_t's score or the
        contrast's reads them (the write score), nothing more otherwise."""
        specs = (self.score_spec(), self.contrast_spec())
        reads = any(spec is not None and spec.score.head_outputs for spec in specs)
        return Measure(head_outputs=True) if reads else STEP_STATS


@dataclass
class AblationResult:
    tokens: list[int]
    text: str
    stop_reason: str
    dynamic_counts: list[int] = field(default_factory=list)  # |D_t| of the clean pass, per step
    masked: list[list[Head]] = field(default_factory=list)  # heads removed at each step
    compensated: list[list[Head]] = field(default_factory=list)  # E_t = H'_t - D_t, per step

    @property
    def mean_dynamic(self) -> float:
        return float(np.mean(self.dynamic_counts)) if self.dynamic_counts else 0.0


class AblationPolicy(StepPolicy):
    """The two passes of one ablated row: the clean pass finds D_t, a rerun removes the step's heads."""

    rerunnable = True

    def __init__(self, lm: LoadedModel, settings: AblationSettings, stop_ids: Collection[int]):
        self.lm, self.settings, self.stop_ids = lm, settings, stop_ids
        self.rng = np.random.default_rng(settings.seed)
        self.result = AblationResult(tokens=[], text="", stop_reason="max_new_tokens")
        self._dynamic: list[Head] = []
        self._measure = settings.measure()

    def measure(self, index: int) -> Measure:
        return self._measure

    def after(self, index: int, row: Row, result: StepResult, rerun: bool) -> Action:
        action = greedy(result, self.stop_ids)
        if rerun:  # the masked pass: its token is emitted
            token = int(result.logits.argmax())
            compensated = sorted(set(_dynamic_heads(row, result, token, self.settings)) - set(self._dynamic))
            self.result.compensated.append(compensated)
            return action
        predicted = int(result.logits.argmax())
        self._dynamic, ranking = _dynamic_and_ranking(row, result, predicted, self.settings)
        contrast = contrast_ranking(row, result, predicted, self.settings)
        heads = heads_to_mask(self._dynamic, self.settings, self.lm, self.rng, ranking, contrast)
        self.result.dynamic_counts.append(len(self._dynamic))
        self.result.masked.append(heads)
        if heads:
            return Rerun(RowEdit(removed=frozenset(heads), mode=self.settings.mode))
        self.result.compensated.append([])
        return action


def ablated_generate(
    lm: LoadedModel,
    sample: DecodeInput,
    settings: AblationSettings,
    max_new_tokens: int = 48,
    *,
    stop_at_eos: bool = True,
) -> AblationResult:
    """Greedy decoding where every step is computed twice: clean (to find D_t), then with heads removed.
    ``stop_at_eos=False`` always decodes ``max_new_tokens`` tokens (benchmarks)."""
    return ablated_generate_batch(lm, [sample], [settings], max_new_tokens, stop_at_eos=stop_at_eos)[0]


def ablated_generate_batch(
    lm: LoadedModel,
    samples: Sequence[DecodeInput],
    settings: Sequence[AblationSettings],
    max_new_tokens: int = 48,
    *,
    stop_at_eos: bool = True,
    rows_together: int | None = None,
) -> list[AblationResult]:
    """``ablated_generate`` for several samples (``settings[i]`` for ``samples[i]``; they may differ in strategy,
    heads and seed, not in masking mode or Eq. 2 windows). ``result[i]`` equals ``ablated_generate(lm,
    samples[i], settings[i], ...)``: exactly when ``rows_together`` is 1, up to fp32 rounding when rows decode as
    one batch (None: all of them; tests/test_ablation_batch.py).

    Each distinct prompt minus its last token is prefilled once and forked for every row that decodes it (the
    arms of one sample share it); every step then runs the clean pass and, for the rows that mask heads, the same
    step again with each row's own heads removed. Rows decode ``rows_together`` at a time, in order.
    """
    if len(samples) != len(settings):
        raise DynheadsError(f"{len(samples)} samples but {len(settings)} ablation settings")
    if len({(s.mode, s.sink_size, s.local_window) for s in settings}) > 1:
        raise DynheadsError("a batch of ablations shares one masking mode and one Eq. 2 sink/local window")
    if rows_together is not None and rows_together < 1:
        raise DynheadsError("rows decode at least one at a time")
    for setting in settings:
        validate(lm, setting)
    stop_ids = lm.stop_token_ids() if stop_at_eos else set()
    sessions = shared_prefills(lm, samples, settings[0], max_new_tokens) if samples else []
    policies = [AblationPolicy(lm, setting, stop_ids) for setting in settings]
    width = rows_together or max(len(sessions), 1)
    for start in range(0, len(sessions), width):
        rows = range(start, min(start + width, len(sessions)))
        decoded_rows = decode([sessions[i] for i in rows], [policies[i] for i in rows], max_new_tokens)
        for i, decoded in zip(rows, decoded_rows, strict=True):
            result = policies[i].result
            result.tokens, result.stop_reason = decoded.tokens, decoded.stop_reason
            result.text = decode_text(lm.tokenizer, decoded.tokens, skip_special_tokens=True)
    return [policy.result for policy in policies]


def shared_prefills(
    lm: LoadedModel, samples: Sequence[DecodeInput], setting: AblationSettings, max_new_tokens: int
) -> list[DecodingSession]:
    """One prefilled session per sample (``prefilled_session``), a prompt shared by several samples prefilled once
    and forked (``DecodingSession.copies``: the same cached states, so each fork decodes as its own prefill)."""
    rows_of: dict[tuple, list[int]] = {}
    for i, sample in enumerate(samples):
        key = (tuple(sample.input_ids), tuple(sorted(int(p) for p in sample.needle_positions or ())))
        rows_of.setdefault(key, []).append(i)
    sessions: list[DecodingSession | None] = [None] * len(samples)
    for rows in rows_of.values():
        session = prefilled_session(lm, samples[rows[0]], setting, max_new_tokens)
        forks = session.copies(len(rows)) if len(rows) > 1 else [session]
        for i, fork in zip(rows, forks, strict=True):
            sessions[i] = fork
    return cast(list[DecodingSession], sessions)


def prefilled_session(
    lm: LoadedModel, sample: DecodeInput, setting: AblationSettings, max_new_tokens: int
) -> DecodingSession:
    """A decoding session of ``sample`` under ``setting``'s score window and masking mode, its prompt prefilled but
    for the last token (the decode loop's first pass feeds that one)."""
    session = DecodingSession(
        lm,
        sample.input_ids,
        sample.needle_positions,
        max_new_tokens=max_new_tokens,
        sink_size=setting.sink_size,
        local_window=setting.local_window,
        capture_means=setting.mode == "mean",
    )
    if len(sample.input_ids) > 1:
        session.forward(len(sample.input_ids) - 1)
    return session


def validate(lm: LoadedModel, settings: AblationSettings) -> None:
    strategy = ABLATION_STRATEGIES.get(settings.strategy)  # an unknown name is the registry's one-line error
    matching = MATCHINGS.get(settings.matching)  # an unknown name is the registry's one-line error
    if strategy.matched and matching.given_count and settings.count is None:
        raise DynheadsError(f"the {settings.strategy} strategy needs a head count (the dynamic run's mean |D_t|)")
    if not matching.given_count and settings.count is not None:
        raise DynheadsError("a head count goes with matching='mean'; per-step matching masks |D_t| heads per step")
    if strategy.needs_static and not settings.static_ranking:
        raise DynheadsError(f"the {settings.strategy} strategy needs a static head list (--static FILE)")
    if strategy.needs_contrast and settings.contrast is None:
        raise DynheadsError(f"the {settings.strategy} strategy needs a second head score to rank by (--contrast copy)")
    if settings.fraction is not None and not settings.fraction > 0:
        raise DynheadsError(f"a dose is a positive fraction of each step's |D_t|, got {settings.fraction}")
    check_heads(list(settings.static_ranking) + list(settings.fixed_heads), lm.num_layers, lm.num_heads)


def _dynamic_heads(row: Row, step: StepResult, predicted: int, settings: AblationSettings) -> list[Head]:
    """D_t as ``(layer, head)`` pairs, in the order progressive ablation removes them (highest first, ties by
    index; ``ScoreSpec.step_heads``)."""
    return settings.score_spec().step_heads(step.stats, row, predicted)


def _dynamic_and_ranking(
    row: Row, step: StepResult, predicted: int, settings: AblationSettings
) -> tuple[list[Head], list[Head]]:
    """D_t (``_dynamic_heads``) and every head of the step ranked for a dose, D_t first (empty without a dose:
    nothing reads it)."""
    if settings.fraction is None:
        return _dynamic_heads(row, step, predicted, settings), []
    return settings.score_spec().step_sets(step.stats, row, predicted)


def contrast_ranking(row: Row, step: StepResult, predicted: int, settings: AblationSettings) -> list[Head]:
    """Every head of the step ranked by the contrast score (its own active set first); empty without one."""
    spec = settings.contrast_spec()
    return [] if spec is None else spec.step_ranking(step.stats, row, predicted)


def heads_to_mask(
    dynamic: Sequence[Head],
    settings: AblationSettings,
    lm: LoadedModel,
    rng: np.random.Generator,
    ranking: Sequence[Head] = (),
    contrast: Sequence[Head] = (),
) -> list[Head]:
    """The heads one step removes under ``settings``, given its D_t (and, for a dose, every head ranked; for the
    contrast arm, every head ranked by the contrast score)."""
    strategy = ABLATION_STRATEGIES.get(settings.strategy)
    count = 0
    if settings.fraction is not None:  # a dose: every strategy removes ceil(f |D_t|) heads (none when D_t is empty)
        count = min(dose_count(settings.fraction, len(dynamic)), lm.num_layers * lm.num_heads)
    elif strategy.matched:  # per-step matching: as many heads as this step's clean pass found dynamic
        count = min(MATCHINGS.get(settings.matching).count(dynamic, settings.count), lm.num_layers * lm.num_heads)
    return strategy.choose(
        MaskInputs(
            dynamic,
            count,
            settings.max_dynamic,
            settings.static_ranking,
            settings.fixed_heads,
            lm.num_layers,
            lm.num_heads,
            rng,
            ranking,
            settings.fraction is not None,
            contrast,
        )
    )


def dose_count(fraction: float, dynamic_size: int) -> int:
    """k_t = ceil(fraction x |D_t|): the heads every arm of a dose masks at a step whose D_t has ``dynamic_size``
    heads (0 when D_t is empty); the product is rounded to 9 places first, so 0.1 x 30 is 3, not 4."""
    return math.ceil(round(fraction * dynamic_size, 9))


def matched_count(dynamic_counts: Sequence[int]) -> int:
    """The paper's matching rule: mask as many heads as the dynamic run's average |D_t| (rounded)."""
    return int(round(float(np.mean(dynamic_counts)))) if len(dynamic_counts) else 0
