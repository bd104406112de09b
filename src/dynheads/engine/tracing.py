"""Tracing: greedy decoding (or a teacher-forced response) that records every head's scores at every step.

``trace`` decodes one sample, ``trace_batch`` several as one batch (``result[i]`` equals ``trace`` of sample i up to
fp32 rounding); both take the keyword arguments of ``TraceOptions``. Each row runs the decoding loop
(``dynheads.engine.decoding.decode``) under a ``TracePolicy`` (one fixed edit for every step), whose
``TraceRecorder`` collects the probe's step statistics, every registered head score (``HEAD_SCORES``; those
that read the heads' outputs, the write score, with ``head_outputs=True`` only) and the logits' statistics into a
``Trace``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dynheads.engine.decoding import (
    Action,
    DecodeInput,
    DecodingSession,
    Emit,
    Row,
    StepPolicy,
    StepResult,
    decode,
    greedy,
)
from dynheads.engine.probe import STEP_STATS, AblationMode, Head, Measure, RowEdit
from dynheads.errors import DynheadsError
from dynheads.models import LoadedModel, decode_text
from dynheads.scores import HEAD_SCORES, LOCAL_WINDOW, SINK_SIZE
from dynheads.traces import Trace


def check_needle(sample: DecodeInput) -> None:
    """Refuse a sample whose needle is empty or reaches outside its prompt: Eq. 1 and Eq. 2 would score 0 at every
    step without saying why."""
    length = len(sample.input_ids)
    name = getattr(sample, "sample_id", "the sample")
    if not sample.needle_positions:
        raise DynheadsError(f"{name} has no needle positions: mark the span the heads should retrieve from")
    outside = [int(p) for p in sample.needle_positions if not 0 <= int(p) < length]
    if outside:
        raise DynheadsError(
            f"{name}: needle position {outside[0]} is outside its prompt of {length} tokens (positions 0..{length - 1})"
        )


class TraceRecorder:
    """Collects per-step results into a ``Trace``, with every registered head score (``HEAD_SCORES``) by name;
    a score that reads the heads' outputs (``HeadScore.head_outputs``) only when they are measured."""

    def __init__(self, head_outputs: bool = False) -> None:
        self.steps: list[dict[str, torch.Tensor]] = []
        # (name, HeadScore) of the scores registered when the trace began
        registered = [(name, HEAD_SCORES.get(name)) for name in HEAD_SCORES.names()]
        self.head_scores = [(name, score) for name, score in registered if head_outputs or not score.head_outputs]
        self.scores: dict[str, list[torch.Tensor]] = {name: [] for name, _ in self.head_scores}  # [L, H] per step
        self.tokens: list[int] = []
        self.chance: list[float] = []  # Eq. 2 score of a uniform head at each step

    def add(self, row: Row, result: StepResult, token: int, predicted: int | None = None) -> None:
        """Record a step that emitted ``token``; ``predicted`` (ŷ of Eq. 1) defaults to that token."""
        stats = result.stats
        predicted = token if predicted is None else predicted
        for name, score in self.head_scores:
            self.scores[name].append(score.reduce(stats, row, predicted))
        self.steps.append(
            {
                "argmax_pos": stats.argmax_pos,
                "needle_mass": stats.needle_mass,
                "max_prob": stats.max_prob,
                "context_mass": stats.context_mass,
                "context_entropy": stats.context_entropy,
                "hidden": result.hidden,
                **_logit_stats(result.logits, token),
            }
        )
        self.tokens.append(token)
        self.chance.append(row.chance_share())

    def finish(self, lm: LoadedModel, row: Row, stop_reason: str) -> Trace:
        shape = (len(self.steps), lm.num_layers, lm.num_heads)

        def stack(
            values: list[torch.Tensor], dtype: type[np.generic], empty_shape: tuple[int, ...] = shape
        ) -> np.ndarray:
            return torch.stack(values).cpu().numpy().astype(dtype) if values else np.zeros(empty_shape, dtype=dtype)

        def stacked(name: str, dtype: type[np.generic], empty_shape: tuple[int, ...] = shape) -> np.ndarray:
            return stack([s[name] for s in self.steps], dtype, empty_shape)

        tokenizer = lm.tokenizer
        return Trace(
            tokens=np.asarray(self.tokens, dtype=np.int64),
            token_texts=[decode_text(tokenizer, [t]) for t in self.tokens],
            text=decode_text(tokenizer, self.tokens, skip_special_tokens=True),
            argmax_pos=stacked("argmax_pos", np.int32),
            scores={
                name: stack(self.scores[name], np.bool_ if score.binary else np.float32)
                for name, score in self.head_scores
            },
            needle_mass=stacked("needle_mass", np.float32),
            max_prob=stacked("max_prob", np.float32),
            hidden=stacked("hidden", np.float32, (0, lm.hidden_size)),
            prompt_length=row.prompt_length,
            stop_reason=stop_reason,
            context_mass=stacked("context_mass", np.float32),
            token_entropy=stacked("token_entropy", np.float32, (0,)),
            token_max_prob=stacked("token_max_prob", np.float32, (0,)),
            chance=np.asarray(self.chance, dtype=np.float32),
            context_entropy=stacked("context_entropy", np.float32),
            token_prob=stacked("token_prob", np.float32, (0,)),
            prompt_ids=row.ids[: row.prompt_length].cpu().numpy().astype(np.int64),
        )


def _logit_stats(logits: torch.Tensor, token: int) -> dict[str, torch.Tensor]:
    """Entropy (nats), largest probability and the emitted ``token``'s probability of ``softmax(logits [V])``."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return {
        "token_entropy": -(log_probs.exp() * log_probs).sum(),
        "token_max_prob": log_probs.max().exp(),
        "token_prob": log_probs[token].exp(),
    }


class TracePolicy(StepPolicy):
    """Greedy decoding (or a teacher-forced response) under one fixed edit, recording every emitted step."""

    def __init__(
        self,
        edit: RowEdit,
        stop_ids: Collection[int],
        forced: Sequence[int] | None = None,
        head_outputs: bool = False,
    ):
        self._edit, self.stop_ids, self.forced = edit, stop_ids, forced
        self._measure = Measure(head_outputs=True) if head_outputs else STEP_STATS
        self.recorder = TraceRecorder(head_outputs)

    def edit(self, index: int) -> RowEdit:
        return self._edit

    def measure(self, index: int) -> Measure:
        return self._measure

    def after(self, index: int, row: Row, result: StepResult, rerun: bool) -> Action:
        if self.forced is None:
            action = greedy(result, self.stop_ids)
        else:  # the last forced token ends the row (rows of one batch force responses of their own lengths)
            action = Emit(self.forced[index], stop_reason="forced" if index + 1 == len(self.forced) else None)
        if isinstance(action, Emit):
            self.recorder.add(row, result, action.token)
        return action


@dataclass(frozen=True)
class TraceOptions:
    """The keyword arguments of ``trace`` and ``trace_batch`` with their defaults (``trace`` says what each does):
    how the rows are decoded and scored."""

    sink_size: int = SINK_SIZE
    local_window: int = LOCAL_WINDOW
    removed_heads: Iterable[Head] = ()
    ablation_mode: AblationMode = "zero"
    stop_at_eos: bool = True
    forced_tokens: Sequence[int] | None = None
    context_end: int | None = None
    head_outputs: bool = False


_DEFAULTS = TraceOptions()


def trace(
    lm: LoadedModel,
    sample: DecodeInput,
    max_new_tokens: int = 32,
    *,
    sink_size: int = _DEFAULTS.sink_size,
    local_window: int = _DEFAULTS.local_window,
    removed_heads: Iterable[Head] = _DEFAULTS.removed_heads,
    ablation_mode: AblationMode = _DEFAULTS.ablation_mode,
    stop_at_eos: bool = _DEFAULTS.stop_at_eos,
    forced_tokens: Sequence[int] | None = _DEFAULTS.forced_tokens,
    context_end: int | None = _DEFAULTS.context_end,
    head_outputs: bool = _DEFAULTS.head_outputs,
) -> Trace:
    """Greedy-decode ``sample`` and score every head at every step (Eq. 1 and Eq. 2) plus the hidden state.

    ``removed_heads`` removes a fixed head set from every generation step (the query of each step);
    the prompt itself is encoded by the intact model. ``stop_at_eos=False`` always generates
    ``max_new_tokens`` tokens (benchmarks).

    ``forced_tokens`` teacher-forces a response: step t emits ``forced_tokens[t]`` whatever the model predicts,
    for exactly that many steps (no stop token ends it; ``stop_reason = "forced"``); every statistic of step t
    is that of the pass that predicts it, and Eq. 1's ŷ is the forced token. ``context_end`` moves the end of
    the context the probe's ``context_mass`` / ``context_entropy`` measure (default: the prompt's end).
    ``head_outputs=True`` also measures each head's output at every step and records the scores that read it
    (the write score, ``scores["write"]``); off (the default), the trace has no such score and each step skips
    that work (a gather and a small product per layer, and a readout per step).

    Refused in one line (``DynheadsError``), before any pass: ``lm`` not a ``LoadedModel``, a sample without
    ``input_ids`` and ``needle_positions``, a needle that is empty or outside the prompt, a token id outside the
    model's vocabulary (a sample tokenised for another model), a prompt plus ``max_new_tokens`` longer than the
    model's window, ``max_new_tokens`` below 1, a negative ``sink_size`` / ``local_window``, a removed head the
    model does not have.
    """
    options = TraceOptions(
        sink_size=sink_size,
        local_window=local_window,
        removed_heads=removed_heads,
        ablation_mode=ablation_mode,
        stop_at_eos=stop_at_eos,
        forced_tokens=forced_tokens,
        context_end=context_end,
        head_outputs=head_outputs,
    )
    return _trace_rows(lm, [sample], max_new_tokens, options)[0]


def trace_batch(
    lm: LoadedModel,
    samples: Sequence[DecodeInput],
    max_new_tokens: int = 32,
    *,
    forced_rows: Sequence[Sequence[int]] | None = None,
    context_ends: Sequence[int | None] | None = None,
    **settings: Any,
) -> list[Trace]:
    """``trace`` for several samples decoded as one batch, with ``trace``'s keyword arguments (``TraceOptions``);
    ``result[i]`` equals ``trace(lm, samples[i], ...)`` up to fp32 rounding (one sample runs the batch-1 path
    itself). Per row: ``forced_rows[i]`` teacher-forces sample i's own response (``forced_tokens`` forces one
    response on every row) and ``context_ends[i]`` is its ``context_end``."""
    return _trace_rows(lm, samples, max_new_tokens, TraceOptions(**settings), forced_rows, context_ends)


def _trace_rows(
    lm: LoadedModel,
    samples: Sequence[DecodeInput],
    max_new_tokens: int,
    options: TraceOptions,
    forced_rows: Sequence[Sequence[int]] | None = None,
    context_ends: Sequence[int | None] | None = None,
) -> list[Trace]:
    """The traces of ``samples`` decoded as one batch under ``options`` (``trace_batch``; per row:
    ``forced_rows[i]``, ``context_ends[i]``)."""
    _check_arguments(samples, max_new_tokens, options)
    for sample in samples:
        check_needle(sample)
    if not isinstance(lm, LoadedModel):  # after the samples' own checks, which need no model
        raise DynheadsError(f"trace needs a model from dynheads.load_model(), got {type(lm).__name__}")
    forced = _forced_rows(options.forced_tokens, forced_rows, len(samples))
    ends = list(context_ends) if context_ends is not None else [options.context_end] * len(samples)
    if len(ends) != len(samples):
        raise DynheadsError(f"{len(samples)} samples but {len(ends)} context ends")
    if forced is not None:
        max_new_tokens = max(len(tokens) for tokens in forced)
    stop_ids = lm.stop_token_ids() if options.stop_at_eos and forced is None else ()
    edit = RowEdit(
        removed=frozenset((int(layer), int(head)) for layer, head in options.removed_heads),
        mode=options.ablation_mode,
    )
    sessions = [
        DecodingSession(
            lm,
            sample.input_ids,
            sample.needle_positions,
            max_new_tokens=max_new_tokens if forced is None else len(forced[i]),
            sink_size=options.sink_size,
            local_window=options.local_window,
            context_end=ends[i],
        )
        for i, sample in enumerate(samples)
    ]
    policies = [
        TracePolicy(edit, stop_ids, None if forced is None else forced[i], options.head_outputs)
        for i in range(len(samples))
    ]
    results = decode(sessions, policies, max_new_tokens)
    return [
        policy.recorder.finish(lm, session.rows[0], "forced" if forced is not None else result.stop_reason)
        for policy, session, result in zip(policies, sessions, results, strict=True)
    ]


def _check_arguments(samples: Any, max_new_tokens: Any, options: TraceOptions) -> None:
    """One line for arguments of the wrong kind, before they fail deep inside the decoding loop."""
    if hasattr(samples, "input_ids") or isinstance(samples, str) or not isinstance(samples, Sequence):
        raise DynheadsError(f"trace_batch takes a list of samples, got {type(samples).__name__}")
    for sample in samples:
        if not (hasattr(sample, "input_ids") and hasattr(sample, "needle_positions")):
            raise DynheadsError(
                f"a sample needs input_ids and needle_positions (dynheads.niah.make_sample, "
                f"dynheads.sample_from_text), got {type(sample).__name__}"
            )
    for name, value, least in (
        ("max_new_tokens", max_new_tokens, 1),
        ("sink_size", options.sink_size, 0),
        ("local_window", options.local_window, 0),
    ):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < least:
            raise DynheadsError(f"{name} must be an integer of at least {least}, got {value!r}")


def _forced_rows(
    forced_tokens: Sequence[int] | None, forced_rows: Sequence[Sequence[int]] | None, rows: int
) -> list[list[int]] | None:
    """The tokens each row teacher-forces (None: greedy): one response for every row, or one per row."""
    if forced_tokens is not None and forced_rows is not None:
        raise DynheadsError("give forced_tokens (one response for every row) or forced_rows (one per row), not both")
    if forced_rows is not None and len(forced_rows) != rows:
        raise DynheadsError(f"{rows} samples but {len(forced_rows)} forced responses")
    forced = [forced_tokens] * rows if forced_tokens is not None else forced_rows
    if forced is None:
        return None
    if any(len(tokens) == 0 for tokens in forced):
        raise DynheadsError("forced_tokens is empty: nothing to teacher-force")
    return [[int(t) for t in tokens] for tokens in forced]
