"""The one greedy decoding loop: ``decode`` runs B >= 1 rows, each under a ``StepPolicy``; tracing
(``dynheads.engine.tracing``) is its simplest policy.

``DecodingSession`` holds the rows being decoded (``Row``: token buffer, cached length, needle, context end),
their KV cache and the attention probe. A new session has one row; ``forward(n)`` feeds that row's next ``n``
tokens. ``DecodingSession.merge`` joins prefilled one-row sessions into one batch (``dynheads.engine.batching``: their
caches are left-padded into one) whose ``forward_rows`` feeds one token per row. ``checkpoint`` / ``rollback``
forget passes, for every cache layer type including sliding windows (updates replace tensors, never write into
them, except the batch's growing layers, whose next write overwrites what was forgotten).

``decode(sessions, policies, max_new_tokens)``: per row and per step, the policy gives the pass's ``RowEdit``
(heads to remove, keys to hide, heads that stream; ``dynheads.engine.probe``) and, after the pass, an action: ``Emit``
a token, ``Rerun`` the same step under another edit (the two-pass ablation, the oracle KV policies), or ``Stop``.
Step 0 of every session runs alone (the batch-1 reference path: the prompt never sees a pad); the sessions still
running are then merged and decoded as one batch, rows leaving it at their own end. With one session the loop
never merges, so batch 1 is exactly the one-row path. Tracing (``tracing.TracePolicy``), the per-step ablation
(``ablation.cascade``), KV retention (``kv.retention``) and the RAG answerer (``dynheads.rag.loop``) are
policies of this loop.

Batched rows equal their batch-1 runs up to fp32 summation order (batched matrix products, zero-probability pad
keys); the tests compare them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, cast

import torch
from transformers import Cache, DynamicCache

from dynheads.engine.batching import dynamic_layer, filled, merge_caches
from dynheads.engine.probe import (
    NO_EDIT,
    STEP_STATS,
    AblationMode,
    AttentionProbe,
    Measure,
    PassSpec,
    RowEdit,
    StepStats,
    attached,
    routed,
)
from dynheads.engine.readout import HeadReadout
from dynheads.engine.teacher import TeacherLogits, teacher_pass
from dynheads.errors import DynheadsError
from dynheads.models import LoadedModel, with_cache
from dynheads.scores import LOCAL_WINDOW, SINK_SIZE, copy_scores
from dynheads.thresholds import chance_share


class DecodeInput(Protocol):
    """What decoding needs from a task sample (every task's samples provide it; read only)."""

    @property
    def input_ids(self) -> Sequence[int]: ...
    @property
    def needle_positions(self) -> Sequence[int]: ...


@dataclass
class StepResult:
    """One forward pass of one row, reduced to what the analyses keep."""

    logits: torch.Tensor  # [V] float32
    measured: StepStats | None  # None: the session runs the model's own attention (``probed=False``)
    hidden: torch.Tensor  # [D] float32, final hidden state at the row's last input position

    @property
    def stats(self) -> StepStats:
        """The probe's measurements of this pass."""
        if self.measured is None:
            raise DynheadsError("this session runs the model's own attention (probed=False): no head is measured")
        return self.measured


def probe_for(lm: LoadedModel) -> AttentionProbe:
    """A probe for ``lm``'s heads, with its readout (the write score's)."""
    return AttentionProbe(lm.num_layers, lm.num_heads, lm.device, HeadReadout(lm.model, lm.num_layers, lm.num_heads))


class Row:
    """One sequence being decoded: its tokens, how many are cached, its needle and where its context ends."""

    def __init__(
        self,
        input_ids: Sequence[int],
        needle_positions: Iterable[int],
        capacity: int,
        device: torch.device,
        *,
        sink_size: int,
        local_window: int,
    ):
        self.prompt_length = len(input_ids)
        self.ids = torch.zeros(capacity, dtype=torch.long, device=device)
        self.ids[: self.prompt_length] = torch.as_tensor(input_ids, dtype=torch.long)
        self.length = 0  # tokens already in the cache
        self.written = self.prompt_length  # tokens in ``ids``: those after ``length`` are fed next
        self.needle = sorted({int(p) for p in needle_positions})
        self.context_end = self.prompt_length  # positions before it are the context (the probe's context mass)
        self.head_means: torch.Tensor | None = None  # [L, H, D] mean head outputs over the prefill (mean ablation)
        self.sink_size, self.local_window = sink_size, local_window
        size = max(self.needle, default=-1) + 1
        self._needle_mask = torch.zeros(max(size, 1), dtype=torch.bool, device=device)
        self._needle_mask[self.needle] = True

    def append(self, token: int) -> None:
        """Write ``token`` after the cached tokens (the next pass feeds it)."""
        self.ids[self.length] = token
        self.written = self.length + 1

    def write(self, tokens: Sequence[int]) -> None:
        """Write ``tokens`` after the cached tokens (the next ``forward(len(tokens))`` feeds them)."""
        self.ids[self.length : self.length + len(tokens)] = torch.as_tensor(list(tokens), dtype=torch.long)
        self.written = self.length + len(tokens)

    def is_needle(self, positions: torch.Tensor) -> torch.Tensor:
        size = self._needle_mask.shape[0]
        return self._needle_mask[positions.clamp(0, size - 1)] & (positions >= 0) & (positions < size)

    def copy_scores(self, stats: StepStats, predicted: int) -> torch.Tensor:
        """Eq. 1 ``[L, H]``: the argmax key is a needle token and carries the predicted token."""
        return copy_scores(stats, self, predicted)

    def chance_share(self) -> float:
        """Eq. 2 score of a head attending uniformly, at the last position fed."""
        return chance_share(self.needle, self.length - 1, self.sink_size, self.local_window)


Checkpoint = tuple[list[tuple[int, int]], int, list[dict]]  # (length, written) per row, batch width, cache layers
KVStates = list[tuple[torch.Tensor, torch.Tensor]]  # per cache layer: one token's key and value [H_kv, D]


class DecodingSession:
    """Rows decoded together: their cache, the probe over them and, once merged, the padding mask."""

    def __init__(
        self,
        lm: LoadedModel,
        input_ids: Sequence[int],
        needle_positions: Iterable[int] = (),
        *,
        max_new_tokens: int,
        sink_size: int = SINK_SIZE,
        local_window: int = LOCAL_WINDOW,
        context_end: int | None = None,
        capture_means: bool = False,
        cache: Cache | None = None,
        probed: bool = True,
        text_positions: bool = False,
    ):
        """``capture_means``: a prefill (a pass of several tokens from an empty cache) also measures each head's
        mean output over the prefilled positions (``Row.head_means``: what mean ablation puts in its place).

        Options for decoding under another cache or attention: ``cache`` (default: a ``DynamicCache``; e.g.
        ``kv.cache.HeadwiseCache``, or one a kvpress press prunes), ``probed=False`` runs the model's own attention
        implementation (no head measured; ``StepResult.stats`` refuses), ``text_positions`` gives every token its
        position in the text (a pruned cache is shorter than the text, so the model would count from its length).
        A batch of such sessions is not built: one-row sessions only."""
        check_fits(lm, len(input_ids), max_new_tokens)
        check_token_ids(lm, input_ids)
        self.lm = lm
        row = Row(
            input_ids,
            needle_positions,
            len(input_ids) + max_new_tokens + 1,
            lm.device,
            sink_size=sink_size,
            local_window=local_window,
        )
        if context_end is not None:
            if not 0 < context_end <= row.prompt_length:
                raise DynheadsError(f"context_end {context_end} must lie in 1..{row.prompt_length} (the prompt)")
            row.context_end = context_end
        self.cache: Cache = DynamicCache(config=lm.model.config) if cache is None else cache
        self.probed, self.text_positions = probed, text_positions
        self.mask: torch.Tensor | None = None  # batches: [B, capacity] 1 for real keys (pads are 0)
        self.width = 0  # batches: padded key slots in use
        self.probe = probe_for(lm)
        self.capture_means = capture_means
        # What every pass hands the probe about the rows (``_set_rows``); each pass adds its own positions, measure
        # and edits.
        self.spec = PassSpec((), (), (), sink_size=sink_size, local_window=local_window)
        self._set_rows([row])

    @classmethod
    def merge(cls, sessions: Sequence[DecodingSession], max_new_tokens: int) -> DecodingSession:
        """One batch of the rows of prefilled one-row sessions, with room for ``max_new_tokens`` more tokens.

        The sessions' caches are copied into the batch and emptied; ``rollback`` to a checkpoint taken before
        the merge makes a session usable again (its rows are shared with the batch).
        """
        if any(len(s.rows) != 1 or s.mask is not None for s in sessions):
            raise DynheadsError("only one-row sessions merge into a batch")
        if any(not s.probed or s.text_positions or type(s.cache) is not DynamicCache for s in sessions):
            raise DynheadsError("sessions with their own cache or attention decode one at a time")
        first = sessions[0]
        batch = cls.__new__(cls)
        batch.lm = first.lm
        batch.probed, batch.text_positions = True, False
        padded = max(s.row.length for s in sessions)
        batch.cache = merge_caches(first.lm, [cast(DynamicCache, s.cache) for s in sessions], padded, max_new_tokens)
        batch.mask = torch.zeros(len(sessions), padded + max_new_tokens, dtype=torch.long, device=first.lm.device)
        for b, session in enumerate(sessions):  # row b's first (padded - length_b) keys are pads
            batch.mask[b, padded - session.row.length : padded] = 1
        batch.width = padded
        batch.probe = probe_for(first.lm)
        batch.capture_means, batch.spec = False, first.spec
        batch._set_rows([s.row for s in sessions])
        return batch

    def _set_rows(self, rows: list[Row]) -> None:
        self.rows = rows
        means = [row.head_means for row in rows if row.head_means is not None]
        self.spec = replace(
            self.spec,
            needles=tuple(tuple(row.needle) for row in rows),
            context_ends=tuple(row.context_end for row in rows),
            head_means=torch.stack(means) if len(means) == len(rows) else None,
        )

    def copies(self, count: int, caches: Sequence[Cache] | None = None) -> list[DecodingSession]:
        """``count`` one-row sessions at this one-row session's state: its tokens, needle, settings and cache (the
        cached tensors are shared: updates replace them, never write into them). Prefill once, fork the rows.
        ``caches``: one per copy, the cache that copy decodes under instead (e.g. what a kvpress press pruned of this
        session's prefill; ``kv.press_runs.press_generate_all``)."""
        if type(self.cache) is not DynamicCache:
            raise DynheadsError("a session with its own cache does not fork")
        if caches is not None and len(caches) != count:
            raise DynheadsError(f"{count} copies need {count} caches, got {len(caches)}")
        row, copies = self.row, []
        for index in range(count):
            copy = DecodingSession.__new__(DecodingSession)
            copy.lm, copy.mask, copy.width = self.lm, None, 0
            copy.probed, copy.text_positions = self.probed, self.text_positions
            if caches is not None:
                copy.cache = caches[index]
            else:
                copy.cache = DynamicCache(config=self.lm.model.config)
                for mine, theirs in zip(copy.cache.layers, self.cache.layers, strict=True):
                    mine.__dict__.update(vars(theirs))
            copy.probe = probe_for(self.lm)
            copy.capture_means, copy.spec = False, self.spec
            twin = Row.__new__(Row)
            twin.__dict__.update(vars(row))
            twin.ids = row.ids.clone()
            copy._set_rows([twin])
            copies.append(copy)
        return copies

    # ---- the one row of an unmerged session (what batch-1 callers use) --------------------------------
    @property
    def row(self) -> Row:
        if len(self.rows) != 1:
            raise DynheadsError(f"this session decodes {len(self.rows)} rows, not one")
        return self.rows[0]

    ids = property(lambda self: self.row.ids)
    length = property(lambda self: self.row.length)
    written = property(lambda self: self.row.written)
    prompt_length = property(lambda self: self.row.prompt_length)

    def append(self, token: int) -> None:
        self.row.append(token)

    def write(self, tokens: Sequence[int]) -> None:
        self.row.write(tokens)

    def copy_scores(self, stats: StepStats, predicted: int) -> torch.Tensor:
        return self.row.copy_scores(stats, predicted)

    # ---- passes ---------------------------------------------------------------------------------------
    def forward(
        self, num_tokens: int | None = None, measure: Measure = STEP_STATS, edits: Sequence[RowEdit] | None = None
    ) -> StepResult:
        """Feed the one row's next ``num_tokens`` written tokens (default: all not yet cached); the pass measures
        the step statistics and what ``measure`` adds, under ``edits`` (one per row, or one for every row; None:
        the edits in force, those of the last pass that gave some, or set on the probe with ``set_edits``)."""
        row = self.row
        if self.mask is not None:
            return self.forward_rows(measure, edits)[0]
        start = row.length
        stop = row.written if num_tokens is None else start + num_tokens
        if stop <= start:
            raise DynheadsError("nothing to decode from: every written token is already in the cache")
        prefill = start == 0 and stop > 1  # measures each head's mean output when the session captures means
        spec = self._pass_spec((stop - 1,), measure, edits, capture_means=self.capture_means and prefill)
        self.probe.begin_pass(spec)
        inputs = {}
        if self.text_positions:
            inputs["position_ids"] = torch.arange(start, stop, device=self.lm.device)[None]
        logits, hidden = self._run(row.ids[start:stop][None], **inputs)
        row.length, row.written = stop, max(row.written, stop)
        if spec.capture_means:
            row.head_means = self.probe.captured_head_means()[0]
            self._set_rows([row])
        measured = self.probe.pass_stats()[0] if self.probed else None
        return StepResult(logits=logits[0], measured=measured, hidden=hidden[0])

    def forward_rows(self, measure: Measure = STEP_STATS, edits: Sequence[RowEdit] | None = None) -> list[StepResult]:
        """Feed one written token per row; one ``StepResult`` per row, each measuring what ``measure`` adds, under
        ``edits`` (``forward``'s)."""
        if self.mask is None:
            return [self.forward(1, measure, edits)]
        if measure.span is not None:
            raise DynheadsError("a span score is measured at batch 1")
        positions = tuple(row.length for row in self.rows)
        tokens = torch.stack([row.ids[row.length] for row in self.rows])[:, None]  # [B, 1]
        self.mask[:, self.width] = 1
        self.width += 1
        self.probe.begin_pass(self._pass_spec(positions, measure, edits))
        logits, hidden = self._run(
            tokens,
            attention_mask=self.mask[:, : self.width],
            position_ids=torch.tensor(positions, device=self.lm.device)[:, None],
        )
        for row in self.rows:
            row.length += 1
            row.written = max(row.written, row.length)
        return [
            StepResult(logits=logits[b], measured=stats, hidden=hidden[b])
            for b, stats in enumerate(self.probe.pass_stats())
        ]

    def _pass_spec(
        self,
        last_positions: tuple[int, ...],
        measure: Measure,
        edits: Sequence[RowEdit] | None,
        capture_means: bool = False,
    ) -> PassSpec:
        """The probe's spec of the next pass: the rows' (``spec``) with this pass's positions, measure and edits."""
        return replace(
            self.spec,
            last_positions=last_positions,
            measure=measure,
            edits=None if edits is None else tuple(edits),
            capture_means=capture_means,
        )

    def _run(self, input_ids: torch.Tensor, **inputs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass through the model (the probe attached unless ``probed`` is off): last-position logits and final
        hidden states."""
        logits, hidden = self._model_pass(input_ids, cached=True, **inputs)
        assert hidden is not None  # the hook on the base model fires on every pass with the cache
        return logits[:, -1].float(), hidden

    def teacher_forced(
        self, inputs: Sequence[int], targets: Sequence[int], removed: torch.Tensor, mode: AblationMode
    ) -> TeacherLogits:
        """Every step of a teacher-forced answer in one pass per group of rows (``engine.teacher``): step t feeds
        ``inputs[t]`` at position ``prompt_length - 1 + t`` and sees this one-row session's cache (the prompt and
        the clean answer) before it and its own states; ``removed`` (bool ``[R, T, L, H]``) at that step only."""
        row = self.row
        clean = [(filled(layer.keys), filled(layer.values)) for layer in map(dynamic_layer, self.cache.layers)]
        first = row.prompt_length - 1
        return teacher_pass(self.lm, inputs, targets, clean, first, removed, mode, row.head_means, self._run_all)

    def _run_all(self, input_ids: torch.Tensor, position_ids: torch.Tensor, **inputs: Any) -> torch.Tensor:
        """One pass without the cache or the probe: the logits of every position."""
        return self._model_pass(input_ids, cached=False, position_ids=position_ids, **inputs)[0]

    def _model_pass(
        self, input_ids: torch.Tensor, *, cached: bool, **inputs: Any
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The one call of the model: with the session's cache and probe (the last position's logits, and the final
        hidden state of the last position), or without either (every position's logits; no hidden state)."""
        captured = {}

        def capture(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
            last_hidden = output[0] if isinstance(output, tuple) else output.last_hidden_state
            captured["hidden"] = last_hidden[:, -1].float()

        model = self.lm.model
        hook = model.base_model.register_forward_hook(capture) if cached else None
        cache = with_cache(model, self.cache) if cached else {}
        try:
            with self._attention() if cached else nullcontext({}) as probe_kwargs, torch.inference_mode():
                out = model(
                    input_ids=input_ids,
                    **cache,
                    use_cache=cached,
                    logits_to_keep=1 if cached else 0,
                    **inputs,
                    **probe_kwargs,
                )
        finally:
            if hook is not None:
                hook.remove()
        if cached and self.probed and self.probe.reached_layers == 0:
            raise DynheadsError(unprobed_model(model))
        return out.logits, captured.get("hidden")

    def _attention(self) -> AbstractContextManager[dict]:
        return attached(self.lm.model, self.probe) if self.probed else nullcontext({})

    def checkpoint(self) -> Checkpoint:
        """The state now; cheap, because cache updates replace tensors instead of writing into them."""
        return (
            [(row.length, row.written) for row in self.rows],
            self.width,
            [dict(vars(layer)) for layer in self.cache.layers],
        )

    def rollback(self, checkpoint: Checkpoint) -> None:
        """Forget every token fed since ``checkpoint`` (no row may have left the batch since)."""
        lengths, self.width, layers = checkpoint
        for row, (length, written) in zip(self.rows, lengths, strict=True):
            row.length, row.written = length, written
        if self.mask is not None:
            self.mask[:, self.width :] = 0
        del self.cache.layers[len(layers) :]
        for layer, saved in zip(self.cache.layers, layers, strict=True):
            layer.__dict__.clear()
            layer.__dict__.update(saved)  # growing layers: the old view; the next pass overwrites the slot

    def last_states(self, b: int) -> KVStates:
        """Row ``b``'s key and value states of the last token fed, per cache layer (clones)."""
        layers = [dynamic_layer(layer) for layer in self.cache.layers]
        return [(filled(layer.keys)[b, :, -1].clone(), filled(layer.values)[b, :, -1].clone()) for layer in layers]

    def write_last(self, b: int, states: KVStates) -> None:
        """Replace row ``b``'s key and value states of the last token fed (``last_states`` of another pass)."""
        with torch.inference_mode():  # the cache holds inference tensors
            for layer, (key, value) in zip(self.cache.layers, states, strict=True):
                kv = dynamic_layer(layer)
                filled(kv.keys)[b, :, -1] = key
                filled(kv.values)[b, :, -1] = value

    def keep(self, rows: Sequence[int]) -> None:
        """Keep only these rows of the batch (the others finished)."""
        if list(rows) == list(range(len(self.rows))):
            return
        if self.mask is None:
            raise DynheadsError("a one-row session has no rows to drop")
        index = torch.as_tensor(list(rows), dtype=torch.long, device=self.lm.device)
        self.cache.batch_select_indices(index)
        self.mask = self.mask[index]
        self._set_rows([self.rows[r] for r in rows])


@dataclass(frozen=True)
class Emit:
    """Emit ``token``; with ``stop_reason`` the row then ends (no pass reads the token)."""

    token: int
    stop_reason: str | None = None


@dataclass(frozen=True)
class Rerun:
    """Recompute this step's pass under ``edit`` (the policy must be ``rerunnable``)."""

    edit: RowEdit


@dataclass(frozen=True)
class Stop:
    """End the row without emitting a token."""

    reason: str


Action = Emit | Rerun | Stop


class StepPolicy:
    """What one row does at each step: the edit of its pass, and the action after it. The default: greedy."""

    rerunnable = False  # keeps a checkpoint before each pass so that ``after`` may answer ``Rerun``

    def edit(self, index: int) -> RowEdit:
        return NO_EDIT

    def measure(self, index: int) -> Measure:
        """What step ``index``'s pass measures beyond the step statistics (the rows of one batch agree)."""
        return STEP_STATS

    def after(self, index: int, row: Row, result: StepResult, rerun: bool) -> Action:
        """The action after step ``index``'s pass (``rerun``: the pass a ``Rerun`` asked for)."""
        return Emit(int(result.logits.argmax()))

    def kept_states(self, index: int) -> KVStates | None:
        """What the row's cache keeps for step ``index``'s token instead of what its pass wrote (a clean pass's
        ``last_states``: an edited step measured on a clean history), or None to keep its own."""
        return None


def greedy(result: StepResult, stop_ids: Collection[int]) -> Emit | Stop:
    """The greedy token of ``result``, or the end of the row at a stop token."""
    token = int(result.logits.argmax())
    return Stop("eos") if token in stop_ids else Emit(token)


class GreedyPolicy(StepPolicy):
    """Greedy decoding to a stop token; ``on_step(result)``, if given, sees every pass first (what a caller keeps
    of a step: its logits, the cache's size after it)."""

    def __init__(self, stop_ids: Collection[int], on_step: Callable[[StepResult], object] | None = None):
        self.stop_ids, self.on_step = stop_ids, on_step

    def after(self, index: int, row: Row, result: StepResult, rerun: bool) -> Action:
        if self.on_step is not None:
            self.on_step(result)
        return greedy(result, self.stop_ids)


@dataclass
class Decoded:
    tokens: list[int] = field(default_factory=list)
    stop_reason: str = "max_new_tokens"


def decode(sessions: Sequence[DecodingSession], policies: Sequence[StepPolicy], max_new_tokens: int) -> list[Decoded]:
    """Decode one-row ``sessions`` (each fed, at step 0, every written token not yet cached) under their
    ``policies``, up to ``max_new_tokens`` steps each; ``result[i]`` is session i's."""
    if len(sessions) != len(policies):
        raise DynheadsError(f"{len(sessions)} sessions but {len(policies)} policies")
    if max_new_tokens < 1:
        raise DynheadsError("max_new_tokens must be at least 1")
    probed = bool(sessions) and all(session.probed for session in sessions)
    with routed(sessions[0].lm.model) if probed else nullcontext():  # one switch of attention for every pass
        return _decode(sessions, policies, max_new_tokens)


def _decode(sessions: Sequence[DecodingSession], policies: Sequence[StepPolicy], max_new_tokens: int) -> list[Decoded]:
    decoded = [Decoded() for _ in sessions]
    running = []
    for i, (session, policy) in enumerate(zip(sessions, policies, strict=True)):  # step 0 alone
        (action,) = _step(session, [policy], 0, session.forward)
        _keep_states(session, [policy], 0)
        if _apply(action, session.row, decoded[i], 0, max_new_tokens):
            running.append(i)
    if not running:
        return decoded
    batch = (
        sessions[running[0]]
        if len(running) == 1
        else DecodingSession.merge([sessions[i] for i in running], max_new_tokens)
    )
    for index in range(1, max_new_tokens):
        actions = _step(batch, [policies[i] for i in running], index, batch.forward_rows)
        _keep_states(batch, [policies[i] for i in running], index)
        still = [
            r
            for r, action in enumerate(actions)
            if _apply(action, batch.rows[r], decoded[running[r]], index, max_new_tokens)
        ]
        if not still:
            break
        batch.keep(still)
        running = [running[r] for r in still]
    return decoded


def _step(
    session: DecodingSession,
    policies: Sequence[StepPolicy],
    index: int,
    run: Callable[..., StepResult | list[StepResult]],  # the session's forward or forward_rows
) -> list[Action]:
    """One pass of every row under its policy's edit, and again for the rows whose policy asks to rerun."""
    edits = [policy.edit(index) for policy in policies]
    measures = {policy.measure(index) for policy in policies}
    if len(measures) != 1:
        raise DynheadsError("the rows of one batch measure the same attention rows and spans")
    measure = measures.pop()
    checkpoint = session.checkpoint() if any(p.rerunnable for p in policies) else None
    results = _as_list(run(measure=measure, edits=_compact(edits)))
    actions = [
        policy.after(index, row, result, False)
        for policy, row, result in zip(policies, session.rows, results, strict=True)
    ]
    reruns = {r: action for r, action in enumerate(actions) if isinstance(action, Rerun)}
    if not reruns:
        return actions
    if checkpoint is None:
        raise DynheadsError("a step policy asked to rerun a pass but is not rerunnable")
    session.rollback(checkpoint)
    for r, rerun in reruns.items():
        edits[r] = rerun.edit
    # rows that did not ask recompute their pass exactly: they stand
    results = _as_list(run(measure=measure, edits=_compact(edits)))
    for r in reruns:
        actions[r] = policies[r].after(index, session.rows[r], results[r], True)
        if isinstance(actions[r], Rerun):
            raise DynheadsError("a step policy asked to rerun a pass twice")
    return actions


def _keep_states(session: DecodingSession, policies: Sequence[StepPolicy], index: int) -> None:
    """Write the states the policies keep for step ``index``'s token over what the pass wrote."""
    for b, policy in enumerate(policies):
        states = policy.kept_states(index)
        if states is not None:
            session.write_last(b, states)


def _as_list(results: StepResult | list[StepResult]) -> list[StepResult]:
    return results if isinstance(results, list) else [results]


def _compact(edits: list[RowEdit]) -> list[RowEdit]:
    """One edit when every row has the same (the probe then builds one mask for all)."""
    return edits[:1] if all(edit == edits[0] for edit in edits[1:]) else edits


def _apply(action: Action, row: Row, decoded: Decoded, index: int, max_new_tokens: int) -> bool:
    """Record the action of step ``index``; whether the row decodes another step."""
    if isinstance(action, Stop):
        decoded.stop_reason = action.reason
        return False
    assert isinstance(action, Emit)  # _step resolved every Rerun
    decoded.tokens.append(action.token)
    row.append(action.token)
    if action.stop_reason is not None:
        decoded.stop_reason = action.stop_reason
        return False
    return index + 1 < max_new_tokens


def check_token_ids(lm: LoadedModel, input_ids: Sequence[int]) -> None:
    """Refuse a prompt with token ids the model has no embedding for (a sample tokenised for another model):
    torch would stop deep inside the embedding lookup."""
    vocab, ids = lm.vocab_size, torch.as_tensor(input_ids, dtype=torch.long)
    outside = ids[(ids < 0) | (ids >= vocab)] if vocab is not None else ids[ids < 0]
    if outside.numel():
        raise DynheadsError(
            f"the prompt holds token id {int(outside[0])}, outside this model's vocabulary of {vocab} ids "
            f"({outside.numel()} such id(s)): was the sample tokenised for another model?"
        )


def unprobed_model(model: torch.nn.Module) -> str:
    """Why a model whose attention never reached the probe cannot be traced: its layers call transformers' attention
    interface without the forward's keyword arguments (StableLM and Falcon in transformers 5), so the probe, the
    head edits and the hidden keys would silently not apply."""
    return (
        f"{type(model).__name__} does not pass the forward's keyword arguments on to its attention layers, so "
        "dynheads cannot measure or edit its heads (it needs models whose layers forward them to transformers' "
        "attention interface, as Llama, Qwen, Mistral, Phi-3 and Gemma do: docs/tracing.md#choices-and-gotchas)"
    )


def check_fits(lm: LoadedModel, prompt_length: int, max_new_tokens: int) -> None:
    window = lm.max_context
    if window is not None and prompt_length + max_new_tokens > window:
        raise DynheadsError(
            f"prompt of {prompt_length} tokens + {max_new_tokens} new tokens exceeds the model's "
            f"context window of {window} tokens"
        )
