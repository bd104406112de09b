"""The batched KV cache of ``DecodingSession.merge``: B rows decoded together, each as if it were decoded alone.

Scheme (why it is exact): every row is *prefilled alone*, through ``DecodingSession.forward`` - the
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

from collections.abc import Sequence

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from dynheads.errors import DynheadsError
from dynheads.models import LoadedModel


class GrowingLayer(DynamicLayer):
    """A full-attention cache layer that writes each step's keys into a buffer allocated once.

    ``keys`` / ``values`` are views ``[B, H_kv, n, D]`` of the filled part of ``[B, H_kv, capacity, D]``
    buffers, so every reader of a ``DynamicLayer`` sees what it would see; ``update`` costs the new keys only.
    """

    keys: torch.Tensor  # never None: filled on construction
    values: torch.Tensor

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
        layer, singles = dynamic_layer(layer), [dynamic_layer(c.layers[index]) for c in caches]
        length = max(filled(s.keys).shape[-2] for s in singles)
        growing = type(layer) is DynamicLayer
        capacity = length + max_new_tokens if growing else length
        keys = _left_padded([filled(s.keys) for s in singles], length, capacity)
        values = _left_padded([filled(s.values) for s in singles], length, capacity)
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


def dynamic_layer(layer: object) -> DynamicLayer:
    """``layer`` as a ``DynamicLayer`` (keys and values ``[B, H_kv, n, D]``), or a one-line error for other kinds."""
    if not isinstance(layer, DynamicLayer):
        raise DynheadsError(f"this model's cache layout cannot be batched ({type(layer).__name__}); use batch size 1")
    return layer


def filled(states: torch.Tensor | None) -> torch.Tensor:
    if states is None:
        raise DynheadsError("an empty cache cannot be batched: prefill each prompt first")
    return states


def _left_padded(singles: Sequence[torch.Tensor], length: int, capacity: int) -> torch.Tensor:
    """``[B, H_kv, capacity, D]`` zeros with single ``b`` (``[1, H_kv, n_b, D]``) ending at slot ``length``."""
    first = singles[0]
    out = first.new_zeros(len(singles), *first.shape[1:-2], capacity, first.shape[-1])
    for b, single in enumerate(singles):
        out[b, ..., length - single.shape[-2] : length, :] = single[0]
    return out
