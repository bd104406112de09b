"""A real per-head KV cache: a streaming KV head stores only its sinks and recent window, a whole KV head stores
every token, so the memory of the streaming heads is really freed (``kv.retention`` only simulates it with masks).

``HeadwiseCache`` is a transformers ``Cache`` whose layers (``HeadwiseLayer``) split the KV heads of a layer in
two tensors: ``[B, n_whole, T, D]`` for the whole heads, and ``sink`` + ``recent - 1`` tokens ``[B, n_stream, ., D]``
for the streaming heads (with the decoded token, a streaming head attends to ``sink + recent`` keys, exactly the
keys a ``RowEdit`` with ``full_kv`` leaves visible). The attention function ``headwise_attention`` (registered
as ``HEADWISE``) runs each group of query heads on its own keys: matmul in the model dtype and an fp32 softmax over
the last query row, the arithmetic of the probe's decode step, so greedy decoding equals ``kv_generate``'s
``static`` policy (``tests/test_kv_cache.py``).

Scope: one sequence (batch 1); the prompt is prefilled in one pass with full attention (as ``kv.retention`` does)
and compressed as it is stored; decoder-only models with plain causal attention (no sliding-window layers and no
soft-capped logits). The head split is fixed for the cache's life: static policies. ``headwise_generate`` decodes
with it through the one decoding loop (a ``DecodingSession`` with this cache and the model's own attention,
``probed=False``) and reports the bytes the cache holds.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import cast

import torch
from transformers import AttentionInterface
from transformers.cache_utils import Cache, CacheLayerMixin
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from dynheads.engine.decoding import DecodingSession, GreedyPolicy, decode
from dynheads.errors import DynheadsError
from dynheads.models import LoadedModel

HEADWISE = "dynheads_headwise"


class HeadwiseLayer(CacheLayerMixin):
    """One layer's cache: the whole KV heads ``whole`` keep every token, the others ``sink`` + ``recent - 1``."""

    is_sliding = False
    keys: torch.Tensor  # the whole heads' keys and values (set by the first update)
    values: torch.Tensor

    def __init__(self, whole: Sequence[int], num_kv: int, sink: int, recent: int):
        super().__init__()
        self.whole = sorted(set(whole))
        self.streaming = [h for h in range(num_kv) if h not in set(self.whole)]
        self.sink, self.recent = sink, recent
        self.seen = 0  # tokens fed so far
        # the prefill pass's full keys, for its own attention only; a decode step's window of the streaming heads
        self.pass_keys: torch.Tensor | None = None
        self.pass_values: torch.Tensor | None = None
        self.window_keys: torch.Tensor | None = None
        self.window_values: torch.Tensor | None = None

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        whole = torch.as_tensor(self.whole, dtype=torch.long, device=self.device)
        streaming = torch.as_tensor(self.streaming, dtype=torch.long, device=self.device)
        self.whole_index, self.streaming_index = whole, streaming
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """Store the new tokens (streaming heads: trimmed to their window); return the layer itself as the "keys"
        and "values", which ``headwise_attention`` reads."""
        q_len = key_states.shape[-2]
        if key_states.shape[0] != 1:
            raise DynheadsError("the per-head KV cache holds one sequence (batch size 1)")
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            if q_len > 1:  # the prefill attends in full once; only the kept part is stored
                self.pass_keys, self.pass_values = key_states, value_states
            self.keys = key_states[:, self.whole_index]
            self.values = value_states[:, self.whole_index]
            stream_k, stream_v = key_states[:, self.streaming_index], value_states[:, self.streaming_index]
            self.sink_keys = stream_k[..., : self.sink, :].clone()
            self.sink_values = stream_v[..., : self.sink, :].clone()
            self.recent_keys, self.recent_values = stream_k[..., self.sink :, :], stream_v[..., self.sink :, :]
            if q_len == 1:  # a one-token prefill is a decode step: its window is that token
                self.window_keys, self.window_values = stream_k, stream_v
        elif q_len > 1:
            raise DynheadsError("the per-head KV cache prefills in one pass: feed later tokens one at a time")
        else:
            self.keys = torch.cat([self.keys, key_states[:, self.whole_index]], dim=-2)
            self.values = torch.cat([self.values, value_states[:, self.whole_index]], dim=-2)
            self.recent_keys = torch.cat([self.recent_keys, key_states[:, self.streaming_index]], dim=-2)
            self.recent_values = torch.cat([self.recent_values, value_states[:, self.streaming_index]], dim=-2)
            self.window_keys = torch.cat([self.sink_keys, self.recent_keys[..., -self.recent :, :]], dim=-2)
            self.window_values = torch.cat([self.sink_values, self.recent_values[..., -self.recent :, :]], dim=-2)
        self.seen += q_len
        # Between steps a streaming head keeps recent - 1 tokens: with the next token they make its window. Slices
        # are cloned, never viewed: a view would keep the whole prompt's storage alive.
        drop = max(0, self.recent_keys.shape[-2] - (self.recent - 1))
        self.recent_keys = self.recent_keys[..., drop:, :].clone()
        self.recent_values = self.recent_values[..., drop:, :].clone()
        return self, self

    def take_pass(self) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.pass_keys, self.pass_values
        if keys is None or values is None:
            raise DynheadsError("the per-head KV cache's prefill keys were already read")
        self.pass_keys = self.pass_values = None  # freed once the prefill's attention has read them
        return keys, values

    def take_window(self) -> tuple[torch.Tensor, torch.Tensor]:
        keys, values = self.window_keys, self.window_values
        if keys is None or values is None:
            raise DynheadsError("the per-head KV cache's window was already read: feed one token per step")
        self.window_keys = self.window_values = None
        return keys, values

    def nbytes(self) -> int:
        """Bytes held between steps."""
        if not self.is_initialized:
            return 0
        held = (self.keys, self.values, self.sink_keys, self.sink_values, self.recent_keys, self.recent_values)
        return sum(t.numel() * t.element_size() for t in held)

    def get_mask_sizes(self, query_length) -> tuple[int, int]:
        length = query_length if isinstance(query_length, int) else int(query_length.shape[0])
        return self.seen + length, 0

    def get_seq_length(self) -> int:
        return self.seen

    def get_max_length(self) -> int:
        return -1


class HeadwiseCache(Cache):
    """Per-layer ``HeadwiseLayer``s: ``whole[layer]`` lists the KV heads of that layer kept whole."""

    def __init__(self, whole: Sequence[Sequence[int]], num_kv: int, sink: int, recent: int):
        if sink < 0 or recent < 1:
            raise DynheadsError(f"streaming heads need sink >= 0 and recent >= 1, got {sink}, {recent}")
        bad = [(layer, kv) for layer, heads in enumerate(whole) for kv in heads if not 0 <= kv < num_kv]
        if bad:  # a query head's index, or a negative one, picked another head or failed inside torch
            raise DynheadsError(f"KV head {bad[0]} is outside the {num_kv} KV heads of a layer")
        super().__init__(layers=[HeadwiseLayer(heads, num_kv, sink, recent) for heads in whole])

    def nbytes(self) -> int:
        """Bytes the cache holds (keys and values of every layer)."""
        return sum(layer.nbytes() for layer in cast(list[HeadwiseLayer], self.layers))  # built in __init__


def headwise_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None, **kwargs):
    """Attention over a ``HeadwiseLayer``: the prefill over its full keys (SDPA), a decode step per group of
    query heads over that group's own keys; any other cache falls back to SDPA."""
    if not isinstance(key, HeadwiseLayer):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    if kwargs.get("softcap") is not None or kwargs.get("sliding_window"):
        raise DynheadsError("the per-head KV cache supports plain causal attention (no soft-cap, no sliding window)")
    layer = key
    if query.shape[2] > 1:
        keys, values = layer.take_pass()
        return sdpa_attention_forward(
            module, query, keys, values, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    batch, num_heads, _, head_dim = query.shape
    num_kv = len(layer.whole) + len(layer.streaming)
    groups = num_heads // num_kv
    scaling = head_dim**-0.5 if scaling is None else scaling
    q = query[:, :, -1, :].reshape(batch, num_kv, groups, head_dim)
    out = torch.empty_like(q)
    window_keys, window_values = layer.take_window()
    for index, keys, values in (
        (layer.whole_index, layer.keys, layer.values),
        (layer.streaming_index, window_keys, window_values),
    ):
        if not len(index):
            continue
        logits = torch.matmul(q[:, index], keys.transpose(-1, -2)) * scaling  # [B, n, G, kv]
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        out[:, index] = torch.matmul(probs.to(values.dtype), values)
    return out.reshape(batch, num_heads, 1, head_dim).transpose(1, 2).contiguous(), None


AttentionInterface.register(HEADWISE, headwise_attention)
AttentionMaskInterface.register(HEADWISE, sdpa_mask)


@contextmanager
def headwise(lm: LoadedModel) -> Iterator[None]:
    """Route the model's attention through ``headwise_attention`` for the block."""
    config = lm.model.config
    if getattr(config, "sliding_window", None) and any(
        t != "full_attention" for t in getattr(config, "layer_types", None) or ["sliding"]
    ):
        raise DynheadsError("the per-head KV cache does not model sliding-window layers")
    previous = config._attn_implementation
    lm.model.set_attn_implementation(HEADWISE)
    try:
        yield
    finally:
        lm.model.set_attn_implementation(previous)


@dataclass
class HeadwiseResult:
    tokens: list[int]
    logits: list[torch.Tensor]  # per decode step, fp32
    cache_bytes: int  # held by the cache at the end
    full_bytes: int  # what the unmodified model's cache holds for the same tokens


def whole_per_layer(kv_heads: Sequence[tuple[int, int]], num_layers: int) -> list[list[int]]:
    """``[(layer, KV head), ...] -> whole[layer]``."""
    whole: list[list[int]] = [[] for _ in range(num_layers)]
    for layer, kv in kv_heads:
        if not 0 <= layer < num_layers:  # -1 silently kept a head of the last layer
            raise DynheadsError(f"KV head {(layer, kv)} is outside the model's {num_layers} layers")
        whole[layer].append(kv)
    return whole


def headwise_generate(
    lm: LoadedModel,
    input_ids: Sequence[int],
    kv_heads: Sequence[tuple[int, int]],
    *,
    sink: int,
    recent: int,
    max_new_tokens: int,
    stop_at_eos: bool = True,
) -> HeadwiseResult:
    """Greedy decoding with a ``HeadwiseCache`` keeping ``kv_heads`` whole: the prompt minus its last token is
    prefilled in full, then the last prompt token and every generated token are decode steps (``kv.retention``)."""
    from dynheads.kv.retention import kv_token_bytes, num_kv_heads

    if len(input_ids) < 2:
        raise DynheadsError("the per-head KV cache needs a prompt of at least 2 tokens")
    num_kv = num_kv_heads(lm)
    cache = HeadwiseCache(whole_per_layer(kv_heads, lm.num_layers), num_kv, sink, recent)
    session = DecodingSession(lm, input_ids, max_new_tokens=max_new_tokens, cache=cache, probed=False)
    logits: list[torch.Tensor] = []
    policy = GreedyPolicy(lm.stop_token_ids() if stop_at_eos else set(), lambda step: logits.append(step.logits))
    with headwise(lm):
        session.forward(len(input_ids) - 1)
        (decoded,) = decode([session], [policy], max_new_tokens)
    full = lm.num_layers * num_kv * cache.get_seq_length() * kv_token_bytes(lm)
    return HeadwiseResult(tokens=decoded.tokens, logits=logits, cache_bytes=cache.nbytes(), full_bytes=full)
