"""The kvpress presses that ``dynheads kv`` runs as ``kvpress:<press>`` policies: a registry of lazy entries
(issue 35).

An entry names what builds its press as ``"module:attribute"`` and is imported only when a run builds one, so
listing the presses (``--help``, an unknown name's error) imports neither kvpress nor torch. ``kvpress:Class`` is a
class of kvpress, built with the compression ratio and its ``knobs``; any other target is a dynheads function
``build(lm, settings, ratio)``. ``sizing`` says how a KV budget sets the press's size: ``ratio``, a compression
ratio holding the bytes of the static policy at the same budget (``presses.matched_ratio``), or ``heads``, the
budget's whole KV heads of the static list (``ratio`` is then None). ``needs_static``: the press is driven by the
static head list (``--static``); ``needs_probe``: by the head predictor (``--predictor``), whose best heads for each
prompt the runner passes as the settings' voters. Register one from anywhere (a test file, a notebook)::

    KVPRESS_PRESSES.register("tova", PressEntry("kvpress:TOVAPress"), help="TOVA: the last query's attention")

A policy may set a kvpress press's own knobs (the fields of its dataclass) after its name, colon-separated,
``kvpress:snapkv:window_size=32:kernel_size=7`` (``parse_press``; colons, since policies are a comma-separated
list); the compression ratio is the budget's and the knobs an entry maps to KV settings are those settings', so
neither is set there.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from dynheads.lazy import imported
from dynheads.registry import Registry

KVPRESS = "kvpress:"  # a build target in kvpress's own namespace


@dataclass(frozen=True)
class PressEntry:
    """A kvpress press in ``KVPRESS_PRESSES``: what builds it (``build``, a kvpress class or a dynheads
    ``module:function``), whether it is sized by a compression ratio or by KV heads, what head sources it reads
    (``needs_static``, ``needs_probe``) and which of its arguments read a KV setting (``knobs``). See docs/kv.md."""

    build: str  # "kvpress:SnapKVPress", or "module:function" taking (lm, settings, ratio)
    sizing: Literal["ratio", "heads"] = "ratio"
    needs_static: bool = False  # driven by the static head list (--static FILE)
    needs_probe: bool = False  # driven by the head predictor's heads for each prompt (--predictor DIR)
    knobs: tuple[tuple[str, str], ...] = ()  # (press argument, KV setting it reads), e.g. ("n_sink", "sink")
    # kvpress's own method composed by a dynheads function at kvpress's defaults (ChunkKV over SnapKV): compared
    # as kvpress's, not as a press dynheads builds
    composes_kvpress: bool = False

    def target(self) -> Any:
        """What builds the press: the kvpress class or the dynheads function, imported now."""
        return imported(self.build)  # "kvpress:SnapKVPress" names kvpress's own class

    @property
    def is_kvpress(self) -> bool:
        """Built directly from a kvpress class (its knobs are that class's fields)."""
        return self.build.startswith(KVPRESS)

    @property
    def is_kvpress_method(self) -> bool:
        """kvpress's own method (its class, or its presses composed at their defaults), not one dynheads builds."""
        return self.is_kvpress or self.composes_kvpress


@dataclass(frozen=True)
class PressSpec:
    """A ``kvpress:<press>[:key=value:...]`` policy: the registered press and the knobs it sets (as written; cast
    to the press's field types when the press is built, ``presses.make_press``)."""

    name: str
    knobs: str = ""  # "window_size=32:kernel_size=7"


def parse_press(policy: str) -> PressSpec:
    """``kvpress:snapkv:window_size=32`` -> ``PressSpec("snapkv", "window_size=32")``."""
    name, _, knobs = policy.removeprefix(KVPRESS).partition(":")
    return PressSpec(name, knobs)


# How to get kvpress: a side venv, never the extra in the main environment (kvpress 0.5.5 pins transformers<5.3 and
# would move transformers, pandas, huggingface_hub and tokenizers down there)
KVPRESS_ROUTE = (
    "make the side venv with 'bash scripts/kvpress-env.sh' (kvpress 0.5.5 with transformers 5.2, beside this "
    "environment) and run the command with the python it prints, $(bash scripts/kvpress-env.sh) -m dynheads kv ...; "
    "not pip install 'dynheads[kvpress]' here, which would downgrade transformers and pandas; its first run writes "
    "a de-quantised copy of the model for that transformers (about 517 MB for the embedded model) into the cache"
)

# kvpress's leaderboard tracks: what the press compresses (``press_runs.press_generate_all``'s ``compress_until``)
TRACKS = {
    "question-aware": "the whole prompt is compressed, the question included: a press sees it",
    "question-free": "only the context is compressed; the question and the prompt's end follow uncompressed",
}
KVPRESS_PRESSES = Registry[PressEntry]("kvpress press")
KVPRESS_PRESSES.register(
    "streaming_llm",
    PressEntry("kvpress:StreamingLLMPress", knobs=(("n_sink", "sink"),)),
    help="StreamingLLM: the sink and the most recent tokens",
)
KVPRESS_PRESSES.register("snapkv", PressEntry("kvpress:SnapKVPress"), help="SnapKV: an observation window's votes")
KVPRESS_PRESSES.register(
    "expected_attention", PressEntry("kvpress:ExpectedAttentionPress"), help="the attention future queries expect"
)
KVPRESS_PRESSES.register("knorm", PressEntry("kvpress:KnormPress"), help="the keys of smallest norm")
KVPRESS_PRESSES.register(
    "kvzip",
    PressEntry("dynheads.kv.press_runs:kvzip_press", composes_kvpress=True),
    help="KVzip: the keys the model attends to while repeating the context (kvpress's KVzipPress; 2-3 prefills more)",
)
KVPRESS_PRESSES.register(
    "chunkkv",
    PressEntry("dynheads.kv.press_runs:chunkkv_press", composes_kvpress=True),
    help="ChunkKV over SnapKV's scores: whole chunks of 20 tokens kept (kvpress's ChunkKVPress, its defaults)",
)
KVPRESS_PRESSES.register(
    "adakv_snapkv",
    PressEntry("dynheads.kv.press_runs:adakv_snapkv_press", composes_kvpress=True),
    help="AdaKV over SnapKV: SnapKV's scores ranked across a layer's KV heads (kvpress's AdaKVPress, its defaults)",
)
KVPRESS_PRESSES.register(
    "duo_attention",
    PressEntry("dynheads.kv.press_runs:duo_attention_press", sizing="heads", needs_static=True),
    help="DuoAttention's press driven by the static list: its best KV heads whole, the others streaming",
)
KVPRESS_PRESSES.register(
    "head_tokens",
    PressEntry("dynheads.kv.press_runs:voted_tokens_press", needs_static=True),
    help="retrieval heads choose the tokens every KV head keeps (dynheads.kv.token_votes)",
)
KVPRESS_PRESSES.register(
    "head_tokens_layerwise",
    PressEntry("dynheads.kv.press_runs:voted_tokens_layerwise_press", needs_static=True),
    help="as head_tokens, each layer voted by its own voters (composes with every kvpress wrapper)",
)
KVPRESS_PRESSES.register(
    "head_spans",
    PressEntry("dynheads.kv.press_runs:voted_spans_press", needs_static=True),
    help="as head_tokens, each vote carrying the 32 keys after it (a fact follows its cue; token_votes.SPAN)",
)
KVPRESS_PRESSES.register(
    "head_spans_layerwise",
    PressEntry("dynheads.kv.press_runs:voted_spans_layerwise_press", needs_static=True),
    help="as head_spans, each layer voted by its own voters (composes with every kvpress wrapper)",
)
KVPRESS_PRESSES.register(
    "snapkv_spans",
    PressEntry("dynheads.kv.press_runs:snapkv_spans_press"),
    help="SnapKV with each score carried 32 keys forward: head_spans' span on every head (the span's ablation)",
)
KVPRESS_PRESSES.register(
    "head_tokens_predicted",
    PressEntry("dynheads.kv.press_runs:voted_tokens_press", needs_probe=True),
    help="as head_tokens, the voters being the head predictor's best heads for each prompt (--predictor)",
)
KVPRESS_PRESSES.register(
    "head_spans_predicted",
    PressEntry("dynheads.kv.press_runs:voted_spans_press", needs_probe=True),
    help="as head_spans, the voters being the head predictor's best heads for each prompt (--predictor)",
)
