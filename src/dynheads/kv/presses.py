"""kvpress side by side: the field's KV-cache presses as ``kvpress:<press>`` policies of ``dynheads kv``, and a
dynheads head list as a kvpress press.

kvpress (NVIDIA; in the side venv of ``scripts/kvpress-env.sh``, since kvpress 0.5.5 pins transformers < 5.3:
``press_registry.KVPRESS_ROUTE``) compresses the cache once, at the prefill; decoding then appends every new
token in full. A ``kvpress:<press>`` policy at budget ``b`` is matched in memory to the static dynheads policy at
the same budget: its compression ratio is ``1 - f`` with ``f`` the KV fraction that ``k = round(b * L * H_kv)``
whole KV heads plus ``sink + recent``-token windows hold at the prompt's length, so both start decoding with the
same bytes.

- ``streaming_llm`` (``StreamingLLMPress``, ``n_sink = sink``), ``snapkv`` (``SnapKVPress``), ``expected_attention``
  (``ExpectedAttentionPress``) and ``knorm`` (``KnormPress``): token-level presses at that ratio,
- ``duo_attention``: ``DuoAttentionPress`` driven by a dynheads head list (``head_list_press``): the static policy's
  k best positive-score KV heads keep every token and the others only ``sink`` + ``recent`` (kvpress masks the
  evicted keys of those heads instead of freeing them; the bytes counted are the keys it leaves visible),
- ``head_tokens``: retrieval heads choose the tokens (``head_tokens_press``, ``dynheads.kv.token_votes``): the static
  list's best query heads vote from an observation window and every KV head keeps the same tokens, at that ratio;
  ``head_tokens_predicted``: the same, the voters being the head predictor's best heads for the prompt (the runner
  passes them as ``KVSettings.voters``); ``head_spans``: ``head_tokens`` with every vote carried ``token_votes.SPAN``
  keys forward, so a voted cue keeps the fact after it (``head_spans_predicted``: with the predictor's voters),
- ``chunkkv``: ChunkKV (kvpress's ``ChunkKVPress`` over ``SnapKVPress``, its defaults: whole chunks of 20 tokens) and
  ``snapkv_spans``: SnapKV with its scores carried ``SPAN`` keys forward (``head_spans``' span on every head), two
  baselines for a policy that keeps facts whole.

The resident KV of a press row is read from the cache at every decode step (its tokens x KV heads, less the
masked keys), so the table shows what each press actually held.
"""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np
import torch
from transformers import DynamicCache

from dynheads.analysis.kvheads import KVHead
from dynheads.config import parse_fields
from dynheads.engine.decoding import DecodingSession, GreedyPolicy, StepResult, decode
from dynheads.errors import DynheadsError, did_you_mean
from dynheads.heads import Head
from dynheads.io import read_json
from dynheads.kv.press_registry import KVPRESS_PRESSES, KVPRESS_ROUTE, PressSpec, parse_press
from dynheads.kv.retention import KVResult, KVSettings, kv_head_count, kv_memory, num_kv_heads
from dynheads.kv.token_votes import POOL, SPAN, WINDOW, carried, token_scores
from dynheads.models import LoadedModel, decode_text

PREFIX = "kvpress:"


def is_press(policy: str) -> bool:
    return policy.startswith(PREFIX)


def check_press(policy: str) -> PressSpec:
    """The press of a ``kvpress:<press>[:key=value:...]`` policy; a one-line error when the press is unknown, a
    knob is not one of its fields, or kvpress is missing."""
    spec = parse_press(policy)
    if spec.name not in KVPRESS_PRESSES:
        raise DynheadsError(
            f"unknown kvpress policy {policy!r}: use kvpress:<press> with a press of {KVPRESS_PRESSES.choices()}"
            + did_you_mean(spec.name, KVPRESS_PRESSES.names())
        )
    require_kvpress()
    press_knobs(spec)
    return spec


def press_knobs(spec: PressSpec) -> dict:
    """The knobs ``spec`` sets, cast to its kvpress press's field types; those the budget or the KV settings set
    (the compression ratio, the entry's ``knobs``) are refused, and a dynheads-built press takes none."""
    entry = KVPRESS_PRESSES.get(spec.name)
    if not spec.knobs:
        return {}
    if not entry.is_kvpress:
        raise DynheadsError(f"kvpress:{spec.name} is built by dynheads from the KV settings: it takes no knobs")
    refused = {"compression_ratio", *(arg for arg, _ in entry.knobs)}
    return parse_fields(f"kvpress:{spec.name}", spec.knobs.replace(":", ","), entry.target(), refused)


def require_kvpress():
    """The kvpress module, or a one-line error naming the side venv that has it (``KVPRESS_ROUTE``)."""
    if importlib.util.find_spec("kvpress") is None:
        raise DynheadsError(f"kvpress policies need kvpress, which this environment lacks: {KVPRESS_ROUTE}")
    try:
        import kvpress
    except ImportError as error:  # e.g. a transformers release kvpress does not support
        raise DynheadsError(f"kvpress is installed but does not import ({error}): {KVPRESS_ROUTE}") from None
    return kvpress


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
        head_compression_ratio: float = field(init=False, default=0.0)

        def post_init_from_model(self, model):
            config = model.config.get_text_config()
            layers = config.num_hidden_layers
            num_kv = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
            streaming = torch.ones(layers, num_kv, dtype=torch.bool)
            for layer, kv in self.kv_heads:
                if not (0 <= layer < layers and 0 <= kv < num_kv):
                    raise DynheadsError(f"KV head {(layer, kv)} is outside {layers} layers x {num_kv} KV heads")
                streaming[layer, kv] = False
            self.sink_size, self.recent_size = self.sink, self.recent
            self.streaming_mask = streaming.to(model.device)
            self.head_compression_ratio = float(streaming.float().mean())

    return DynheadsHeadPress


def head_list_press(kv_heads: Sequence[KVHead], *, sink: int = 128, recent: int = 256):
    """A kvpress press (a ``DuoAttentionPress``) that keeps the given KV heads whole and streams the others:
    ``with head_list_press(heads)(model): model(prompt_ids, **with_cache(model, cache))`` as any kvpress press."""
    if sink < 0 or recent < 1:
        raise DynheadsError(f"streaming heads need sink >= 0 and recent >= 1, got {sink}, {recent}")
    return _press_class()(kv_heads=tuple((int(layer), int(kv)) for layer, kv in kv_heads), sink=sink, recent=recent)


@functools.cache
def _token_press_class() -> type:
    kvpress = require_kvpress()
    is_prefilling = kvpress.presses.base_press.is_prefilling  # kvpress's test for the prefill pass

    @dataclass
    class HeadTokensPress(kvpress.ScorerPress):  # type: ignore[name-defined]  # a base found at run time
        """Retrieval heads choose the tokens (``dynheads.kv.token_votes``): the ``voters`` ((layer, query head) pairs)
        vote from the last ``window`` prefilled positions, and every KV head of every layer keeps the same tokens.
        The votes of all layers are known after the last layer, so the cache of every layer is compressed there
        (the prefill itself attends in full either way: kvpress compresses after a layer's attention)."""

        compression_ratio: float = 0.0
        voters: tuple[tuple[int, int], ...] = ()
        window: int = WINDOW
        sink: int = 4
        recent: int = 64
        pool: int = POOL
        span: int = 0

        def post_init_from_model(self, model):
            self.attention = attention_modules(model)
            bad = [h for h in self.voters if not (0 <= h[0] < len(self.attention))]
            if not self.voters or bad:
                raise DynheadsError(f"the head-token press needs voting heads within {len(self.attention)} layers")
            self.votes: list[torch.Tensor] = []

        def forward_hook(self, module, input, kwargs, output):
            hidden = kwargs["hidden_states"]
            if not is_prefilling(kwargs["cache_position"], hidden.shape[1]):
                return output
            if hidden.shape[0] != 1 or not 0 < self.window < hidden.shape[1]:
                raise DynheadsError(
                    f"the head-token press compresses one sequence longer than its window ({self.window} tokens)"
                )
            cache, layer = kwargs["past_key_values"], module.layer_idx
            heads = [head for voter_layer, head in self.voters if voter_layer == layer]
            if heads:  # [1, H, window, n - window] rows of this layer's query heads (kvpress's SnapKV arithmetic)
                rows = kvpress.SnapKVPress.compute_window_attention(
                    module, hidden, cache.layers[layer].keys, self.window, kwargs["position_embeddings"]
                )
                self.votes.append(rows[0, heads].float().mean(1).sum(0))
            if layer == len(self.attention) - 1:
                votes = torch.stack(self.votes).sum(0) / len(self.voters)
                self.scores = token_scores(
                    votes, hidden.shape[1], sink=self.sink, recent=self.recent, pool=self.pool, span=self.span
                )
                self.votes = []
                for index, attention in enumerate(self.attention):
                    held = cache.layers[index]
                    held.keys, held.values = self.compress(attention, hidden, held.keys, held.values, None, kwargs)
            return output

        def score(self, module, hidden_states, keys, values, attentions, kwargs):
            return self.scores.to(keys.device)[None, None].expand(keys.shape[0], keys.shape[1], -1)

    return HeadTokensPress


def head_tokens_press(
    voters: Sequence[Head],
    compression_ratio: float,
    *,
    sink: int = 4,
    recent: int = 64,
    window: int = WINDOW,
    pool: int = POOL,
    span: int = 0,
):
    """A kvpress press (a ``ScorerPress``) whose scores are the head-guided token votes of ``dynheads.kv.token_votes``:
    ``with head_tokens_press(heads, 0.75)(model): model(prompt_ids, **with_cache(model, cache))``."""
    if not 0 <= compression_ratio < 1:
        raise DynheadsError(f"a compression ratio is in [0, 1), got {compression_ratio}")
    return _token_press_class()(
        compression_ratio=compression_ratio,
        voters=tuple((int(layer), int(head)) for layer, head in voters),
        window=window,
        sink=sink,
        recent=recent,
        pool=pool,
        span=span,
    )


def press_from_export(folder: str | Path, full_heads: int | None = None):
    """``head_list_press`` from a ``dynheads kv-export`` folder: the 1s of a thresholded export, or the
    ``full_heads`` best positive-score KV heads of a scored one; windows from its config.json."""
    folder = Path(folder)
    config = read_json(folder / "config.json")
    values = np.loadtxt(folder / "full_attention_heads.tsv", delimiter="\t", ndmin=2)
    if "full_kv_heads" in config:
        whole = [(int(layer), int(head)) for layer, head in zip(*np.nonzero(values >= 0.5), strict=True)]
    elif full_heads is None:
        raise DynheadsError(f"{folder} holds scores, not a 0/1 pattern: say how many KV heads to keep whole")
    else:
        order = sorted(zip(*np.nonzero(values > 0), strict=True), key=lambda kv: (-values[kv], kv))
        whole = [(int(layer), int(head)) for layer, head in order[:full_heads]]
    return head_list_press(whole, sink=int(config["sink_size"]), recent=int(config["recent_size"]))


def matched_ratio(lm: LoadedModel, settings: KVSettings, length: int) -> float:
    """Compression ratio holding, at ``length`` cached tokens, the static policy's bytes at the same budget."""
    num_kv = num_kv_heads(lm)
    k = kv_head_count(settings.budget, lm.num_layers, num_kv)
    kept = kv_memory([(i // num_kv, i % num_kv) for i in range(k)], lm, length, settings.sink, settings.recent)
    return 1.0 - kept / (lm.num_layers * num_kv * length)


def make_press(spec: PressSpec, lm: LoadedModel, settings: KVSettings, length: int):
    """The registered press ``spec`` names (``press_registry``) with its knobs, sized by ``settings``' budget at
    ``length`` cached tokens."""
    require_kvpress()
    entry = KVPRESS_PRESSES.get(spec.name)
    ratio = matched_ratio(lm, settings, length) if entry.sizing == "ratio" else None
    if entry.is_kvpress:
        from_settings = {arg: getattr(settings, key) for arg, key in entry.knobs}
        return entry.target()(compression_ratio=ratio, **from_settings, **press_knobs(spec))
    return entry.target()(lm, settings, ratio)


def duo_attention_press(lm: LoadedModel, settings: KVSettings, ratio: None):
    """``kvpress:duo_attention``: the budget's best static KV heads whole (``head_list_press``)."""
    return head_list_press(_whole_heads(lm, settings), sink=settings.sink, recent=settings.recent)


def voted_tokens_press(lm: LoadedModel, settings: KVSettings, ratio: float):
    """``kvpress:head_tokens`` / ``head_tokens_predicted``: the settings' voters (the static list's, or the head
    predictor's for this prompt) choose the tokens, at the matched ratio."""
    return head_tokens_press(settings.voters, ratio, sink=settings.sink, recent=settings.recent)


def voted_spans_press(lm: LoadedModel, settings: KVSettings, ratio: float):
    """``kvpress:head_spans`` / ``head_spans_predicted``: ``head_tokens`` whose every vote carries the ``SPAN`` keys
    after it."""
    return head_tokens_press(settings.voters, ratio, sink=settings.sink, recent=settings.recent, span=SPAN)


@functools.cache
def _spans_press_class() -> type:
    kvpress = require_kvpress()

    @dataclass
    class SnapKVSpansPress(kvpress.SnapKVPress):  # type: ignore[name-defined]  # a base found at run time
        """SnapKV whose every score is carried ``span`` keys forward (``token_votes.carried``), per KV head: the span
        of ``head_spans`` on all heads' window attention instead of the retrieval heads' votes."""

        span: int = SPAN

        def score(self, module, hidden_states, keys, values, attentions, kwargs):
            return carried(super().score(module, hidden_states, keys, values, attentions, kwargs), self.span)

    return SnapKVSpansPress


def snapkv_spans_press(lm: LoadedModel, settings: KVSettings, ratio: float):
    """``kvpress:snapkv_spans``: SnapKV (kvpress's defaults) with its scores carried ``SPAN`` keys forward, the span
    ablation of ``head_spans`` (which heads vote, with the same span)."""
    return _spans_press_class()(compression_ratio=ratio)


def chunkkv_press(lm: LoadedModel, settings: KVSettings, ratio: float):
    """``kvpress:chunkkv``: ChunkKV as kvpress ships it, over SnapKV's scores (kvpress's defaults: chunks of 20
    tokens, SnapKV's window and kernel), whole chunks kept at the matched ratio."""
    kvpress = require_kvpress()
    return kvpress.ChunkKVPress(press=kvpress.SnapKVPress(compression_ratio=ratio))


def _whole_heads(lm: LoadedModel, settings: KVSettings) -> list[KVHead]:
    """The static list's best KV heads the budget keeps whole."""
    return list(settings.static_ranking[: kv_head_count(settings.budget, lm.num_layers, num_kv_heads(lm))])


def press_generate(
    lm: LoadedModel,
    input_ids: Sequence[int],
    spec: PressSpec,
    settings: KVSettings,
    max_new_tokens: int,
    *,
    stop_at_eos: bool = True,
) -> KVResult:
    """Greedy decoding with the kvpress press ``spec`` names (with its knobs) applied to the prefill of the prompt
    minus its last token (as ``kv.retention`` prefills), the resident KV read from the cache at every decode step."""
    (result,) = press_generate_all(lm, input_ids, [(spec, settings)], max_new_tokens, stop_at_eos=stop_at_eos)
    return result


def press_generate_all(
    lm: LoadedModel,
    input_ids: Sequence[int],
    arms: Sequence[tuple[PressSpec, KVSettings]],
    max_new_tokens: int,
    *,
    stop_at_eos: bool = True,
    share_prefill: bool = True,
) -> list[KVResult]:
    """``press_generate`` for several presses of one prompt from one prefill: kvpress compresses a layer's cache
    after that layer's attention, so the prefill's passes are the same under every press; each press compresses its
    own copy of every layer's keys and values in that pass (``_pressing``) and then decodes alone from its cache.
    Each result equals the press's own prefill and decoding (``test_presses_sharing_a_prefill_equal_each_alone``).
    A press with its own context (one that overrides kvpress's ``BasePress.__call__``, e.g. a press that also acts
    while decoding) prefills alone under that context, and so does every press with ``share_prefill=False`` (kvpress's
    own way, the reference). Memory: a press that compresses at the last layer
    (``head_tokens``) or masks instead of freeing (``duo_attention``) holds a full copy of the cache until then."""
    if len(input_ids) < 2:
        raise DynheadsError("a kvpress policy needs a prompt of at least 2 tokens")
    for spec, settings in arms:
        _check_drivers(spec, settings)
    presses = [make_press(spec, lm, settings, len(input_ids) - 1) for spec, settings in arms]
    shared = [i for i, press in enumerate(presses) if share_prefill and not _has_own_context(press)]
    alone = [([i], False) for i in range(len(presses)) if i not in shared]
    results: list[KVResult | None] = [None] * len(arms)
    for group, share in ([(shared, True)] if shared else []) + alone:
        pressed = _prefilled(lm, input_ids, [presses[i] for i in group], max_new_tokens, share=share)
        for i, (session, masked) in zip(group, pressed, strict=True):
            results[i] = _decode_pressed(lm, session, masked, *arms[i], max_new_tokens, stop_at_eos)
    return cast(list[KVResult], results)  # every group filled its slots


def _has_own_context(press) -> bool:
    return type(press).__call__ is not require_kvpress().presses.base_press.BasePress.__call__


def _prefilled(
    lm: LoadedModel, input_ids: Sequence[int], presses: list, max_new_tokens: int, share: bool
) -> list[tuple[DecodingSession, dict[int, object] | None]]:
    """One session per press, its cache pruned by the press from one prefill of the prompt minus its last token,
    with the keys a head-level press masks per layer; ``share`` off: one press under its own kvpress context, which
    leaves those keys on the modules (None)."""
    # a pruned cache is shorter than the text: each token gets its true position (as kvpress's pipeline)
    prefilled = DecodingSession(lm, input_ids, max_new_tokens=max_new_tokens, probed=False, text_positions=True)
    if len(presses) == 1 and not share:
        with presses[0](lm.model):
            prefilled.forward(len(input_ids) - 1)
        return [(prefilled, None)]
    caches = [DynamicCache(config=lm.model.config) for _ in presses]
    masks: list[dict[int, object]] = [{} for _ in presses]
    with _pressing(lm.model, presses, caches, masks):
        prefilled.forward(len(input_ids) - 1)
    return list(zip(prefilled.copies(len(presses), caches), masks, strict=True))


def _check_drivers(spec: PressSpec, settings: KVSettings) -> None:
    """A one-line error when the press's head list or predicted voters are missing."""
    entry = KVPRESS_PRESSES.get(spec.name)
    if entry.needs_static and not (settings.static_ranking or settings.voters):
        raise DynheadsError(f"kvpress:{spec.name} is driven by a dynheads head list: pass --static FILE")
    if entry.needs_probe and not settings.voters:
        raise DynheadsError(f"kvpress:{spec.name} votes with the head predictor's heads for the prompt: pass --probe")


@contextmanager
def _pressing(model, presses: list, caches: list[DynamicCache], masks: list[dict[int, object]]):
    """Every press compresses its own cache in one prefill: after each layer's attention, the layer's keys and values
    are copied into each press's cache and the press's kvpress hook runs on that cache (as ``press(model)`` would on
    the model's); a head-level press's masked keys are kept per press (kvpress leaves them on the module)."""
    attention, rotary = attention_modules(model), getattr(model.base_model, "rotary_emb", None)
    for press in presses:
        press.post_init_from_model(model)
    for module in attention:
        if rotary is not None:  # as kvpress's press context sets it, for presses that re-rotate keys
            module.rotary_emb = rotary

    def hook(module, args, kwargs, output):
        layer = module.layer_idx
        held = kwargs["past_key_values"].layers[layer]
        for press, cache, masked in zip(presses, caches, masks, strict=True):
            cache.update(held.keys, held.values, layer)
            press.forward_hook(module, args, {**kwargs, "past_key_values": cache}, output)
            masked[layer] = getattr(module, "masked_key_indices", None)
            module.masked_key_indices = None
        return output

    handles = [module.register_forward_hook(hook, with_kwargs=True) for module in attention]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _decode_pressed(
    lm: LoadedModel,
    session: DecodingSession,
    masked: dict[int, object] | None,
    spec: PressSpec,
    settings: KVSettings,
    max_new_tokens: int,
    stop_at_eos: bool,
) -> KVResult:
    """Greedy decoding of a session whose cache a press pruned (``masked``: the keys it masks per layer), the
    resident KV read from the cache at every step."""
    entry = KVPRESS_PRESSES.get(spec.name)
    whole = _whole_heads(lm, settings) if entry.sizing == "heads" else []
    attention, num_kv, prompt = attention_modules(lm.model), num_kv_heads(lm), session.prompt_length
    result = KVResult(tokens=[], text="", stop_reason="max_new_tokens", budget_heads=len(whole))

    def measure(step: StepResult) -> None:
        # a pruned cache holds fewer tokens than were fed; the unmodified model holds them all
        result.total_kv.append(lm.num_layers * num_kv * (prompt + len(result.kept_kv)))
        result.kept_kv.append(_resident(session.cache, attention))
        result.kv_heads.append(whole)
        result.fetched_kv.append(0)
        result.fetched_new_kv.append(0)
        result.dynamic.append([])

    policy = GreedyPolicy(lm.stop_token_ids() if stop_at_eos else set(), measure)
    try:
        if masked is not None:  # kvpress reads a head-level press's masked keys from the modules while decoding
            for module in attention:
                module.masked_key_indices = masked.get(module.layer_idx)
        (decoded,) = decode([session], [policy], max_new_tokens)
    finally:
        for module in attention:  # the next press or sample must not see this press's head masks
            module.masked_key_indices = None  # type: ignore[assignment]  # kvpress's attribute, not nn.Module's
    result.tokens, result.stop_reason = decoded.tokens, decoded.stop_reason
    result.text = decode_text(lm.tokenizer, result.tokens, skip_special_tokens=True)
    return result


def attention_modules(model) -> list:
    """The model's attention modules in layer order (those kvpress hooks)."""
    return [module for module in model.modules() if hasattr(module, "layer_idx") and hasattr(module, "o_proj")]


def _resident(cache, attention) -> int:
    """Tokens x KV heads the cache holds, less the keys kvpress masks (head-level presses do not free them)."""
    held = sum(int(layer.keys.shape[1] * layer.keys.shape[2]) for layer in cache.layers)
    masked = sum(len(m.masked_key_indices[0]) for m in attention if getattr(m, "masked_key_indices", None))
    return held - masked
