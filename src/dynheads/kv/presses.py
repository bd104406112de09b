"""The retrieval-head presses as kvpress presses: the door for a kvpress user (issue 61).

Each press is a kvpress press, made for ``pipeline("kv-press-text-generation")``, ``with press(model): ...`` and
kvpress's wrappers like kvpress's own::

    from transformers import pipeline
    from dynheads.kv.presses import head_tokens_press

    press = head_tokens_press("static_heads.json", compression_ratio=0.5)  # or a kv-export folder, or [(14, 3), ...]
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tokenizer)
    answer = pipe(context, question=question, press=press)["answer"]

- ``head_tokens_press``: retrieval heads choose the tokens (``dynheads.kv.token_votes``): the voters ((layer, query
  head) pairs, ``load_voters``) vote from the last ``window`` prefilled positions and every KV head of every layer
  keeps the same tokens, at a compression ratio. The cross-layer vote (the default) adds the voters of all layers,
  so it compresses every layer after the last one: alone and in ``ComposedPress`` it runs, and any kvpress wrapper
  that scores or sizes one layer at a time is refused with one line. ``layerwise=True`` is a plain ``ScorerPress``
  whose every layer is voted by its own voters (a layer with none by all its query heads), so every wrapper
  (``AdaKVPress``, ``ChunkPress``, ``CriticalKVPress``, ``DMSPress``, ``KeyRerotationPress``, ...) can drive it;
  what that costs against the cross-layer vote is measured in docs/kv.md.
- ``head_list_press``: DuoAttention driven by a head list: the given KV heads keep every token, the others ``sink`` +
  ``recent`` (``press_from_export``: from a ``dynheads kv-export`` folder).

Which track of kvpress's leaderboard a press is on is set by where the question is, not by the press: in kvpress's
pipeline the context is compressed before the question is read (the question-free track); ``dynheads kv``
compresses the whole prompt, question included (the question-aware track, SnapKV's). docs/kv.md says which rows of
which page are on which track.

The votes are computed without autograd. ``dynheads.kv.press_runs`` runs these and kvpress's presses as
``kvpress:<press>`` policies of ``dynheads kv``.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from dynheads.analysis.headlists import load_head_list, scored_heads
from dynheads.analysis.kvheads import KVHead
from dynheads.errors import DynheadsError
from dynheads.heads import Head, check_pairs
from dynheads.io import read_json
from dynheads.kv.press_registry import KVPRESS_ROUTE
from dynheads.kv.token_votes import POOL, VOTERS, WINDOW, token_scores

VoterSource = str | Path | Sequence[Head]

# Why the cross-layer vote cannot run under a wrapper, and what to use instead
COMPOSED_ALONE = (
    "head_tokens_press compresses every layer after the last one from the votes of all of them, so every layer's "
    "cache must still hold the whole prefill then: no other press may compress a layer before it (a ComposedPress "
    "of it and another press; a sliding-window layer keeps only its window): wrap head_tokens_press(..., "
    "layerwise=True), which composes with the others (docs/kv.md)"
)
CROSS_LAYER_ONLY = (
    "head_tokens_press votes with the voters of every layer and compresses every layer after the last one, so a "
    "kvpress wrapper that scores or sizes one layer at a time (AdaKVPress, ChunkPress, CriticalKVPress, DMSPress, "
    "KeyRerotationPress, MergingPress, PerLayerCompressionPress, ...) cannot drive it: wrap "
    "head_tokens_press(..., layerwise=True), each layer voted by its own voters (docs/kv.md)"
)


def require_kvpress():
    """The kvpress module, or a one-line error naming the side venv that has it (``KVPRESS_ROUTE``)."""
    if importlib.util.find_spec("kvpress") is None:
        raise DynheadsError(f"kvpress policies need kvpress, which this environment lacks: {KVPRESS_ROUTE}")
    try:
        import kvpress
    except ImportError as error:  # e.g. a transformers release kvpress does not support
        raise DynheadsError(f"kvpress is installed but does not import ({error}): {KVPRESS_ROUTE}") from None
    return kvpress


def load_voters(source: VoterSource, count: int = VOTERS) -> tuple[Head, ...]:
    """The query heads that vote: a list of (layer, head) pairs as given; a dynheads static-head file (Wu et al.'s
    JSON or a ranked list), its ``count`` best positive-score heads; a ``dynheads kv-export`` folder, the same heads
    of the list it was exported from (``_export_voters``)."""
    if count < 1:
        raise DynheadsError(f"the number of voting heads is at least 1, got {count}")
    if isinstance(source, str | Path):
        path = Path(source)
        voters = _export_voters(path, count) if path.is_dir() else scored_heads(load_head_list(path))[:count]
        if not voters:
            raise DynheadsError(f"{path} gives every head a zero score: it names no voting head")
        return voters
    voters = tuple(source)
    check_pairs(list(voters), "the voting heads")
    voters = tuple((int(layer), int(head)) for layer, head in voters)
    if not voters:
        raise DynheadsError("a head-token press needs at least one voting head")
    return voters


def _export_voters(folder: Path, count: int) -> tuple[Head, ...]:
    """The ``count`` best query heads of the list the folder was exported from (its config's ``voters``); an export
    written before it recorded them: the query heads of its best-valued KV heads, in head order."""
    config, ranking = _export_ranking(folder)
    if "voters" in config:
        return tuple((int(layer), int(head)) for layer, head in config["voters"])[:count]
    group = int(config["num_query_heads"]) // int(config["num_kv_heads"])
    return tuple((layer, kv * group + i) for layer, kv in ranking for i in range(group))[:count]


def _export_ranking(folder: Path) -> tuple[dict, list[KVHead]]:
    """An export's config.json and its KV heads with a positive value, best first (ties by layer, head)."""
    try:
        config = read_json(folder / "config.json")
        values = np.loadtxt(folder / "full_attention_heads.tsv", delimiter="\t", ndmin=2)
    except (OSError, ValueError) as error:
        raise DynheadsError(f"{folder} is not a dynheads kv-export folder: {error}") from None
    order = sorted(zip(*np.nonzero(values > 0), strict=True), key=lambda kv: (-values[kv], kv))
    return config, [(int(layer), int(kv)) for layer, kv in order]


@functools.cache
def _press_class() -> type:
    kvpress = require_kvpress()

    @dataclass
    class DynheadsHeadPress(kvpress.DuoAttentionPress):  # type: ignore[name-defined]  # a base found at run time
        """DuoAttention with a dynheads head list: the KV heads ``kv_heads`` ((layer, KV head) pairs) keep every
        token, every other KV head keeps ``sink`` + ``recent`` (no pattern download, no zero-score filler)."""

        kv_heads: tuple[tuple[int, int], ...] = ()
        sink: int = 128
        recent: int = 256
        shape: tuple[int, int] | None = None  # (layers, KV heads) of the model the list was made for, if known
        head_compression_ratio: float = field(init=False, default=0.0)

        def post_init_from_model(self, model):
            config = model.config.get_text_config()
            layers = config.num_hidden_layers
            num_kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
            if self.shape is not None and tuple(self.shape) != (layers, num_kv):
                raise DynheadsError(
                    f"the head list was made for a model of {self.shape[0]} layers x {self.shape[1]} KV heads, "
                    f"not this one's {layers} x {num_kv}"
                )
            streaming = torch.ones(layers, num_kv, dtype=torch.bool)
            for layer, kv in self.kv_heads:
                if not (0 <= layer < layers and 0 <= kv < num_kv):
                    raise DynheadsError(f"KV head {(layer, kv)} is outside {layers} layers x {num_kv} KV heads")
                streaming[layer, kv] = False
            self.sink_size, self.recent_size = self.sink, self.recent
            self.streaming_mask = streaming.to(model.device)
            self.head_compression_ratio = float(streaming.float().mean())

    return _named(DynheadsHeadPress)


def head_list_press(
    kv_heads: Sequence[KVHead], *, sink: int = 128, recent: int = 256, shape: tuple[int, int] | None = None
):
    """A kvpress press (a ``DuoAttentionPress``) that keeps the given KV heads whole and streams the others:
    ``with head_list_press(heads)(model): model(prompt_ids, **with_cache(model, cache))`` as any kvpress press."""
    if sink < 0 or recent < 1:
        raise DynheadsError(f"streaming heads need sink >= 0 and recent >= 1, got {sink}, {recent}")
    whole = tuple((int(layer), int(kv)) for layer, kv in kv_heads)
    return _press_class()(kv_heads=whole, sink=sink, recent=recent, shape=shape)


@dataclass
class TokenVoteKnobs:
    """The knobs of both head-token presses (their dataclass fields, kvpress's way: a variant is its fields): the
    compression ratio, the voting (layer, query head) pairs, the observation window, the protected sink and recent
    tokens, the vote pooling and the span a vote carries forward (``token_votes``)."""

    compression_ratio: float = 0.0
    voters: tuple[tuple[int, int], ...] = ()
    window: int = WINDOW
    sink: int = 4
    recent: int = 64
    pool: int = POOL
    span: int = 0

    def __post_init__(self):
        """One line for a knob out of range when the press is made, as kvpress's presses assert theirs (a window of
        0 was refused only in the prefill, as a window longer than the prompt)."""
        if not 0 <= self.compression_ratio < 1:
            raise DynheadsError(f"a compression ratio is in [0, 1), got {self.compression_ratio}")
        if self.sink < 0 or self.recent < 0:
            raise DynheadsError(
                f"the protected sink and recent tokens are counts >= 0, got sink={self.sink}, recent={self.recent}"
            )
        if self.window < 1 or self.span < 0:
            raise DynheadsError(
                f"the head-token press needs an observation window >= 1 and a span >= 0, got window={self.window}, "
                f"span={self.span}"
            )
        if self.pool < 1 or self.pool % 2 == 0:
            raise DynheadsError(f"the vote pooling is an odd number of keys, got {self.pool}")
        parent = getattr(super(), "__post_init__", None)  # kvpress's ScorerPress checks its ratio too
        if parent is not None:
            parent()


@functools.cache
def _token_press_class() -> type:
    kvpress = require_kvpress()
    is_prefilling = kvpress.presses.base_press.is_prefilling  # kvpress's test for the prefill pass

    @dataclass
    class HeadTokensPress(TokenVoteKnobs, kvpress.ScorerPress):  # type: ignore[name-defined]  # base found at run time
        """Retrieval heads choose the tokens (``dynheads.kv.token_votes``): the ``voters`` ((layer, query head) pairs)
        vote from the last ``window`` prefilled positions, and every KV head of every layer keeps the same tokens.
        The votes of all layers are known after the last layer, so the cache of every layer is compressed there
        (the prefill itself attends in full either way: kvpress compresses after a layer's attention); ``score``
        answers only that compression, and a wrapper that calls it or the hook one layer at a time is refused
        (``CROSS_LAYER_ONLY``)."""

        scores: torch.Tensor | None = field(default=None, init=False, repr=False)  # set while compressing

        def post_init_from_model(self, model):
            self.attention = attention_modules(model)
            check_voters(self.voters, len(self.attention), model.config.num_attention_heads)
            self.votes: list[torch.Tensor] = []
            self.first_layer_ratio = self.compression_ratio

        @torch.no_grad()
        def forward_hook(self, module, input, kwargs, output):
            hidden = kwargs["hidden_states"]
            if not is_prefilling(kwargs["cache_position"], hidden.shape[1]):
                return output
            if not hasattr(self, "attention"):  # a wrapper that calls the hook without the model (per-layer sizes)
                raise DynheadsError(CROSS_LAYER_ONLY)
            if hidden.shape[0] != 1:
                raise DynheadsError(
                    f"the cross-layer head-token press compresses one sequence at a time, got a batch of "
                    f"{hidden.shape[0]} (head_tokens_press(..., layerwise=True) takes batches)"
                )
            if not 0 < self.window < hidden.shape[1]:
                raise DynheadsError(
                    f"the head-token press compresses a sequence longer than its window ({self.window} tokens), "
                    f"got {hidden.shape[1]}"
                )
            cache, layer = kwargs["past_key_values"], module.layer_idx
            if layer == 0:
                self.votes, self.first_layer_ratio = [], self.compression_ratio
            elif self.compression_ratio != self.first_layer_ratio:  # a wrapper sizing each layer
                raise DynheadsError(CROSS_LAYER_ONLY)
            heads = [head for voter_layer, head in self.voters if voter_layer == layer]
            if heads:  # [1, H, window, n - window] rows of this layer's query heads (kvpress's SnapKV arithmetic)
                rows = kvpress.SnapKVPress.compute_window_attention(
                    module, hidden, cache.layers[layer].keys, self.window, kwargs["position_embeddings"]
                )
                self.votes.append(rows[0, heads].float().mean(1).sum(0))
            if layer == len(self.attention) - 1:
                if any(held.keys.shape[2] != hidden.shape[1] for held in cache.layers):
                    raise DynheadsError(COMPOSED_ALONE)  # another press (or a sliding window) cut a layer first
                self._compress_every_layer(cache, hidden, kwargs)
            return output

        def _compress_every_layer(self, cache, hidden, kwargs):
            votes = torch.stack(self.votes).sum(0) / len(self.voters)
            self.scores = token_scores(
                votes, hidden.shape[1], sink=self.sink, recent=self.recent, pool=self.pool, span=self.span
            )
            self.votes = []
            try:
                for index, attention in enumerate(self.attention):
                    held = cache.layers[index]
                    held.keys, held.values = self.compress(attention, hidden, held.keys, held.values, None, kwargs)
            finally:
                self.scores = None

        def score(self, module, hidden_states, keys, values, attentions, kwargs):
            if self.scores is None:  # called by a wrapper, one layer at a time
                raise DynheadsError(CROSS_LAYER_ONLY)
            return self.scores.to(keys.device)[None, None].expand(keys.shape[0], keys.shape[1], -1)

    return _named(HeadTokensPress)


@functools.cache
def _layer_token_press_class() -> type:
    kvpress = require_kvpress()

    @dataclass
    class LayerHeadTokensPress(TokenVoteKnobs, kvpress.ScorerPress):  # type: ignore[name-defined]  # run-time base
        """Retrieval heads choose the tokens one layer at a time: the layer's own ``voters`` vote from the last
        ``window`` positions of the call (a layer with no voter: all its query heads), pooled and protected as
        ``token_votes.token_scores``, and every KV head of the layer keeps the same tokens. No state across layers
        or calls, so any kvpress wrapper can call ``score`` (on a chunk, a block, or a layer at its own ratio)."""

        @torch.no_grad()
        def score(self, module, hidden_states, keys, values, attentions, kwargs):
            length, config = keys.shape[2], module.config
            check_voters(self.voters, config.num_hidden_layers, config.num_attention_heads, layerwise=True)
            if not 0 < self.window < min(length, hidden_states.shape[1]):
                raise DynheadsError(
                    f"the head-token press votes from a window of {self.window} positions, so it compresses spans "
                    f"longer than that (this call: {length} keys)"
                )
            heads = [head for layer, head in self.voters if layer == module.layer_idx]
            rows = kvpress.SnapKVPress.compute_window_attention(  # [B, H, window, n - window]
                module, hidden_states, keys, self.window, kwargs["position_embeddings"]
            )
            votes = rows[:, heads or slice(None)].float().mean(2).mean(1)
            scores = [
                token_scores(row, length, sink=self.sink, recent=self.recent, pool=self.pool, span=self.span)
                for row in votes
            ]
            return torch.stack(scores).to(keys.device)[:, None].repeat(1, keys.shape[1], 1)  # wrappers edit it

    return _named(LayerHeadTokensPress)


def check_voters(voters: Sequence[tuple[int, int]], layers: int, heads: int, *, layerwise: bool = False) -> None:
    """One line for voters that are missing (the cross-layer press needs some) or name a layer or query head the
    model lacks."""
    if not voters and not layerwise:
        raise DynheadsError("the head-token press needs voting heads (a static head list: voters=...)")
    bad = [voter for voter in voters if not (0 <= voter[0] < layers and 0 <= voter[1] < heads)]
    if bad:
        raise DynheadsError(f"voting head {tuple(bad[0])} is outside the model's {layers} layers x {heads} query heads")


def head_tokens_press(
    voters: VoterSource,
    compression_ratio: float,
    *,
    layerwise: bool = False,
    sink: int = 4,
    recent: int = 64,
    window: int = WINDOW,
    pool: int = POOL,
    span: int = 0,
    count: int = VOTERS,
):
    """A kvpress ``ScorerPress`` whose scores are the head-guided token votes of ``dynheads.kv.token_votes``:
    ``voters`` as ``load_voters`` reads them (``count`` of a file's or export's heads); the cross-layer vote, or
    with ``layerwise`` each layer's own (the variant every kvpress wrapper composes with). Knobs out of range are
    refused when the press is made (``TokenVoteKnobs``)."""
    press_class = _layer_token_press_class() if layerwise else _token_press_class()
    return press_class(
        compression_ratio=compression_ratio,
        voters=load_voters(voters, count),
        window=window,
        sink=sink,
        recent=recent,
        pool=pool,
        span=span,
    )


def press_from_export(folder: str | Path, full_heads: int | None = None):
    """``head_list_press`` from a ``dynheads kv-export`` folder: the 1s of a thresholded export, or the
    ``full_heads`` best positive-score KV heads of a scored one; windows from its config.json."""
    config, ranking = _export_ranking(Path(folder))
    if "full_kv_heads" in config:
        if full_heads is not None:
            raise DynheadsError(
                f"{folder} is a 0/1 pattern of {config['full_kv_heads']} whole KV heads: give no full_heads"
            )
        whole = ranking
    elif full_heads is None:
        raise DynheadsError(f"{folder} holds scores, not a 0/1 pattern: say how many KV heads to keep whole")
    elif isinstance(full_heads, bool) or not isinstance(full_heads, int) or full_heads < 1:
        raise DynheadsError(f"full_heads is a number of KV heads >= 1, got {full_heads!r}")
    else:
        whole = ranking[:full_heads]
    shape = (int(config["num_layers"]), int(config["num_kv_heads"])) if "num_layers" in config else None
    return head_list_press(whole, sink=int(config["sink_size"]), recent=int(config["recent_size"]), shape=shape)


def _named(press_class: type) -> type:
    """A press class built at run time, named as a module-level class of this module (its repr reads
    ``HeadTokensPress(...)``, and pickle finds it here through ``__getattr__``)."""
    press_class.__qualname__ = press_class.__name__
    press_class.__module__ = __name__
    return press_class


_PRESS_CLASSES = {
    "DynheadsHeadPress": _press_class,
    "HeadTokensPress": _token_press_class,
    "LayerHeadTokensPress": _layer_token_press_class,
}


def __getattr__(name: str) -> type:
    """The press classes by name (``from dynheads.kv.presses import HeadTokensPress``, ``isinstance``, pickle), built
    on first use: their kvpress base is imported only then."""
    if name in _PRESS_CLASSES:
        return _PRESS_CLASSES[name]()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def attention_modules(model) -> list:
    """The model's attention modules in layer order (those kvpress hooks)."""
    return [module for module in model.modules() if hasattr(module, "layer_idx") and hasattr(module, "o_proj")]
