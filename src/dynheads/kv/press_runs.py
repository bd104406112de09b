"""kvpress side by side: the field's KV-cache presses and the retrieval-head presses (``dynheads.kv.presses``) as
``kvpress:<press>`` policies of ``dynheads kv``.

kvpress (NVIDIA; in the side venv of ``scripts/kvpress-env.sh``, since kvpress 0.5.5 pins transformers < 5.3:
``press_registry.KVPRESS_ROUTE``) compresses the cache once, at the prefill; decoding then appends every new
token in full. A ``kvpress:<press>`` policy at budget ``b`` is matched in memory to the static dynheads policy at
the same budget: its compression ratio is ``1 - f`` with ``f`` the KV fraction that ``k = round(b * L * H_kv)``
whole KV heads plus ``sink + recent``-token windows hold at the prompt's length, so both start decoding with the
same bytes.

- ``streaming_llm`` (``StreamingLLMPress``, ``n_sink = sink``), ``snapkv`` (``SnapKVPress``), ``expected_attention``
  (``ExpectedAttentionPress``) and ``knorm`` (``KnormPress``): token-level presses at that ratio,
- ``duo_attention``: ``DuoAttentionPress`` driven by a dynheads head list (``presses.head_list_press``): the static
  policy's k best positive-score KV heads keep every token and the others only ``sink`` + ``recent`` (kvpress masks the
  evicted keys of those heads instead of freeing them; the bytes counted are the keys it leaves visible),
- ``head_tokens``: retrieval heads choose the tokens (``presses.head_tokens_press``, ``dynheads.kv.token_votes``): the
  static list's best query heads vote from an observation window and every KV head keeps the same tokens, at that ratio;
  ``head_tokens_predicted``: the same, the voters being the head predictor's best heads for the prompt (the runner
  passes them as ``KVSettings.voters``); ``head_spans``: ``head_tokens`` with every vote carried ``token_votes.SPAN``
  keys forward, so a voted cue keeps the fact after it (``head_spans_predicted``: with the predictor's voters);
  ``head_tokens_layerwise`` / ``head_spans_layerwise``: each layer voted by its own voters (the variant kvpress's
  wrappers drive),
- ``adakv_snapkv``: AdaKV over SnapKV (kvpress's ``AdaKVPress`` wrapping ``SnapKVPress``): each KV head keeps its
  own share of the layer's budget (masked keys),
- ``kvzip``: KVzip (kvpress's ``KVzipPress``, its defaults): keys scored by how much the model attends to them while
  repeating the context, the question-free track's leader on kvpress's leaderboard; it prefills alone,
- ``chunkkv``: ChunkKV (kvpress's ``ChunkKVPress`` over ``SnapKVPress``, its defaults: whole chunks of 20 tokens) and
  ``snapkv_spans``: SnapKV with its scores carried ``SPAN`` keys forward (``head_spans``' span on every head), two
  baselines for a policy that keeps facts whole.

The resident KV of a press row is read from the cache at every decode step (its tokens x KV heads, less the
masked keys), so the table shows what each press actually held.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import cast

import torch
from transformers import DynamicCache

from dynheads.analysis.kvheads import KVHead
from dynheads.config import parse_fields
from dynheads.engine.decoding import DecodingSession, GreedyPolicy, StepResult, decode
from dynheads.errors import DynheadsError, did_you_mean
from dynheads.kv.press_registry import KVPRESS_PRESSES, PressSpec, parse_press
from dynheads.kv.presses import attention_modules, head_list_press, head_tokens_press, require_kvpress
from dynheads.kv.retention import KVResult, KVSettings, kv_head_count, kv_memory, num_kv_heads
from dynheads.kv.token_votes import SPAN, carried
from dynheads.models import LoadedModel, decode_text


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
    _check_buildable(spec)
    return spec


def _check_buildable(spec: PressSpec) -> None:
    """A press registered as a kvpress class is built as ``Class(compression_ratio=..., **knobs)`` (``make_press``):
    one line, before a model loads, for a class that takes no compression ratio (``ThinKPress``,
    ``DuoAttentionPress``) or needs an argument nothing sets (a wrapper's ``press``); they raised a ``TypeError``
    once the model had loaded."""
    entry = KVPRESS_PRESSES.get(spec.name)
    target = entry.target() if entry.is_kvpress else None
    if target is None:
        return
    fields = {f.name: f for f in dataclasses.fields(target) if f.init} if dataclasses.is_dataclass(target) else {}
    how = "register a 'module:function' that builds it, as kvpress:adakv_snapkv is (docs/kv.md)"
    if "compression_ratio" not in fields:
        raise DynheadsError(
            f"kvpress:{spec.name} ({entry.build}) takes no compression_ratio, so no budget or ratio can size it: {how}"
        )
    knobs = [item.partition("=")[0] for item in spec.knobs.split(":")]
    given = {"compression_ratio", *(arg for arg, _ in entry.knobs), *knobs}
    unset = dataclasses.MISSING
    needed = [n for n, f in fields.items() if f.default is unset and f.default_factory is unset and n not in given]
    if needed:
        raise DynheadsError(f"kvpress:{spec.name} ({entry.build}) needs {', '.join(needed)}, which nothing sets: {how}")


def press_knobs(spec: PressSpec) -> dict:
    """The knobs ``spec`` sets, cast to its kvpress press's field types; those the budget or the KV settings set
    (the compression ratio, the entry's ``knobs``) are refused, and a dynheads-built press takes none."""
    entry = KVPRESS_PRESSES.get(spec.name)
    if not spec.knobs:
        return {}
    if not entry.is_kvpress:
        raise DynheadsError(f"kvpress:{spec.name} is built by dynheads from the KV settings: it takes no knobs")
    set_elsewhere = {"compression_ratio": "the budget (or --ratios)"}
    set_elsewhere.update({arg: "--" + key.replace("_", "-") for arg, key in entry.knobs})
    for item in spec.knobs.split(":"):
        key = item.partition("=")[0]
        if key in set_elsewhere:
            raise DynheadsError(f"kvpress:{spec.name}'s {key} is set by {set_elsewhere[key]}, not by a knob")
    return parse_fields(f"kvpress:{spec.name}", spec.knobs.replace(":", ","), entry.target(), set(set_elsewhere))


def matched_ratio(lm: LoadedModel, settings: KVSettings, length: int) -> float:
    """Compression ratio holding, at ``length`` cached tokens, the static policy's bytes at the same budget."""
    num_kv = num_kv_heads(lm)
    k = kv_head_count(settings.budget, lm.num_layers, num_kv)
    kept = kv_memory([(i // num_kv, i % num_kv) for i in range(k)], lm, length, settings.sink, settings.recent)
    return 1.0 - kept / (lm.num_layers * num_kv * length)


def make_press(spec: PressSpec, lm: LoadedModel, settings: KVSettings, length: int):
    """The registered press ``spec`` names (``press_registry``) with its knobs, at ``settings``' compression ratio
    or, without one, sized by its budget at ``length`` cached tokens."""
    require_kvpress()
    entry = KVPRESS_PRESSES.get(spec.name)
    ratio = None
    if entry.sizing == "ratio":
        ratio = settings.ratio if settings.ratio is not None else matched_ratio(lm, settings, length)
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


def voted_tokens_layerwise_press(lm: LoadedModel, settings: KVSettings, ratio: float):
    """``kvpress:head_tokens_layerwise``: ``head_tokens`` with each layer voted by its own voters (the variant every
    kvpress wrapper composes with; ``presses.head_tokens_press(..., layerwise=True)``)."""
    return head_tokens_press(settings.voters, ratio, layerwise=True, sink=settings.sink, recent=settings.recent)


def voted_spans_layerwise_press(lm: LoadedModel, settings: KVSettings, ratio: float):
    """``kvpress:head_spans_layerwise``: ``head_spans`` with each layer voted by its own voters."""
    return head_tokens_press(
        settings.voters, ratio, layerwise=True, sink=settings.sink, recent=settings.recent, span=SPAN
    )


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


def adakv_snapkv_press(lm: LoadedModel, settings: KVSettings, ratio: float):
    """``kvpress:adakv_snapkv``: AdaKV over SnapKV as kvpress's leaderboard runs it (``AdaKVPress`` wrapping
    ``SnapKVPress``, their defaults): SnapKV's scores ranked across a layer's KV heads, so each head keeps its own
    share; the evicted keys are masked, and the bytes counted are the keys left visible."""
    kvpress = require_kvpress()
    return kvpress.AdaKVPress(press=kvpress.SnapKVPress(compression_ratio=ratio))


def kvzip_press(lm: LoadedModel, settings: KVSettings, ratio: float):
    """``kvpress:kvzip``: KVzip as kvpress ships it (``KVzipPress``, its defaults): after the prefill the model is
    asked to repeat the context, chunk by chunk, and each key is scored by the attention it gets while doing so (two
    to three prefills more). kvpress builds that prompt with the tokenizer it loads from the model's folder
    (``config.name_or_path``), so a model without one is refused here, in one line."""
    _check_folder_tokenizer(lm.model.config.name_or_path, "kvzip")
    press_class = require_kvpress().KVzipPress
    _say_once(logging.getLogger(press_class.__module__))
    return press_class(compression_ratio=ratio)


class _OnceEach(logging.Filter):
    """Lets each distinct message through once."""

    def __init__(self) -> None:
        super().__init__()
        self.said: set[str] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message in self.said:
            return False
        self.said.add(message)
        return True


@functools.cache
def _say_once(logger: logging.Logger) -> None:
    """Each of ``logger``'s messages once per process: kvpress's ``KVzipPress`` warns of its cost when it is built,
    and a run builds one press per prompt."""
    logger.addFilter(_OnceEach())


@functools.lru_cache(maxsize=8)
def _check_folder_tokenizer(source: str, press: str) -> None:
    from transformers import AutoTokenizer

    try:
        AutoTokenizer.from_pretrained(source)
    except (OSError, ValueError, TypeError) as error:
        where = repr(source) if source else "this model (built from a config, no folder)"
        raise DynheadsError(
            f"kvpress:{press} builds its own prompt with the tokenizer it loads from the model's folder, and "
            f"{where} has none ({type(error).__name__}); load the model from a folder, a hub id or a .gguf file"
        ) from None


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
    compress_until: int | None = None,
) -> KVResult:
    """Greedy decoding with the kvpress press ``spec`` names (with its knobs) applied to the prefill of the prompt
    minus its last token (as ``kv.retention`` prefills), the resident KV read from the cache at every decode step;
    ``compress_until``: only the first that many tokens are compressed (``press_generate_all``)."""
    (result,) = press_generate_all(
        lm, input_ids, [(spec, settings)], max_new_tokens, stop_at_eos=stop_at_eos, compress_until=compress_until
    )
    return result


def press_generate_all(
    lm: LoadedModel,
    input_ids: Sequence[int],
    arms: Sequence[tuple[PressSpec, KVSettings]],
    max_new_tokens: int,
    *,
    stop_at_eos: bool = True,
    share_prefill: bool = True,
    compress_until: int | None = None,
) -> list[KVResult]:
    """``press_generate`` for several presses of one prompt from one prefill: kvpress compresses a layer's cache
    after that layer's attention, so the prefill's passes are the same under every press; each press compresses its
    own copy of every layer's keys and values in that pass (``_pressing``) and then decodes alone from its cache.
    Each result equals the press's own prefill and decoding (``test_presses_sharing_a_prefill_equal_each_alone``).
    A press with its own context (one that overrides kvpress's ``BasePress.__call__``, e.g. a press that also acts
    while decoding) prefills alone under that context, and so does every press with ``share_prefill=False`` (kvpress's
    own way, the reference). Memory: a press that compresses at the last layer
    (``head_tokens``) or masks instead of freeing (``duo_attention``) holds a full copy of the cache until then.

    The two tracks of kvpress's leaderboard: by default the whole prompt but its last token is compressed, the
    question included, so a press sees it (question-aware); ``compress_until = c`` compresses only the first ``c``
    tokens (the context), then feeds the rest of the prompt uncompressed, at its true positions, on each press's
    pruned cache (question-free: the press sees no question)."""
    if len(input_ids) < 2:
        raise DynheadsError("a kvpress policy needs a prompt of at least 2 tokens")
    compressed = len(input_ids) - 1 if compress_until is None else compress_until
    if not 1 <= compressed <= len(input_ids) - 1:
        raise DynheadsError(f"compress_until={compress_until} lies outside the prompt's 1..{len(input_ids) - 1} tokens")
    for spec, settings in arms:
        _check_drivers(spec, settings)
    presses = [make_press(spec, lm, settings, compressed) for spec, settings in arms]
    shared = [i for i, press in enumerate(presses) if share_prefill and not _has_own_context(press)]
    alone = [([i], False) for i in range(len(presses)) if i not in shared]
    results: list[KVResult | None] = [None] * len(arms)
    for group, share in ([(shared, True)] if shared else []) + alone:
        pressed = _prefilled(lm, input_ids, [presses[i] for i in group], max_new_tokens, share, compressed)
        for i, (session, masked) in zip(group, pressed, strict=True):
            results[i] = _decode_pressed(lm, session, masked, *arms[i], max_new_tokens, stop_at_eos)
    return cast(list[KVResult], results)  # every group filled its slots


def _has_own_context(press) -> bool:
    return type(press).__call__ is not require_kvpress().presses.base_press.BasePress.__call__


def _prefilled(
    lm: LoadedModel, input_ids: Sequence[int], presses: list, max_new_tokens: int, share: bool, compressed: int
) -> list[tuple[DecodingSession, dict[int, object] | None]]:
    """One session per press, its cache pruned by the press from one prefill of the prompt's first ``compressed``
    tokens, then the rest of the prompt but its last token fed uncompressed, with the keys a head-level press masks
    per layer; ``share`` off: one press under its own kvpress context, which leaves those keys on the modules
    (None)."""
    # a pruned cache is shorter than the text: each token gets its true position (as kvpress's pipeline)
    prefilled = DecodingSession(lm, input_ids, max_new_tokens=max_new_tokens, probed=False, text_positions=True)
    rest = len(input_ids) - 1 - compressed
    if len(presses) == 1 and not share:
        # inference mode around the press's context too: a press that runs the model itself when its context closes
        # (KVzip's reconstruction passes) would otherwise keep every activation of them for a backward pass
        with torch.inference_mode(), presses[0](lm.model):
            prefilled.forward(compressed)
        sessions: list[tuple[DecodingSession, dict[int, object] | None]] = [(prefilled, None)]
    else:
        caches = [DynamicCache(config=lm.model.config) for _ in presses]
        masks: list[dict[int, object]] = [{} for _ in presses]
        with _pressing(lm.model, presses, caches, masks):
            prefilled.forward(compressed)
        sessions = list(zip(prefilled.copies(len(presses), caches), masks, strict=True))
    for session, masked in sessions if rest else ():  # question-free: the question after the compressed context
        with _masking(lm, masked, clear=False):  # its decoding clears them
            _feed_rest(lm, session, masked, rest)
    return sessions


def _feed_rest(lm: LoadedModel, session: DecodingSession, masked: dict[int, object] | None, rest: int) -> None:
    """The question of the question-free track, uncompressed, in one pass; a token per pass where the press masks
    keys: kvpress hides a masked key behind a fake key that must score below every query of the pass (its
    ``search_hyperplane``), found for one token's queries as every decode step needs, but not always for a
    question's many (random models raise there). The two feeds give the same cache and logits up to rounding."""
    if not _masks_keys(lm, masked):
        session.forward(rest)
        return
    for _ in range(rest):
        session.forward(1)


def _masks_keys(lm: LoadedModel, masked: dict[int, object] | None) -> bool:
    """Whether a press masks keys: per layer in ``masked``, or on the modules for a press under its own context."""
    if masked is not None:
        return any(indices is not None for indices in masked.values())
    return any(getattr(module, "masked_key_indices", None) is not None for module in attention_modules(lm.model))


def _check_drivers(spec: PressSpec, settings: KVSettings) -> None:
    """A one-line error when the press's head list or predicted voters are missing."""
    entry = KVPRESS_PRESSES.get(spec.name)
    if entry.needs_static and not (settings.static_ranking or settings.voters):
        raise DynheadsError(f"kvpress:{spec.name} is driven by a dynheads head list: pass --static FILE")
    if entry.needs_probe and not settings.voters:
        raise DynheadsError(
            f"kvpress:{spec.name} votes with the head predictor's heads for the prompt: pass --predictor"
        )


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
    with _masking(lm, masked):
        (decoded,) = decode([session], [policy], max_new_tokens)
    result.tokens, result.stop_reason = decoded.tokens, decoded.stop_reason
    result.text = decode_text(lm.tokenizer, result.tokens, skip_special_tokens=True)
    return result


@contextmanager
def _masking(lm: LoadedModel, masked: dict[int, object] | None, *, clear: bool = True) -> Iterator[None]:
    """A head-level press's masked keys on the attention modules, where kvpress reads them, for the block (None: a
    press under its own context, which left them there itself); ``clear``ed after, so the next press or sample
    never sees them (a pass before the press's decoding keeps them)."""
    attention = attention_modules(lm.model)
    try:
        if masked is not None:
            for module in attention:
                module.masked_key_indices = masked.get(module.layer_idx)
        yield
    finally:
        for module in attention if clear else ():
            module.masked_key_indices = None  # type: ignore[assignment]  # kvpress's attribute, not nn.Module's


def _resident(cache, attention) -> int:
    """Tokens x KV heads the cache holds, less the keys kvpress masks (head-level presses do not free them)."""
    held = sum(int(layer.keys.shape[1] * layer.keys.shape[2]) for layer in cache.layers)
    masked = sum(len(m.masked_key_indices[0]) for m in attention if getattr(m, "masked_key_indices", None))
    return held - masked
