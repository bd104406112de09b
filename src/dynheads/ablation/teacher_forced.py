"""Teacher-forced single-step ablation (issue 32): at each step of the clean greedy answer, remove heads at that
step only and measure how much the log-probability of the clean token falls and whether the argmax flips.

Unlike the cascade (``ablation.cascade``: the masked token is emitted and later steps see the ablated history),
every measured step here sits on the clean history, so the measure is graded and cannot sit at a floor.

Two phases per sample, one prefill:

1. the clean greedy answer (``decoding.decode``, one row): per step its token and log-probability, D_t (ranked,
   and every head ranked for a dose), and the key / value states its token wrote;
2. every setting (an arm at a dose) at every step of it, each step seeing the clean cache before it and its own
   key and value, with the setting's heads removed at that step only (chosen from phase 1's D_t by
   ``ablation.heads_to_mask``): one pass of all steps per group of settings against the cache phase 1 left
   (``engine.teacher``), so row r at step t equals a from-scratch pass over prompt + clean answer with only the
   last position edited (tests/test_ablation_forced.py checks it for every masking mode, that a batch equals each
   setting alone, and that the one pass equals decoding the settings' rows step by step, which models whose
   attention the one pass does not reproduce (sliding windows, soft-capped logits) still do).

``forced_ablations`` decodes several samples' clean answers as one batch (phase 1), then measures each sample as
above from its clean cache rebuilt in one pass over its answer: equal to one sample at a time up to fp32 rounding.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from dynheads.ablation.cascade import AblationSettings, heads_to_mask, matched_count, prefilled_session, validate
from dynheads.ablation.strategies import MATCHINGS
from dynheads.engine.decoding import (
    Action,
    DecodeInput,
    DecodingSession,
    Emit,
    KVStates,
    Row,
    StepPolicy,
    StepResult,
    decode,
    greedy,
)
from dynheads.engine.probe import AblationMode, Measure, RowEdit
from dynheads.engine.teacher import Unsupported
from dynheads.errors import DynheadsError
from dynheads.heads import Head
from dynheads.models import LoadedModel


@dataclass
class CleanStep:
    """One step of the clean greedy answer."""

    token: int
    logprob: float  # log p(token) under the clean model
    dynamic: list[Head]  # D_t, ranked
    ranking: list[Head]  # every head, D_t first (a dose's order)
    states: KVStates  # what the token wrote into the cache (none kept when the answer decoded in a batch)
    contrast: list[Head] = field(default_factory=list)  # every head by the contrast score, its own set first
    contrast_size: int = 0  # the contrast score's own active set at this step


@dataclass
class ForcedResult:
    """Per setting (row) and step of the clean answer: the masked log-probability of the clean token, whether the
    masked argmax differs from it, and the heads removed."""

    tokens: list[int]
    clean_logprob: list[float]
    dynamic: list[list[Head]]  # D_t of each step, ranked
    contrast_sizes: list[int] = field(default_factory=list)  # the contrast score's active set size per step
    masked_logprob: list[list[float]] = field(default_factory=list)  # [setting][step]
    flipped: list[list[bool]] = field(default_factory=list)
    masked: list[list[list[Head]]] = field(default_factory=list)

    def drop(self, setting: int) -> np.ndarray:
        """Per step: clean minus masked log-probability of the clean token (nats; > 0 when masking hurts)."""
        return np.asarray(self.clean_logprob) - np.asarray(self.masked_logprob[setting])

    @property
    def dynamic_counts(self) -> list[int]:
        """|D_t| of each step."""
        return [len(heads) for heads in self.dynamic]


class _CleanPolicy(StepPolicy):
    """The clean greedy answer, step by step; ``session``: the one-row session it decodes alone, whose states each
    step keeps (None: it decodes in a batch, and keeps none)."""

    def __init__(self, session: DecodingSession | None, settings: AblationSettings, stop_ids: Collection[int]):
        self.session, self.spec, self.stop_ids = session, settings.score_spec(), stop_ids
        self.contrast, self._measure = settings.contrast_spec(), settings.measure()
        self.steps: list[CleanStep] = []

    def measure(self, index: int) -> Measure:
        return self._measure

    def after(self, index: int, row: Row, result: StepResult, rerun: bool) -> Action:
        action = greedy(result, self.stop_ids)
        if isinstance(action, Emit):
            token = action.token
            dynamic, ranking = self.spec.step_sets(result.stats, row, token)
            own, contrast = self.contrast.step_sets(result.stats, row, token) if self.contrast else ([], [])
            self.steps.append(
                CleanStep(
                    token,
                    float(torch.log_softmax(result.logits, -1)[token]),
                    dynamic,
                    ranking,
                    self.session.last_states(0) if self.session is not None else [],
                    contrast,
                    len(own),
                )
            )
        return action


class _ForcedPolicy(StepPolicy):
    """Feeds the clean answer under one setting's per-step edits, keeping the clean cache states."""

    def __init__(self, steps: Sequence[CleanStep], edits: Sequence[RowEdit]):
        self.steps, self.edits = steps, edits
        self.logprob: list[float] = []
        self.flipped: list[bool] = []

    def edit(self, index: int) -> RowEdit:
        return self.edits[index]

    def after(self, index: int, row: Row, result: StepResult, rerun: bool) -> Action:
        token = self.steps[index].token
        self.logprob.append(float(torch.log_softmax(result.logits, -1)[token]))
        self.flipped.append(int(result.logits.argmax()) != token)
        return Emit(token)

    def kept_states(self, index: int) -> KVStates:
        return self.steps[index].states


def forced_ablation(
    lm: LoadedModel,
    sample: DecodeInput,
    settings: Sequence[AblationSettings],
    max_new_tokens: int = 48,
    *,
    stop_at_eos: bool = True,
) -> ForcedResult:
    """The clean greedy answer of ``sample`` and, for each of ``settings`` (rows of one batch; they share the
    masking mode and D_t's score), the teacher-forced single-step ablation at every step of it."""
    first = _checked(lm, settings)
    session = prefilled_session(lm, sample, first, max_new_tokens)  # prefilled once: phase 2 forks this state
    prefix = session.checkpoint()
    clean = _CleanPolicy(session, first, lm.stop_token_ids() if stop_at_eos else set())
    decode([session], [clean], max_new_tokens)
    steps = clean.steps
    try:
        return _measured(lm, session, sample, steps, settings)
    except Unsupported:  # attention the one pass does not reproduce: every step as its own pass
        session.rollback(prefix)
        return _measured(lm, session, sample, steps, settings, step_by_step=True)


def forced_ablations(
    lm: LoadedModel,
    samples: Sequence[DecodeInput],
    settings: Sequence[Sequence[AblationSettings]],
    max_new_tokens: int = 48,
    *,
    stop_at_eos: bool = True,
) -> list[ForcedResult]:
    """``forced_ablation`` of each sample under its settings, the clean answers decoded as one batch (four rows
    share each step's weight reads): equal to ``forced_ablation`` of each alone up to fp32 rounding (exactly for
    one sample). Each sample's clean cache is then its prompt's and its answer's states from one pass over the
    answer (the batch keeps no per-sample cache); models whose attention the one teacher pass does not reproduce
    measure the sample alone."""
    if len(samples) != len(settings):
        raise DynheadsError(f"{len(samples)} samples but {len(settings)} lists of settings")
    if len(samples) == 1:
        return [forced_ablation(lm, samples[0], settings[0], max_new_tokens, stop_at_eos=stop_at_eos)]
    stop_ids = lm.stop_token_ids() if stop_at_eos else set()
    sessions, prefixes, cleans = [], [], []
    for sample, rows in zip(samples, settings, strict=True):
        first = _checked(lm, rows)
        sessions.append(prefilled_session(lm, sample, first, max_new_tokens))
        prefixes.append(sessions[-1].checkpoint())
        cleans.append(_CleanPolicy(None, first, stop_ids))
    decode(sessions, cleans, max_new_tokens)
    results = []
    for sample, rows, session, prefix, clean in zip(samples, settings, sessions, prefixes, cleans, strict=True):
        session.rollback(prefix)  # the batch took the cache; the prompt's is back
        if clean.steps:  # the clean cache: the last prompt token and the answer but its last token, in one pass
            session.write([sample.input_ids[-1], *[step.token for step in clean.steps[:-1]]])
            session.forward()
        try:
            results.append(_measured(lm, session, sample, clean.steps, rows))
        except Unsupported:
            results.append(forced_ablation(lm, sample, rows, max_new_tokens, stop_at_eos=stop_at_eos))
    return results


def _checked(lm: LoadedModel, settings: Sequence[AblationSettings]) -> AblationSettings:
    """The first of ``settings``, once they are checked to be one teacher-forced ablation's rows."""
    if not settings:
        raise DynheadsError("give at least one ablation setting")
    if len({(s.mode, s.score_spec(), s.contrast_spec()) for s in settings}) > 1:
        raise DynheadsError(
            "the settings of one teacher-forced ablation share one masking mode, one score and one contrast score"
        )
    for setting in settings:
        validate(lm, _with_answer_mean(setting, [0]))
    return settings[0]


def _with_answer_mean(settings: AblationSettings, dynamic_counts: Sequence[int]) -> AblationSettings:
    """``settings``, a mean-matched control without its count given (``count`` None) reading the clean answer's
    own mean |D_t| (rounded): teacher-forced, every step's D_t is known before any is masked."""
    if settings.count is not None or not MATCHINGS.get(settings.matching).given_count:
        return settings
    return replace(settings, count=matched_count(dynamic_counts))


def _measured(
    lm: LoadedModel,
    session: DecodingSession,
    sample: DecodeInput,
    steps: Sequence[CleanStep],
    settings: Sequence[AblationSettings],
    *,
    step_by_step: bool = False,
) -> ForcedResult:
    """Phase 2 of ``forced_ablation``: every setting at every clean step, from ``session`` holding the clean cache
    (``step_by_step``: holding the prompt, every step decoded as its own pass)."""
    result = ForcedResult(
        [s.token for s in steps],
        [s.logprob for s in steps],
        [list(s.dynamic) for s in steps],
        [s.contrast_size for s in steps],
    )
    if not steps:  # the answer ended at once: nothing to measure
        result.masked_logprob, result.flipped = [[] for _ in settings], [[] for _ in settings]
        result.masked = [[] for _ in settings]
        return result
    masked = [_masked_heads(lm, steps, setting) for setting in settings]
    result.masked = masked
    if step_by_step:
        result.masked_logprob, result.flipped = _step_by_step(session, steps, masked, settings)
    else:
        result.masked_logprob, result.flipped = _in_one_pass(lm, session, sample, steps, masked, settings[0].mode)
    return result


def _in_one_pass(
    lm: LoadedModel,
    session: DecodingSession,
    sample: DecodeInput,
    steps: Sequence[CleanStep],
    masked: list[list[list[Head]]],
    mode: AblationMode,
) -> tuple[list[list[float]], list[list[bool]]]:
    """Every setting's masked log-probabilities and flips from one pass per row group (``engine.teacher``), against
    the clean cache the clean answer left in ``session``."""
    removed = torch.zeros(len(masked), len(steps), lm.num_layers, lm.num_heads, dtype=torch.bool)
    for r, per_step in enumerate(masked):
        for t, heads in enumerate(per_step):
            for layer, head in heads:
                removed[r, t, layer, head] = True
    tokens = [step.token for step in steps]
    logits = session.teacher_forced([sample.input_ids[-1], *tokens[:-1]], tokens, removed, mode)
    return logits.logprob.tolist(), logits.flipped.tolist()


def _step_by_step(
    session: DecodingSession,
    steps: Sequence[CleanStep],
    masked: list[list[list[Head]]],
    settings: Sequence[AblationSettings],
) -> tuple[list[list[float]], list[list[bool]]]:
    """The same from the prefilled ``session``: the settings' rows decoded as one batch that feeds the clean
    tokens, each step's cache states replaced by the clean ones."""
    policies = [
        _ForcedPolicy(steps, [RowEdit(removed=frozenset(heads), mode=setting.mode) for heads in per_step])
        for setting, per_step in zip(settings, masked, strict=True)
    ]
    decode(session.copies(len(settings)), policies, len(steps))
    return [policy.logprob for policy in policies], [policy.flipped for policy in policies]


def _masked_heads(lm: LoadedModel, steps: Sequence[CleanStep], settings: AblationSettings) -> list[list[Head]]:
    """The heads each step removes under ``settings`` (a mean-matched control without a count: the clean answer's
    mean |D_t|, ``_with_answer_mean``); random draws seeded per sample (``seed``) and step."""
    settings = _with_answer_mean(settings, [len(step.dynamic) for step in steps])
    return [
        heads_to_mask(
            step.dynamic, settings, lm, np.random.default_rng([settings.seed, index]), step.ranking, step.contrast
        )
        for index, step in enumerate(steps)
    ]
