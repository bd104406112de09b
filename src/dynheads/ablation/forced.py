"""Teacher-forced single-step ablation (issue 32): at each step of the clean greedy answer, remove heads at that
step only and measure how much the log-probability of the clean token falls and whether the argmax flips.

Unlike the cascade (``ablation.per_step``: the masked token is emitted and later steps see the ablated history),
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
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from dynheads.ablation.per_step import AblationSettings, heads_to_mask, prefilled_session, validate
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
from dynheads.engine.probe import AblationMode, RowEdit
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
    states: KVStates  # what the token wrote into the cache


@dataclass
class ForcedResult:
    """Per setting (row) and step of the clean answer: the masked log-probability of the clean token, whether the
    masked argmax differs from it, and the heads removed."""

    tokens: list[int]
    clean_logprob: list[float]
    dynamic_counts: list[int]
    masked_logprob: list[list[float]] = field(default_factory=list)  # [setting][step]
    flipped: list[list[bool]] = field(default_factory=list)
    masked: list[list[list[Head]]] = field(default_factory=list)

    def drop(self, setting: int) -> np.ndarray:
        """Per step: clean minus masked log-probability of the clean token (nats; > 0 when masking hurts)."""
        return np.asarray(self.clean_logprob) - np.asarray(self.masked_logprob[setting])


class _CleanPolicy(StepPolicy):
    def __init__(self, session: DecodingSession, settings: AblationSettings, stop_ids: Collection[int]):
        self.session, self.spec, self.stop_ids = session, settings.score_spec(), stop_ids
        self.steps: list[CleanStep] = []

    def after(self, index: int, row: Row, result: StepResult, rerun: bool) -> Action:
        action = greedy(result, self.stop_ids)
        if isinstance(action, Emit):
            token = action.token
            self.steps.append(
                CleanStep(
                    token,
                    float(torch.log_softmax(result.logits, -1)[token]),
                    self.spec.step_heads(result.stats, row, token),
                    self.spec.step_ranking(result.stats, row, token),
                    self.session.last_states(0),
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
    if not settings:
        raise DynheadsError("give at least one ablation setting")
    first = settings[0]
    if len({(s.mode, s.score_spec()) for s in settings}) > 1:
        raise DynheadsError("the settings of one teacher-forced ablation share one masking mode and one score")
    for setting in settings:
        validate(lm, setting)
    session = prefilled_session(lm, sample, first, max_new_tokens)  # prefilled once: phase 2 forks this state
    prefix = session.checkpoint()
    clean = _CleanPolicy(session, first, lm.stop_token_ids() if stop_at_eos else set())
    decode([session], [clean], max_new_tokens)
    steps = clean.steps
    result = ForcedResult([s.token for s in steps], [s.logprob for s in steps], [len(s.dynamic) for s in steps])
    if not steps:  # the answer ended at once: nothing to measure
        result.masked_logprob, result.flipped = [[] for _ in settings], [[] for _ in settings]
        result.masked = [[] for _ in settings]
        return result
    masked = [_masked_heads(lm, steps, setting) for setting in settings]
    result.masked = masked
    try:
        result.masked_logprob, result.flipped = _in_one_pass(lm, session, sample, steps, masked, first.mode)
    except Unsupported:  # attention the one pass does not reproduce: every step as its own pass
        session.rollback(prefix)
        result.masked_logprob, result.flipped = _step_by_step(session, steps, masked, settings)
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
    """The heads each step removes under ``settings``; random draws seeded per sample (``seed``) and step."""
    return [
        heads_to_mask(step.dynamic, settings, lm, np.random.default_rng([settings.seed, index]), step.ranking)
        for index, step in enumerate(steps)
    ]
