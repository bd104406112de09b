"""Greedy decoding with the KV cache and the attention probe attached: ``trace()`` and its building block.

``DecodingSession`` owns one sequence: its cache, the probe (which holds the needle positions) and the token
buffer. Each ``forward`` feeds tokens after what is cached and returns the next-token logits, the probe's
statistics for the last input position and the final-layer hidden state there. ``commit=False`` runs a pass
that leaves the cache exactly as it was (the KV-retention loop's clean full-KV pass), for every cache layer
type including sliding windows, by restoring each layer's tensors afterwards (updates never modify them in
place); ``checkpoint`` / ``rollback`` do the same around any number of passes.

``DecodingSession.steps`` is the one greedy loop (``trace``, the two-pass ablation and the RAG answerer
consume it): each ``DecodeStep`` holds the pass that predicts the step's token; the consumer may recompute
that pass under other probe settings (``rerun``) or emit another token (``step.token = ...``) before the
loop appends it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
from transformers import DynamicCache

from dynheads.errors import DynheadsError
from dynheads.models import LoadedModel
from dynheads.probe import AblationMode, AttentionProbe, Head, StepStats, attached
from dynheads.scores import LOCAL_WINDOW, SINK_SIZE, copy_scores
from dynheads.traces import Trace


class Sample(Protocol):
    """What tracing needs from a task sample (NIAH and HotpotQA samples both provide it)."""

    input_ids: Sequence[int]
    needle_positions: Sequence[int]


@dataclass
class StepResult:
    """One forward pass, reduced to what the analyses keep (all on CPU)."""

    logits: torch.Tensor  # [V] float32
    stats: StepStats
    hidden: torch.Tensor  # [D] float32


class DecodingSession:
    def __init__(
        self,
        lm: LoadedModel,
        input_ids: Sequence[int],
        needle_positions: Iterable[int] = (),
        *,
        max_new_tokens: int,
        sink_size: int = SINK_SIZE,
        local_window: int = LOCAL_WINDOW,
    ):
        self.lm = lm
        self.prompt_length = len(input_ids)
        check_fits(lm, self.prompt_length, max_new_tokens)
        device = lm.device
        self.probe = AttentionProbe(lm.num_layers, lm.num_heads, device)
        self.probe.set_needle(needle_positions)  # the one record of the needle (Eq. 1 and Eq. 2 read it)
        self.probe.sink_size, self.probe.local_window = sink_size, local_window
        self.probe.context_end = self.prompt_length
        capacity = self.prompt_length + max_new_tokens + 1
        self.ids = torch.zeros(capacity, dtype=torch.long, device=device)
        self.ids[: self.prompt_length] = torch.as_tensor(list(input_ids), dtype=torch.long)
        self.length = 0  # tokens already in the cache
        self.written = self.prompt_length  # tokens in ``ids``: those after ``length`` are fed next
        self.cache = DynamicCache(config=lm.model.config)
        self._hidden: torch.Tensor | None = None

    def forward(self, num_tokens: int, *, commit: bool = True) -> StepResult:
        """Run the next ``num_tokens`` tokens of ``self.ids`` (after the cached ones) through the model."""
        start, stop = self.length, self.length + num_tokens
        self.probe.begin_forward(stop - 1)
        stats = self.probe.sequence_stats(0)
        saved = self.checkpoint() if not commit else None
        model = self.lm.model
        hook = model.base_model.register_forward_hook(self._capture_hidden)
        try:
            with attached(model, self.probe) as probe_kwargs, torch.inference_mode():
                out = model(
                    input_ids=self.ids[start:stop][None],
                    past_key_values=self.cache,
                    use_cache=True,
                    logits_to_keep=1,
                    **probe_kwargs,
                )
        finally:
            hook.remove()
        self.length, self.written = stop, max(self.written, stop)
        if saved is not None:
            self.rollback(saved)
        return StepResult(logits=out.logits[0, -1].float(), stats=stats, hidden=self._hidden)

    def checkpoint(self) -> tuple[int, list[dict]]:
        """The cache state now; cheap, because cache updates replace tensors instead of writing into them."""
        return self.length, [dict(vars(layer)) for layer in self.cache.layers]

    def rollback(self, checkpoint: tuple[int, list[dict]]) -> None:
        """Forget every token fed since ``checkpoint``."""
        self.length, layers = checkpoint
        del self.cache.layers[len(layers) :]
        for layer, saved in zip(self.cache.layers, layers, strict=True):
            layer.__dict__.clear()
            layer.__dict__.update(saved)

    def _capture_hidden(self, module, args, output) -> None:
        last_hidden = output[0] if isinstance(output, tuple) else output.last_hidden_state
        self._hidden = last_hidden[0, -1].float()

    def append(self, token: int) -> None:
        """Write ``token`` after the cached tokens (the next ``forward`` feeds it)."""
        self.ids[self.length] = token
        self.written = self.length + 1

    def write(self, tokens: Sequence[int]) -> None:
        """Write ``tokens`` after the cached tokens (the next ``forward(len(tokens))`` feeds them)."""
        self.ids[self.length : self.length + len(tokens)] = torch.as_tensor(list(tokens), dtype=torch.long)
        self.written = self.length + len(tokens)

    def steps(self, max_new_tokens: int, stop_ids: Collection[int] = (), *, rerunnable: bool = False) -> GreedySteps:
        """The greedy loop: see ``GreedySteps``."""
        return GreedySteps(self, max_new_tokens, stop_ids, rerunnable=rerunnable)

    def chance_share(self) -> float:
        """Eq. 2 chance share at the last position fed (also right after batched steps, which bypass the probe)."""
        return self.probe.chance_share(last_position=self.length - 1)

    def copy_scores(self, stats: StepStats, predicted: int) -> torch.Tensor:
        """Eq. 1 ``[L, H]``: the argmax key is a needle token and carries the predicted token."""
        return copy_scores(stats.argmax_pos, self.probe.is_needle(stats.argmax_pos), self.prompt_length, self.ids,
                           predicted)


class DecodeStep:
    """One step of the greedy loop: the pass that predicts the step's token, and the token to emit."""

    def __init__(self, session: DecodingSession, index: int, result: StepResult, fed: int,
                 checkpoint: tuple[int, list[dict]] | None, stop_ids: Collection[int]):
        self.session, self.index, self.result = session, index, result
        self.predicted = int(result.logits.argmax())  # greedy token of ``result``
        self.token = self.predicted  # the token the loop emits; assign to emit another one
        self._fed, self._checkpoint, self._stop_ids = fed, checkpoint, stop_ids

    @property
    def stops(self) -> bool:
        """The token to emit is a stop token: the loop ends without emitting it."""
        return self.token in self._stop_ids

    def rerun(self) -> StepResult:
        """Recompute this step's pass (e.g. under other probe settings) in place of the first one; the greedy
        token of the new pass becomes the token to emit. Needs ``steps(..., rerunnable=True)``."""
        if self._checkpoint is None:
            raise DynheadsError("this decoding loop was not started with rerunnable=True")
        self.session.rollback(self._checkpoint)
        self.result = self.session.forward(self._fed)
        self.token = int(self.result.logits.argmax())
        return self.result


class GreedySteps:
    """Greedy decoding over a ``DecodingSession``: iterate to get one ``DecodeStep`` per new token.

    Step 0 feeds every written token not yet in the cache (the prompt, what is left of it, or what ``write``
    put after the cache), later steps the token emitted before. After the consumer's loop body, a stop token
    ends the loop (``stop_reason = "eos"``, the token is not emitted); otherwise the token is emitted
    (``tokens``) and appended. No pass runs after the last step. ``rerunnable`` keeps a checkpoint of the cache
    before each pass, so that ``DecodeStep.rerun`` can replace it (the old keys then live until the step ends,
    which is why it is not the default).
    """

    def __init__(self, session: DecodingSession, max_new_tokens: int, stop_ids: Collection[int] = (),
                 *, rerunnable: bool = False):
        self.session, self.max_new_tokens, self.stop_ids = session, max_new_tokens, stop_ids
        self.rerunnable = rerunnable
        self.tokens: list[int] = []
        self.stop_reason = "max_new_tokens"

    def __iter__(self) -> Iterator[DecodeStep]:
        session = self.session
        for index in range(self.max_new_tokens):
            fed = session.written - session.length if index == 0 else 1
            if fed < 1:
                raise DynheadsError("nothing to decode from: every written token is already in the cache")
            checkpoint = session.checkpoint() if self.rerunnable else None
            step = DecodeStep(session, index, session.forward(fed), fed, checkpoint, self.stop_ids)
            yield step
            if step.stops:
                self.stop_reason = "eos"
                return
            self.tokens.append(step.token)
            session.append(step.token)


def check_fits(lm: LoadedModel, prompt_length: int, max_new_tokens: int) -> None:
    window = lm.max_context
    if window is not None and prompt_length + max_new_tokens > window:
        raise DynheadsError(
            f"prompt of {prompt_length} tokens + {max_new_tokens} new tokens exceeds the model's "
            f"context window of {window} tokens"
        )


class TraceRecorder:
    """Collects per-step results into a ``Trace``."""

    def __init__(self) -> None:
        self.steps: list[dict[str, torch.Tensor]] = []
        self.tokens: list[int] = []
        self.chance: list[float] = []  # Eq. 2 score of a uniform head at each step

    def add(self, session: DecodingSession, result: StepResult, token: int, predicted: int | None = None) -> None:
        """Record a step that emitted ``token``; ``predicted`` (ŷ of Eq. 1) defaults to that token."""
        stats = result.stats
        predicted = token if predicted is None else predicted
        self.steps.append({
            "argmax_pos": stats.argmax_pos,
            "copy_scores": session.copy_scores(stats, predicted),
            "needle_mass": stats.needle_mass,
            "reasoning_scores": stats.reasoning_scores(),
            "max_prob": stats.max_prob,
            "context_mass": stats.context_mass,
            "context_entropy": stats.context_entropy,
            "hidden": result.hidden,
            **_logit_stats(result.logits, token),
        })
        self.tokens.append(token)
        self.chance.append(session.chance_share())

    def finish(self, session: DecodingSession, stop_reason: str) -> Trace:
        lm = session.lm
        shape = (len(self.steps), lm.num_layers, lm.num_heads)

        def stacked(name: str, dtype, empty_shape=shape) -> np.ndarray:
            if not self.steps:
                return np.zeros(empty_shape, dtype=dtype)
            return torch.stack([s[name] for s in self.steps]).cpu().numpy().astype(dtype)

        tokenizer = lm.tokenizer
        return Trace(
            tokens=np.asarray(self.tokens, dtype=np.int64),
            token_texts=[tokenizer.decode([t]) for t in self.tokens],
            text=tokenizer.decode(self.tokens, skip_special_tokens=True),
            argmax_pos=stacked("argmax_pos", np.int32),
            copy_scores=stacked("copy_scores", np.bool_),
            needle_mass=stacked("needle_mass", np.float32),
            reasoning_scores=stacked("reasoning_scores", np.float32),
            max_prob=stacked("max_prob", np.float32),
            hidden=stacked("hidden", np.float32, (0, lm.hidden_size)),
            prompt_length=session.prompt_length,
            stop_reason=stop_reason,
            context_mass=stacked("context_mass", np.float32),
            token_entropy=stacked("token_entropy", np.float32, (0,)),
            token_max_prob=stacked("token_max_prob", np.float32, (0,)),
            chance=np.asarray(self.chance, dtype=np.float32),
            context_entropy=stacked("context_entropy", np.float32),
            token_prob=stacked("token_prob", np.float32, (0,)),
        )


def _logit_stats(logits: torch.Tensor, token: int) -> dict[str, torch.Tensor]:
    """Entropy (nats), largest probability and the emitted ``token``'s probability of ``softmax(logits [V])``."""
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return {"token_entropy": -(log_probs.exp() * log_probs).sum(), "token_max_prob": log_probs.max().exp(),
            "token_prob": log_probs[token].exp()}


def trace(
    lm: LoadedModel,
    sample: Sample,
    max_new_tokens: int = 32,
    *,
    sink_size: int = SINK_SIZE,
    local_window: int = LOCAL_WINDOW,
    removed_heads: Iterable[Head] = (),
    ablation_mode: AblationMode = "zero",
    stop_at_eos: bool = True,
    forced_tokens: Sequence[int] | None = None,
    context_end: int | None = None,
) -> Trace:
    """Greedy-decode ``sample`` and score every head at every step (Eq. 1 and Eq. 2) plus the hidden state.

    ``removed_heads`` removes a fixed head set from every generation step (the query of each step);
    the prompt itself is encoded by the intact model. ``stop_at_eos=False`` always generates
    ``max_new_tokens`` tokens (benchmarks).

    ``forced_tokens`` teacher-forces a response: step t emits ``forced_tokens[t]`` whatever the model predicts,
    for exactly that many steps (no stop token ends it; ``stop_reason = "forced"``); every statistic of step t
    is that of the pass that predicts it, and Eq. 1's ŷ is the forced token. ``context_end`` moves the end of
    the context the probe's ``context_mass`` / ``context_entropy`` measure (default: the prompt's end).
    """
    if forced_tokens is not None:
        forced = [int(t) for t in forced_tokens]
        if not forced:
            raise DynheadsError("forced_tokens is empty: nothing to teacher-force")
        max_new_tokens, stop_at_eos = len(forced), False
    if max_new_tokens < 1:
        raise DynheadsError("max_new_tokens must be at least 1")
    session = DecodingSession(
        lm, sample.input_ids, sample.needle_positions,
        max_new_tokens=max_new_tokens, sink_size=sink_size, local_window=local_window,
    )
    session.probe.set_removed_heads(removed_heads, ablation_mode)
    if context_end is not None:
        if not 0 < context_end <= session.prompt_length:
            raise DynheadsError(f"context_end {context_end} must lie in 1..{session.prompt_length} (the prompt)")
        session.probe.context_end = context_end
    recorder = TraceRecorder()
    steps = session.steps(max_new_tokens, lm.stop_token_ids() if stop_at_eos else ())
    for step in steps:
        if forced_tokens is not None:
            step.token = forced[step.index]
        if not step.stops:
            recorder.add(session, step.result, step.token)
    return recorder.finish(session, "forced" if forced_tokens is not None else steps.stop_reason)
