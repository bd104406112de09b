"""Batched tracing: B samples decoded together, each traced exactly as if it were traced alone.

Scheme (why it is exact): every sample is *prefilled alone*, through ``DecodingSession.forward`` - the
batch-1 reference path itself, so the prompt never sees a pad token, runs through SDPA with a plain causal
mask (FlashAttention-class kernels on GPU, no ``[B, 1, N, N]`` padding mask) and step 0 is bit-identical to
``trace``. The per-sample KV caches are then left-padded with zeros into one batched cache, laid out exactly
as transformers lays out a left-padded batch (full layers: padded length P = longest prompt; sliding-window
layers: their kept suffix, at most window - 1 keys, ``cumulative_length`` = P). Decode steps feed one
token per sequence with a 2-D attention mask that hides the pad keys and per-sequence position ids (each
sequence's own next position), so RoPE, causal and sliding-window masks see what they see alone. The probe
maps key indices to each sequence's absolute positions (pads map below 0 and get probability exactly 0).

Full-attention layers of the batched cache are ``GrowingLayer``s: their keys and values live in a buffer
allocated once for the prompt plus the whole budget, and each step writes its key into the next slot
instead of concatenating (transformers' ``DynamicLayer`` copies the whole cache at every step: at B = 8 and
1k tokens that copy was most of a decode step's CPU time). The model sees the same values either way.

A sequence leaves the batch at its own end (stop token, or the shared budget); the others continue with
the finished rows removed from the cache. What differs from batch 1 is only floating-point summation order
in batched matrix products and over the zero-probability pad keys: scores agree to fp32 rounding.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from dynheads.decoding import DecodingSession, Sample, StepResult, TraceRecorder, check_fits, trace
from dynheads.errors import DynheadsError
from dynheads.models import LoadedModel
from dynheads.probe import AttentionProbe, attached
from dynheads.traces import Trace


class BatchedDecoder:
    """Decode steps for several prefilled ``DecodingSession``s at once (their caches are merged and freed).

    The sessions keep their own token buffers, needle positions (in their probes) and lengths (used for Eq. 1
    and the traces); the decoder owns the batched cache, the padding mask and a probe over the batch, whose
    settings and needles it takes from the sessions' probes.
    """

    def __init__(self, lm: LoadedModel, sessions: Sequence[DecodingSession], *, max_new_tokens: int):
        self.lm = lm
        self.sessions = list(sessions)
        padded = max(s.length for s in self.sessions)
        self.cache = merge_caches(lm, [s.cache for s in self.sessions], padded, max_new_tokens)
        for session in self.sessions:
            session.cache = None  # the batched cache holds the keys now
        # 2-D attention mask over padded key indices: sequence b's first (padded - length_b) keys are pads.
        self.mask = torch.zeros(len(self.sessions), padded + max_new_tokens, dtype=torch.long, device=lm.device)
        for b, session in enumerate(self.sessions):
            self.mask[b, padded - session.length : padded] = 1
        self.width = padded
        self.probe = AttentionProbe(lm.num_layers, lm.num_heads, lm.device)
        self.probe.settings = self.sessions[0].probe.settings  # frozen: sink/local sizes, removed heads, ...
        self._sync_sequences()
        self._hidden: torch.Tensor | None = None

    def keep(self, rows: Sequence[int]) -> None:
        """Keep only these batch rows (the others finished)."""
        if list(rows) == list(range(len(self.sessions))):
            return
        index = torch.as_tensor(list(rows), dtype=torch.long, device=self.lm.device)
        self.cache.batch_select_indices(index)
        self.mask = self.mask[index]
        self.sessions = [self.sessions[r] for r in rows]
        self._sync_sequences()

    def checkpoint(self) -> tuple[int, list[int], list[dict]]:
        """The batch's state before a step: ``rollback`` to it recomputes that step (the two-pass ablation)."""
        return self.width, [s.length for s in self.sessions], [dict(vars(layer)) for layer in self.cache.layers]

    def rollback(self, checkpoint: tuple[int, list[int], list[dict]]) -> None:
        """Forget the steps fed since ``checkpoint`` (no row may have left the batch since)."""
        self.width, lengths, layers = checkpoint
        for session, length in zip(self.sessions, lengths, strict=True):
            session.length = length
        for layer, saved in zip(self.cache.layers, layers, strict=True):
            layer.__dict__.clear()
            layer.__dict__.update(saved)  # growing layers: the old view; the next step overwrites the slot

    def _sync_sequences(self) -> None:
        """The batch probe's needles and context ends: those of the sessions in the batch, row by row."""
        self.probe.set_needles([s.probe.needle_positions() for s in self.sessions])
        self.probe.context_ends = [s.prompt_length for s in self.sessions]

    def step(self) -> list[StepResult]:
        """Feed each session's appended token; one ``StepResult`` per batch row."""
        device = self.lm.device
        tokens = torch.stack([s.ids[s.length] for s in self.sessions])[:, None]  # [B, 1]
        positions = [s.length for s in self.sessions]
        self.mask[:, self.width] = 1
        self.width += 1
        self.probe.begin_forward(positions)
        model = self.lm.model
        hook = model.base_model.register_forward_hook(self._capture_hidden)
        try:
            with attached(model, self.probe) as probe_kwargs, torch.inference_mode():
                out = model(
                    input_ids=tokens,
                    attention_mask=self.mask[:, : self.width],
                    position_ids=torch.tensor(positions, dtype=torch.long, device=device)[:, None],
                    past_key_values=self.cache,
                    use_cache=True,
                    logits_to_keep=1,
                    **probe_kwargs,
                )
        finally:
            hook.remove()
        for session in self.sessions:
            session.length += 1
        logits = out.logits[:, -1].float()
        return [StepResult(logits=logits[b], stats=self.probe.sequence_stats(b), hidden=self._hidden[b])
                for b in range(len(self.sessions))]

    def _capture_hidden(self, module, args, output) -> None:
        last_hidden = output[0] if isinstance(output, tuple) else output.last_hidden_state
        self._hidden = last_hidden[:, -1].float()  # [B, D]


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer that writes each step's keys into a buffer allocated once.

    ``keys`` / ``values`` are views ``[B, H_kv, n, D]`` of the filled part of ``[B, H_kv, capacity, D]``
    buffers, so every reader of a ``DynamicLayer`` sees what it would see; ``update`` costs the new keys only.
    """

    def __init__(self, key_buffer: torch.Tensor, value_buffer: torch.Tensor, length: int):
        super().__init__()
        self._key_buffer, self._value_buffer = key_buffer, value_buffer  # the first ``length`` slots are filled
        self.lazy_initialization(key_buffer, value_buffer)
        self._set_length(length)

    def _set_length(self, length: int) -> None:
        if length > self._key_buffer.shape[-2]:
            raise DynheadsError(f"the batched cache holds {self._key_buffer.shape[-2]} tokens, not {length}")
        self.keys = self._key_buffer[..., :length, :]
        self.values = self._value_buffer[..., :length, :]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        start = self.keys.shape[-2]
        self._set_length(start + key_states.shape[-2])
        self.keys[..., start:, :] = key_states
        self.values[..., start:, :] = value_states
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        length = self.keys.shape[-2]
        self._key_buffer = self._key_buffer[indices]
        self._value_buffer = self._value_buffer[indices]
        self._set_length(length)


def merge_caches(lm: LoadedModel, caches: Sequence[DynamicCache], padded: int, max_new_tokens: int) -> DynamicCache:
    """One left-padded ``[B, H_kv, kv, D]`` cache from batch-1 caches; ``padded``: the longest sequence.

    Full-attention layers become ``GrowingLayer``s with room for ``max_new_tokens`` more keys; sliding-window
    layers stay transformers' own (they keep at most a window). The single caches are emptied layer by layer
    while they are copied (they are not usable afterwards).
    """
    merged = DynamicCache(config=lm.model.config)
    if len(merged.layers) != len(caches[0].layers):
        raise DynheadsError("this model's cache layout cannot be batched; use batch size 1")
    for index, layer in enumerate(merged.layers):
        singles = [c.layers[index] for c in caches]
        length = max(s.keys.shape[-2] for s in singles)
        growing = type(layer) is DynamicLayer
        capacity = length + max_new_tokens if growing else length
        keys = _left_padded([s.keys for s in singles], length, capacity)
        values = _left_padded([s.values for s in singles], length, capacity)
        for single in singles:  # free as we go: peak = the B single caches + one merged layer
            single.keys = single.values = None
        if growing:
            merged.layers[index] = GrowingLayer(keys, values, length)
            continue
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
        if hasattr(layer, "cumulative_length"):  # sliding-window layer: tokens seen, in padded indices
            layer.cumulative_length = padded
    return merged


def _left_padded(singles: Sequence[torch.Tensor], length: int, capacity: int) -> torch.Tensor:
    """``[B, H_kv, capacity, D]`` zeros with single ``b`` (``[1, H_kv, n_b, D]``) ending at slot ``length``."""
    first = singles[0]
    out = first.new_zeros(len(singles), *first.shape[1:-2], capacity, first.shape[-1])
    for b, single in enumerate(singles):
        out[b, ..., length - single.shape[-2] : length, :] = single[0]
    return out


def trace_batch(lm: LoadedModel, samples: Sequence[Sample], max_new_tokens: int = 32, **settings) -> list[Trace]:
    """``trace`` for several samples at once, with ``trace``'s keyword arguments (``sink_size``, ``local_window``,
    ``removed_heads``, ``ablation_mode``, ``stop_at_eos``); ``result[i]`` equals ``trace(lm, samples[i], ...)``.

    One sample runs the batch-1 reference path unchanged.
    """
    if len(samples) == 1:
        return [trace(lm, samples[0], max_new_tokens, **settings)]
    if max_new_tokens < 1:
        raise DynheadsError("max_new_tokens must be at least 1")
    if not samples:
        return []
    bound = inspect.signature(trace).bind(lm, samples[0], max_new_tokens, **settings)  # trace's names and defaults
    bound.apply_defaults()
    sink_size, local_window, ablation_mode = (bound.arguments[name] for name in
                                              ("sink_size", "local_window", "ablation_mode"))
    stop_at_eos = bound.arguments["stop_at_eos"]
    for sample in samples:
        check_fits(lm, len(sample.input_ids), max_new_tokens)
    removed_heads = list(bound.arguments["removed_heads"])
    stop_ids = lm.stop_token_ids() if stop_at_eos else set()
    sessions, results = [], []
    for sample in samples:  # prefill alone: the reference path, no pads in the prompt
        session = DecodingSession(lm, sample.input_ids, sample.needle_positions, max_new_tokens=max_new_tokens,
                                  sink_size=sink_size, local_window=local_window)
        session.probe.set_removed_heads(removed_heads, ablation_mode)
        results.append(session.forward(session.prompt_length))
        sessions.append(session)
    recorders = [TraceRecorder() for _ in samples]
    stop_reasons = ["max_new_tokens"] * len(samples)
    decoder: BatchedDecoder | None = None
    active = list(range(len(samples)))  # sample index of each batch row
    tokens = [int(r.logits.argmax()) for r in results]
    for step in range(max_new_tokens):
        still = []
        for row, index in enumerate(active):
            token = tokens[row]
            if token in stop_ids:
                stop_reasons[index] = "eos"
                continue
            recorders[index].add(sessions[index], results[row], token)
            sessions[index].append(token)
            still.append(row)
        if step + 1 == max_new_tokens or not still:
            break
        if decoder is None:
            decoder = BatchedDecoder(lm, sessions, max_new_tokens=max_new_tokens)
        decoder.keep(still)
        active = [active[row] for row in still]
        results = decoder.step()
        tokens = torch.stack([r.logits for r in results]).argmax(-1).tolist()  # one sync per step
    return [recorder.finish(session, reason)
            for recorder, session, reason in zip(recorders, sessions, stop_reasons, strict=True)]
