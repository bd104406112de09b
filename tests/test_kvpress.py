"""kvpress side by side: ``kvpress:<press>`` policies at the static policy's memory, a dynheads head list as a kvpress
press, and the one-line error without the extra.

kvpress 0.5.5 pins transformers < 5.3, so these tests run where the extra is installed: ``scripts/test.sh`` builds
that environment (``scripts/kvpress-env.sh``) and runs this file there; elsewhere the kvpress tests skip.
"""

from __future__ import annotations

import importlib.util
import json
import logging
from dataclasses import replace
from itertools import product

import numpy as np
import pytest
import torch
from zoo import random_prompt, tiny_model, tiny_sdpa_lm

from dynheads.errors import DynheadsError
from dynheads.kv.arms import resolve_arms
from dynheads.kv.press_registry import PressSpec, parse_press
from dynheads.kv.press_runs import check_press
from dynheads.kv.retention import KVSettings, kv_generate, num_kv_heads
from dynheads.models import LoadedModel, with_cache

needs_kvpress = pytest.mark.skipif(
    importlib.util.find_spec("kvpress") is None,
    reason="kvpress extra not installed (scripts/kvpress-env.sh makes an environment)",
)


class _Sample:
    def __init__(self, ids):
        self.input_ids, self.needle_positions = ids, []


@pytest.fixture(scope="module")
def lm():
    return tiny_sdpa_lm()


def test_without_the_extra_a_one_line_error_names_it(monkeypatch):
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
    with pytest.raises(DynheadsError, match=r"bash scripts/kvpress-env.sh") as error:
        check_press("kvpress:streaming_llm")
    assert "\n" not in str(error.value)
    with pytest.raises(DynheadsError, match="unknown kvpress policy"):
        check_press("kvpress:nonsense")


@needs_kvpress
@pytest.mark.parametrize("press", ["streaming_llm", "snapkv", "expected_attention", "knorm"])
def test_token_presses_start_at_the_static_policys_memory(lm, press):
    from dynheads.kv.press_runs import press_generate

    ids = random_prompt(1)
    ranking = ((0, 0), (1, 1), (2, 0))
    settings = KVSettings(policy="static", budget=0.34, sink=2, recent=8, static_ranking=ranking)
    static = kv_generate(lm, _Sample(ids), settings, max_new_tokens=4, stop_at_eos=False)
    pressed = press_generate(lm, ids, PressSpec(press), settings, 4, stop_at_eos=False)
    assert len(pressed.tokens) == 4 and pressed.total_kv == static.total_kv
    # the same bytes at the first decode step, up to kvpress's rounding (one token per KV head)
    assert abs(pressed.kept_kv[0] - static.kept_kv[0]) <= 6
    assert pressed.kept_kv[-1] - pressed.kept_kv[0] == 3 * 6  # decoding appends every token in full


@needs_kvpress
def test_decoded_tokens_keep_their_true_positions_after_pruning(lm):
    """kvpress prunes the prefill, so the cache is shorter than the text: every decoded token must still get its
    position in the text (RoPE), not the pruned cache's length."""
    from dynheads.kv.press_runs import press_generate

    ids, seen = random_prompt(10), []
    hook = lm.model.model.register_forward_pre_hook(
        lambda module, args, kwargs: (
            seen.append(kwargs["position_ids"].tolist())
            if kwargs.get("input_ids") is not None and kwargs["input_ids"].shape[1] == 1
            else None
        ),
        with_kwargs=True,
    )
    try:
        settings = KVSettings(policy="static", budget=0.34, sink=2, recent=8, static_ranking=((0, 0),))
        pressed = press_generate(lm, ids, PressSpec("streaming_llm"), settings, 3, stop_at_eos=False)
    finally:
        hook.remove()
    assert pressed.kept_kv[0] < pressed.total_kv[0] // 2  # pruned
    assert seen == [[[99]], [[100]], [[101]]]


@needs_kvpress
def test_a_head_list_press_keeps_exactly_its_heads_whole(lm):
    from transformers import DynamicCache

    from dynheads.kv.presses import head_list_press

    press = head_list_press([(0, 1), (2, 0)], sink=2, recent=8)
    cache = DynamicCache(config=lm.model.config)
    ids = torch.tensor([random_prompt(2)])
    with torch.inference_mode(), press(lm.model):
        lm.model(input_ids=ids, **with_cache(lm.model, cache), use_cache=True)
    assert press.streaming_mask.tolist() == [[True, False], [True, True], [False, True]]
    for layer, module in enumerate(lm.model.model.layers):
        masked = module.self_attn.masked_key_indices
        heads = set(masked[1].tolist())
        assert heads == {kv for kv in range(2) if press.streaming_mask[layer, kv]}
        assert len(masked[2]) == len(heads) * (100 - 2 - 8)  # every key between the sinks and the window
        module.self_attn.masked_key_indices = None


@needs_kvpress
def test_every_head_whole_is_the_unmodified_model(lm):
    from dynheads.kv.press_runs import press_generate

    ids = random_prompt(3)
    every = tuple((layer, kv) for layer in range(3) for kv in range(2))
    settings = KVSettings(policy="static", budget=1.0, sink=2, recent=8, static_ranking=every)
    pressed = press_generate(lm, ids, PressSpec("duo_attention"), settings, 6, stop_at_eos=False)
    full = kv_generate(lm, _Sample(ids), KVSettings(policy="full"), max_new_tokens=6, stop_at_eos=False)
    assert pressed.tokens == full.tokens and pressed.kept_kv == pressed.total_kv


@needs_kvpress
def test_press_from_a_thresholded_export(tmp_path, lm):
    from dynheads.analysis.kvheads import write_duo_attention
    from dynheads.kv.presses import press_from_export

    matrix = np.zeros((3, 2))
    matrix[1, 0], matrix[2, 1] = 0.8, 0.3
    write_duo_attention(tmp_path, matrix, sink=2, recent=8, aggregation="max", source="x", num_heads=4, full_heads=4)
    press = press_from_export(tmp_path)
    press.post_init_from_model(lm.model)
    assert (~press.streaming_mask).nonzero().tolist() == [[1, 0], [2, 1]]  # the 2 scored heads; 2 short of 4
    assert (press.sink_size, press.recent_size) == (2, 8)
    write_duo_attention(tmp_path / "scores", matrix, aggregation="max", source="x", num_heads=4)
    with pytest.raises(DynheadsError, match="say how many"):
        press_from_export(tmp_path / "scores")
    assert press_from_export(tmp_path / "scores", 1).kv_heads == ((1, 0),)
    # Arguments that were ignored or read as a slice, and an export made for a model of another shape: one line.
    with pytest.raises(DynheadsError, match="is a 0/1 pattern of 2 whole KV heads: give no full_heads"):
        press_from_export(tmp_path, 1)
    for bad in (0, -1, 1.5):
        with pytest.raises(DynheadsError, match="full_heads is a number of KV heads >= 1"):
            press_from_export(tmp_path / "scores", bad)  # type: ignore[arg-type]
    write_duo_attention(tmp_path / "wide", np.zeros((3, 3)) + 0.5, aggregation="max", source="x", num_heads=6)
    wide = press_from_export(tmp_path / "wide", 2)
    with pytest.raises(DynheadsError, match="made for a model of 3 layers x 3 KV heads, not this one's 3 x 2"):
        wide.post_init_from_model(lm.model)


@needs_kvpress
def test_dynheads_kv_runs_a_kvpress_row_at_matched_bytes(tmp_path, embedded):
    import pandas as pd

    from dynheads.experiments.kv import KVConfig, run_kv
    from dynheads.runs import RunDir

    static_run = RunDir(tmp_path / "static")
    static_run.start("static", {"seed": 0}, None)
    static_run.save_sample({"sample_id": "static-x", "seed": 1, "answer": "not-an-evaluation-uuid"})
    (tmp_path / "static" / "list.json").write_text('["18-6", "17-3", "17-4", "16-0", "20-2", "14-8"]')
    config = KVConfig(
        policies=("full", "static", "kvpress:streaming_llm", "kvpress:duo_attention"),
        budgets=(0.05,),
        lengths=(200,),
        depths=(0.5,),
        runs=1,
        max_new_tokens=6,
        static=str(tmp_path / "static" / "list.json"),
    )
    run = run_kv(config, tmp_path / "kv", lm=embedded, progress=False)
    table = pd.read_csv(run.path / "table.csv").set_index("policy")
    assert set(table.index) == {"full", "static", "kvpress:streaming_llm", "kvpress:duo_attention"}
    static, streaming = table.loc["static"], table.loc["kvpress:streaming_llm"]
    # matched at the prefill: within one decoded token per KV head of the static policy's resident fraction
    assert abs(streaming["kv_fraction"] - static["kv_fraction"]) < 6 / 200
    assert table.loc["kvpress:duo_attention", "kv_heads"] == static["kv_heads"] == 5  # 5 % of 90 KV heads -> 5
    assert pd.isna(streaming["kv_heads"])  # a token press keeps no whole head: no count, not 0
    # Per-sample records are strict JSON: a token press's undefined head count is null, never NaN.
    strict = [json.loads(path.read_text(), parse_constant=_no_constant) for path in (run.path / "samples").iterdir()]
    assert {record["policy"]: record["mean_kv_heads"] for record in strict}["kvpress:streaming_llm"] is None


def _no_constant(name: str) -> None:
    raise AssertionError(f"{name} in a record: strict JSON has no NaN or Infinity")


def _kept_positions(compressed, full) -> list[list[int]]:
    """Per KV head of one layer's cache: the prompt positions whose keys the compressed cache holds."""
    return [
        sorted(int((full[0, kv] - key).abs().sum(-1).argmin()) for key in compressed[0, kv])
        for kv in range(full.shape[1])
    ]


@needs_kvpress
@pytest.mark.parametrize("span", [0, 6])
def test_the_head_token_press_runs_in_kvpress_pipeline_and_keeps_the_policys_tokens(span):
    from kvpress import KVPressTextGenerationPipeline
    from transformers import DynamicCache
    from zoo import byte_tokenizer

    from dynheads.kv.presses import head_tokens_press
    from dynheads.kv.token_votes import head_tokens, kept_count

    tokenizer = byte_tokenizer("{% for m in messages %}<u>{{ m.content }}</u>{% endfor %}<a>")
    model = tiny_model("llama", vocab_size=len(tokenizer))
    model.set_attn_implementation("sdpa")
    lm = LoadedModel(model=model, tokenizer=tokenizer, name="llama", revision="random")
    voters, context = ((0, 1), (2, 3), (1, 0)), "the magic word is tapir; the sky is green, and cats sleep a lot. Q?"
    press = head_tokens_press(voters, 0.6, sink=2, recent=8, window=16, span=span)
    pipe = KVPressTextGenerationPipeline(model=model, tokenizer=tokenizer)
    cache = DynamicCache(config=model.config)
    pipe(context, question="what?", press=press, cache=cache, max_new_tokens=2)
    context_ids = pipe.preprocess(context, ["what?"], "", 10_000)["context_ids"]
    full = DynamicCache(config=model.config)
    with torch.inference_mode():
        model.model(input_ids=context_ids, past_key_values=full)
    # dynheads prefills the prompt minus its last token: the pipeline's context is that prefill
    expected = head_tokens(lm, [*context_ids[0].tolist(), 0], voters, 0.6, sink=2, recent=8, window=16, span=span)
    assert len(expected) == kept_count(context_ids.shape[1], 0.6)
    for layer in range(3):  # every KV head of every layer keeps the policy's tokens
        assert _kept_positions(cache.layers[layer].keys, full.layers[layer].keys) == [expected, expected]


def own_context_press(lm, settings, ratio):
    """StreamingLLM under a press class that overrides kvpress's context: it prefills alone."""
    from kvpress import StreamingLLMPress

    class OwnContextPress(StreamingLLMPress):
        def __call__(self, model):
            return super().__call__(model)

    return OwnContextPress(compression_ratio=ratio, n_sink=settings.sink)


@needs_kvpress
def test_presses_sharing_a_prefill_equal_each_alone(lm):
    """Issue 36 item 1 for the KV runner's presses: every registered press, at two budgets, from one prefill they
    share decodes the same tokens with the same resident KV at every step as under its own kvpress context."""
    from dynheads.kv.press_registry import KVPRESS_PRESSES, PressEntry
    from dynheads.kv.press_runs import press_generate_all

    KVPRESS_PRESSES.register("own_context", PressEntry(f"{__name__}:own_context_press"), help="its own context")
    try:
        ids = random_prompt(7, 90)
        base = KVSettings(policy="static", budget=0.34, sink=2, recent=8, static_ranking=((0, 0), (1, 1), (2, 0)))
        arms = [
            (PressSpec(name), replace(base, budget=budget, voters=((1, 2), (0, 3))))
            for name in KVPRESS_PRESSES.names()
            if name != "kvzip"  # it loads a tokenizer from the model's folder, which this model lacks: tested below
            for budget in (0.34, 0.67)
        ]
        shared = press_generate_all(lm, ids, arms, 5, stop_at_eos=False)
        alone = press_generate_all(lm, ids, arms, 5, stop_at_eos=False, share_prefill=False)
    finally:
        KVPRESS_PRESSES.unregister("own_context")
    for (spec, _), one, other in zip(arms, shared, alone, strict=True):
        assert (one.tokens, one.kept_kv, one.total_kv) == (other.tokens, other.kept_kv, other.total_kv), spec
    assert len({tuple(result.tokens) for result in alone}) > 1  # the presses decode differently: the test can fail
    assert len({result.kept_kv[0] for result in alone}) > 2


@needs_kvpress
def test_kvzip_warns_of_its_cost_once_a_process(tiny_lm, caplog):
    """kvpress's ``KVzipPress`` logs its cost warning whenever it is built, and a run builds one press per prompt:
    the warning is said once, whatever the number of prompts (other messages of that logger still pass)."""
    from dynheads.kv.press_runs import make_press

    settings = KVSettings(policy="static", budget=0.9, ratio=0.5)
    with caplog.at_level(logging.WARNING):
        presses = [make_press(PressSpec("kvzip"), tiny_lm, settings, 100) for _ in range(3)]
        logging.getLogger(type(presses[0]).__module__).warning("another message")
    said = [record.getMessage() for record in caplog.records]
    assert len(presses) == 3 and sum("KVzipPress requires" in message for message in said) == 1, said
    assert "another message" in said


@needs_kvpress
def test_kvzip_keeps_the_ratios_share_and_refuses_a_model_without_a_tokenizer(tiny_lm, lm):
    """KVzip (kvpress's ``KVzipPress``) prefills alone under its own context, asks the model to repeat the context
    and keeps the best-scored keys across all layers: the first step holds (1 - ratio) of the compressed prompt
    per KV head (the evicted keys masked), and it decodes. It tokenises its repeat prompt with the tokenizer it
    loads from the model's folder: a model built from a config has none and is refused in one line. Its
    reconstruction passes (the model run by the press when its context closes) run in inference mode: with autograd
    on they kept every activation, and a 4k-token prompt of Qwen2.5-Coder-0.5B took 24 GB (killed) instead of 4."""
    from dynheads.kv.press_runs import press_generate_all

    ids = random_prompt(11, 120)
    heads, compressed = tiny_lm.num_layers * num_kv_heads(tiny_lm), len(ids) - 1
    passes: list[bool] = []  # inference mode at each pass of the model's body: the prefill's and the press's
    hook = tiny_lm.model.base_model.register_forward_pre_hook(
        lambda module, args: passes.append(torch.is_inference_mode_enabled())
    )
    try:
        for ratio in (0.25, 0.75):
            settings = KVSettings(policy="static", budget=0.9, ratio=ratio)
            (kvzip,) = press_generate_all(tiny_lm, ids, [(PressSpec("kvzip"), settings)], 4, stop_at_eos=False)
            assert abs(kvzip.kept_kv[0] / heads - ((1 - ratio) * compressed + 1)) <= 1, ratio
            assert len(kvzip.tokens) == 4 and kvzip.kept_kv[0] < kvzip.total_kv[0]
    finally:
        hook.remove()
    assert len(passes) > 2 * 4 and all(passes)  # more than the prefill and the decode steps: the press's passes too
    with pytest.raises(DynheadsError, match="tokenizer it loads from the model's folder") as error:
        press_generate_all(lm, ids, [(PressSpec("kvzip"), settings)], 4)
    assert "\n" not in str(error.value)


@needs_kvpress
def test_head_tokens_in_dynheads_kv_hold_snapkvs_bytes(lm):
    from dynheads.kv.press_runs import press_generate

    ids = random_prompt(5, 120)
    settings = KVSettings(policy="static", budget=0.34, sink=2, recent=8, static_ranking=((0, 0),), voters=((1, 2),))
    tokens = press_generate(lm, ids, PressSpec("head_tokens"), settings, 4, stop_at_eos=False)
    snapkv = press_generate(lm, ids, PressSpec("snapkv"), settings, 4, stop_at_eos=False)
    assert tokens.kept_kv == snapkv.kept_kv and tokens.kept_kv[0] < tokens.total_kv[0] // 2
    with pytest.raises(DynheadsError, match="driven by a dynheads head list"):
        press_generate(lm, ids, PressSpec("head_tokens"), KVSettings(policy="static", budget=0.34), 4)


@needs_kvpress
def test_head_spans_and_chunkkv_run_in_dynheads_kv_at_the_matched_ratio(lm):
    """head_spans is head_tokens with the fitted span (the same bytes, other tokens); chunkkv keeps whole chunks of
    SnapKV's scores, so its bytes are the matched ratio's rounded to whole chunks."""
    from dynheads.kv.press_runs import make_press, matched_ratio, press_generate
    from dynheads.kv.presses import head_tokens_press
    from dynheads.kv.token_votes import SPAN

    ids = random_prompt(5, 120)
    settings = KVSettings(policy="static", budget=0.34, sink=2, recent=8, static_ranking=((0, 0),), voters=((1, 2),))
    spans = press_generate(lm, ids, PressSpec("head_spans"), settings, 4, stop_at_eos=False)
    tokens = press_generate(lm, ids, PressSpec("head_tokens"), settings, 4, stop_at_eos=False)
    assert spans.kept_kv == tokens.kept_kv
    built = make_press(PressSpec("head_spans"), lm, settings, len(ids) - 1)
    reference = head_tokens_press(((1, 2),), matched_ratio(lm, settings, len(ids) - 1), sink=2, recent=8, span=SPAN)
    assert built == reference
    chunks = press_generate(lm, ids, PressSpec("chunkkv"), settings, 4, stop_at_eos=False)
    chunk = make_press(PressSpec("chunkkv"), lm, settings, len(ids) - 1)
    length, ratio = len(ids) - 1, matched_ratio(lm, settings, len(ids) - 1)
    chunk_count = -(-length // chunk.chunk_length)
    assert chunk.compression_ratio == ratio and type(chunk.press).__name__ == "SnapKVPress"
    kept_chunks, short = int(chunk_count * (1 - ratio)), length % chunk.chunk_length  # the last chunk: 119 % 20
    held = (kept_chunks * chunk.chunk_length, (kept_chunks - 1) * chunk.chunk_length + short)  # is it kept?
    kv_heads = lm.model.config.num_key_value_heads  # each layer keeps its own chunks, the new token besides
    possible = {kv_heads * sum(tokens + 1 for tokens in layers) for layers in product(held, repeat=lm.num_layers)}
    assert chunks.kept_kv[0] in possible and len(chunks.tokens) == 4


@needs_kvpress
@pytest.mark.parametrize("ratio", [0.25, 0.75])
def test_adakv_snapkv_holds_snapkvs_bytes_shared_unevenly_over_the_kv_heads(lm, ratio):
    """kvpress's leaderboard's AdaKV-SnapKV: SnapKV's scores ranked over a layer's KV heads, so the layer keeps
    SnapKV's count of keys (the evicted ones masked, not counted) while its heads keep different shares."""
    from dynheads.kv.press_runs import make_press, press_generate
    from dynheads.kv.presses import attention_modules

    ids = random_prompt(3, 120)
    settings = KVSettings(policy="static", budget=0.9, ratio=ratio)
    press = make_press(PressSpec("adakv_snapkv"), lm, settings, len(ids) - 1)
    assert type(press).__name__ == "AdaKVPress" and type(press.press).__name__ == "SnapKVPress"
    assert press.compression_ratio == ratio
    adakv = press_generate(lm, ids, PressSpec("adakv_snapkv"), settings, 4, stop_at_eos=False)
    snapkv = press_generate(lm, ids, PressSpec("snapkv"), settings, 4, stop_at_eos=False)
    heads = lm.num_layers * num_kv_heads(lm)
    assert abs(adakv.kept_kv[0] - snapkv.kept_kv[0]) <= heads and adakv.kept_kv[0] < adakv.total_kv[0]
    assert len(adakv.tokens) == 4
    with press(lm.model), torch.no_grad():  # kvpress's own context: the masked keys stay on the modules
        lm.model(torch.tensor([ids]))
    masked = attention_modules(lm.model)[0].masked_key_indices
    per_head = torch.bincount(masked[1], minlength=num_kv_heads(lm))
    assert len(set(per_head.tolist())) > 1  # the heads keep different shares


@needs_kvpress
def test_snapkv_spans_carries_snapkvs_own_scores_forward(lm, monkeypatch):
    """The span ablation scores every key with SnapKV's best score among itself and the span keys before it."""
    import kvpress

    from dynheads.kv.press_runs import make_press, press_generate
    from dynheads.kv.token_votes import SPAN, carried

    calls = []
    snapkv_score = kvpress.SnapKVPress.score

    def recorded(self, *args):
        calls.append((args, snapkv_score(self, *args)))
        return calls[-1][1]

    monkeypatch.setattr(kvpress.SnapKVPress, "score", recorded)
    ids = random_prompt(5, 120)
    settings = KVSettings(policy="static", budget=0.34, sink=2, recent=8, static_ranking=((0, 0),))
    press_generate(lm, ids, PressSpec("snapkv"), settings, 2, stop_at_eos=False)
    spans = make_press(PressSpec("snapkv_spans"), lm, settings, len(ids) - 1)
    assert len(calls) == lm.num_layers and spans.span == SPAN == 32
    for args, scores in list(calls):
        with torch.inference_mode():  # as in the prefill that recorded the arguments
            spanned = spans.score(*args)
        assert torch.equal(spanned, carried(scores, SPAN)) and not torch.equal(spanned, scores)
        assert torch.equal(spanned[..., 40], scores[..., 8:41].amax(-1))  # key 40: the best of keys 8..40


@needs_kvpress
def test_head_tokens_predicted_keeps_what_its_voters_choose_and_needs_them(lm):
    """The predictor-voted press is the head-token press with the prompt's voters: the same tokens, the same bytes."""
    from dynheads.experiments.kv import KVConfig
    from dynheads.kv.press_runs import press_generate

    ids = random_prompt(6, 120)
    settings = KVSettings(policy="static", budget=0.34, sink=2, recent=8, static_ranking=((0, 0),), voters=((2, 1),))
    predicted = press_generate(lm, ids, PressSpec("head_tokens_predicted"), settings, 4, stop_at_eos=False)
    static = press_generate(lm, ids, PressSpec("head_tokens"), settings, 4, stop_at_eos=False)
    assert predicted.tokens == static.tokens and predicted.kept_kv == static.kept_kv
    other = press_generate(lm, ids, PressSpec("head_tokens_predicted"), replace(settings, voters=((0, 3),)), 4)
    assert other.kept_kv == predicted.kept_kv  # the voters move which tokens are kept, not how many
    with pytest.raises(DynheadsError, match="votes with the head predictor's heads for the prompt"):
        press_generate(lm, ids, PressSpec("head_tokens_predicted"), replace(settings, voters=()), 4)
    with pytest.raises(DynheadsError, match="kvpress:head_tokens_predicted votes with the head predictor's heads"):
        KVConfig(policies=("full", "kvpress:head_tokens_predicted")).arms()
    # the spans' predicted voters likewise: head_spans with the prompt's voters
    spans = press_generate(lm, ids, PressSpec("head_spans_predicted"), settings, 4, stop_at_eos=False)
    static_spans = press_generate(lm, ids, PressSpec("head_spans"), settings, 4, stop_at_eos=False)
    assert spans.tokens == static_spans.tokens and spans.kept_kv == static_spans.kept_kv
    with pytest.raises(DynheadsError, match="kvpress:head_spans_predicted votes with the head predictor's heads"):
        KVConfig(policies=("full", "kvpress:head_spans_predicted")).arms()


@needs_kvpress
def test_head_tokens_need_a_static_list():
    from dynheads.experiments.kv import KVConfig

    with pytest.raises(DynheadsError, match="kvpress:head_tokens is driven by a dynheads head list"):
        KVConfig(policies=("full", "kvpress:head_tokens")).arms()


@needs_kvpress
def test_a_static_list_fitted_on_evaluation_samples_is_refused_for_head_tokens(tmp_path, embedded):
    from dynheads.experiments.kv import KVConfig, run_kv
    from dynheads.experiments.niah import niah_samples
    from dynheads.runs import RunDir

    config = KVConfig(
        policies=("kvpress:head_tokens",),
        budgets=(0.25,),
        lengths=(200,),
        depths=(0.5,),
        runs=1,
        max_new_tokens=4,
        static=str(tmp_path / "static" / "list.json"),
    )
    evaluated = niah_samples(config.niah_config(), embedded.tokenizer)[0]
    static_run = RunDir(tmp_path / "static")
    static_run.start("static", {"seed": 0}, None)
    static_run.save_sample({"sample_id": "static-x", "seed": evaluated.seed, "answer": "another"})
    (tmp_path / "static" / "list.json").write_text('["18-6", "17-3", "17-4"]')
    with pytest.raises(DynheadsError, match="fitted on 1 of the evaluation samples"):
        run_kv(config, tmp_path / "kv", lm=embedded, progress=False)


@needs_kvpress
def test_dynheads_kv_runs_head_tokens_beside_snapkv_at_the_same_bytes(tmp_path, embedded):
    import pandas as pd

    from dynheads.experiments.kv import KVConfig, run_kv
    from dynheads.runs import RunDir

    static_run = RunDir(tmp_path / "static")
    static_run.start("static", {"seed": 0}, None)
    static_run.save_sample({"sample_id": "static-x", "seed": 1, "answer": "not-an-evaluation-uuid"})
    (tmp_path / "static" / "list.json").write_text('["18-6", "17-3", "17-4", "16-0", "20-2", "14-8"]')
    config = KVConfig(
        policies=("kvpress:snapkv", "kvpress:head_tokens"),
        budgets=(0.1,),
        lengths=(200,),
        depths=(0.5,),
        runs=1,
        max_new_tokens=4,
        static=str(tmp_path / "static" / "list.json"),
    )
    run = run_kv(config, tmp_path / "kv", lm=embedded, progress=False)
    table = pd.read_csv(run.path / "table.csv").set_index("policy")
    assert table.loc["kvpress:head_tokens", "kv_fraction"] == table.loc["kvpress:snapkv", "kv_fraction"] < 0.5
    votes = run.manifest()["token_votes"]
    assert votes["voters"] == ["18-6", "17-3", "17-4", "16-0", "20-2", "14-8"] and votes["window"] == 32
    assert votes["span"] == 32 and "'static' seed stream" in votes["span_fitted_on"]  # fitted apart, recorded


@needs_kvpress
def test_dynheads_kv_asks_the_predictor_for_each_prompts_voters(tmp_path, embedded):
    """``kvpress:head_tokens_predicted`` in a run: each record's voters are the predictor's best heads for the hidden
    state of the prompt's prefill (computed here apart), and the row holds head_tokens' bytes."""
    import pandas as pd

    from dynheads.analysis.head_predictor import HeadPredictorConfig, load_head_predictor, train_head_predictor
    from dynheads.engine.decoding import DecodingSession
    from dynheads.experiments.kv import KVConfig, run_kv
    from dynheads.experiments.niah import niah_samples
    from dynheads.kv.token_votes import VOTERS
    from dynheads.runs import RunDir

    fit = RunDir(tmp_path / "fit")
    fit.start("niah", {"seed": 0}, None)
    fit.save_sample({"sample_id": "fit-x", "seed": 1, "answer": "not-an-evaluation-uuid"})
    rng = np.random.default_rng(0)
    hidden_size, shape = embedded.model.config.hidden_size, (embedded.num_layers, embedded.num_heads)
    heads = shape[0] * shape[1]
    samples = [(rng.normal(size=(6, hidden_size)).astype(np.float32), rng.random((6, heads)) > 0.9) for _ in range(8)]
    predictor_config = HeadPredictorConfig(hidden_sizes=(8,), epochs=1)
    trained = train_head_predictor(samples, predictor_config, task="binary", shape=shape)
    trained.save(tmp_path / "fit" / "probe")
    (tmp_path / "fit" / "list.json").write_text('["18-6", "17-3", "17-4", "16-0", "20-2", "14-8"]')
    config = KVConfig(
        policies=("kvpress:head_tokens", "kvpress:head_tokens_predicted"),
        budgets=(0.1,),
        lengths=(200,),
        depths=(0.5,),
        runs=1,
        max_new_tokens=4,
        static=str(tmp_path / "fit" / "list.json"),
        probe=str(tmp_path / "fit" / "probe"),
    )
    run = run_kv(config, tmp_path / "kv", lm=embedded, progress=False)
    (record,) = [r for r in run.records() if r["policy"] == "kvpress:head_tokens_predicted"]
    (sample,) = niah_samples(config.niah_config(), embedded.tokenizer)
    prefill = DecodingSession(embedded, sample.input_ids, max_new_tokens=4)
    hidden = prefill.forward(len(sample.input_ids) - 1).hidden.cpu()
    expected = load_head_predictor(tmp_path / "fit" / "probe").top_heads(hidden, VOTERS)
    assert record["voters"] == [f"{layer}-{head}" for layer, head in expected]
    table = pd.read_csv(run.path / "table.csv").set_index("policy")
    assert table.loc["kvpress:head_tokens_predicted", "kv_fraction"] == table.loc["kvpress:head_tokens", "kv_fraction"]


def test_listing_the_presses_imports_neither_kvpress_nor_torch():
    """The registry's entries are lazy: ``--help`` and an unknown name's error list them without the heavy imports."""
    import subprocess
    import sys

    code = (
        "import sys; from dynheads.kv.press_registry import KVPRESS_PRESSES; names = KVPRESS_PRESSES.names(); "
        "assert 'snapkv' in names and 'head_tokens' in names, names; "
        "assert 'torch' not in sys.modules and 'kvpress' not in sys.modules, 'imported'"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr


@needs_kvpress
def test_a_press_registered_in_a_test_file_runs_at_the_matched_bytes(lm):
    """Issue 35: a kvpress press is one registry entry, sized like the built-in ones."""
    from dynheads.kv.press_registry import KVPRESS_PRESSES, PressEntry
    from dynheads.kv.press_runs import press_generate

    KVPRESS_PRESSES.register("random", PressEntry("kvpress:RandomPress"), help="kvpress's random eviction")
    try:
        ids = random_prompt(1)
        settings = KVSettings(policy="static", budget=0.34, sink=2, recent=8, static_ranking=((0, 0), (1, 1), (2, 0)))
        knorm = press_generate(lm, ids, PressSpec("knorm"), settings, 4, stop_at_eos=False)
        drawn = press_generate(lm, ids, PressSpec("random"), settings, 4, stop_at_eos=False)
        assert check_press("kvpress:random") == PressSpec("random")
        assert len(drawn.tokens) == 4 and abs(drawn.kept_kv[0] - knorm.kept_kv[0]) <= 6  # the same matched ratio
    finally:
        KVPRESS_PRESSES.unregister("random")


@needs_kvpress
@pytest.mark.parametrize(
    "build,message",
    [
        ("kvpress:ThinKPress", r"kvpress:mine \(kvpress:ThinKPress\) takes no compression_ratio"),
        ("kvpress:DuoAttentionPress", r"takes no compression_ratio"),
        ("kvpress:AdaKVPress", r"takes no compression_ratio"),  # a wrapper: its ratio is its press's
        ("kvpress:NeedyPress", r"kvpress:mine \(kvpress:NeedyPress\) needs target, which nothing sets"),
    ],
)
def test_a_registered_kvpress_class_the_budget_cannot_build_is_refused_before_a_model_loads(
    build, message, monkeypatch
):
    """A press registered as a kvpress class is built as ``Class(compression_ratio=..., **knobs)``: a class with no
    compression ratio, or one with an argument nothing sets, passed the checks and raised a ``TypeError`` once the
    model had loaded; refused in one line naming the way out (a ``module:function`` entry)."""
    import dataclasses

    import kvpress

    from dynheads.kv.press_registry import KVPRESS_PRESSES, PressEntry

    @dataclasses.dataclass
    class NeedyPress(kvpress.ScorerPress):
        target: int = dataclasses.field(kw_only=True)

    monkeypatch.setattr(kvpress, "NeedyPress", NeedyPress, raising=False)
    KVPRESS_PRESSES.register("mine", PressEntry(build), help="a press the budget cannot build")
    try:
        with pytest.raises(DynheadsError, match=message) as error:
            resolve_arms(["kvpress:mine"], [0.1], static_given=False, predictor_given=False)
        assert "module:function" in str(error.value) and "\n" not in str(error.value)
    finally:
        KVPRESS_PRESSES.unregister("mine")
    assert check_press("kvpress:snapkv:window_size=16") == PressSpec("snapkv", "window_size=16")


def test_a_press_policy_names_its_knobs_after_a_second_colon():
    """Issue 35 item 5: ``kvpress:<press>:key=value:...`` sets the press's own fields (read without kvpress)."""
    assert parse_press("kvpress:snapkv") == PressSpec("snapkv")
    assert parse_press("kvpress:snapkv:window_size=32:kernel_size=7") == PressSpec(
        "snapkv", "window_size=32:kernel_size=7"
    )


@needs_kvpress
def test_press_knobs_are_the_press_fields_cast_to_their_types(lm):
    from kvpress import SnapKVPress

    from dynheads.kv.press_runs import make_press

    settings = KVSettings(policy="static", budget=0.34, sink=2, recent=8, static_ranking=((0, 0), (1, 1), (2, 0)))
    press = make_press(check_press("kvpress:snapkv:window_size=8:kernel_size=3"), lm, settings, 40)
    assert isinstance(press, SnapKVPress) and (press.window_size, press.kernel_size) == (8, 3)
    default = make_press(check_press("kvpress:snapkv"), lm, settings, 40)
    assert (
        default.window_size == SnapKVPress().window_size != 8 and default.compression_ratio == press.compression_ratio
    )
    ids = random_prompt(1)
    knobbed = press_generate_of(lm, ids, "kvpress:snapkv:window_size=4", settings)
    assert len(knobbed.tokens) == 4
    for policy, message in [
        ("kvpress:snapkv:window=8", "bad kvpress:snapkv option 'window=8'"),
        ("kvpress:snapkv:window_size=eight", "window_size needs an int"),
        ("kvpress:snapkv:compression_ratio=0.5", r"snapkv's compression_ratio is set by the budget \(or --ratios\)"),
        ("kvpress:streaming_llm:n_sink=3", "streaming_llm's n_sink is set by --sink, not by a knob"),
        ("kvpress:duo_attention:sink=3", "takes no knobs"),
    ]:
        with pytest.raises(DynheadsError, match=message):
            check_press(policy)


def press_generate_of(lm, ids, policy: str, settings: KVSettings):
    from dynheads.kv.press_runs import press_generate

    return press_generate(lm, ids, check_press(policy), settings, 4, stop_at_eos=False)


def test_a_mistyped_press_gets_a_suggestion_and_kv_help_lists_the_presses(capsys, monkeypatch):
    from cli_main import run_main

    from dynheads.errors import DynheadsError
    from dynheads.kv.press_runs import check_press

    for mistyped in ("kvpress:snap_kv", "kvpress:SnapKV", "kvpress:SnapKVPress"):  # kvpress's class names too
        with pytest.raises(DynheadsError, match="did you mean 'snapkv'"):
            check_press(mistyped)
    shown = " ".join(run_main(capsys, monkeypatch, "kv", "--help").stdout.split())
    assert "snapkv" in shown and "streaming_llm" in shown


def test_without_kvpress_the_error_and_doctor_name_the_side_venv(monkeypatch):
    import importlib.util

    from dynheads import doctor
    from dynheads.errors import DynheadsError
    from dynheads.kv.presses import require_kvpress

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "kvpress" else real(name, *a))
    with pytest.raises(DynheadsError, match="bash scripts/kvpress-env.sh.*not pip install.*517 MB"):
        require_kvpress()
    (check,) = [c for c in doctor.run_checks() if c.name == "kvpress"]
    assert "scripts/kvpress-env.sh" in check.detail and "517 MB" in check.detail


def test_voters_come_from_a_list_a_static_head_file_or_a_kv_export_folder(tmp_path):
    """The kvpress user's door (issue 61): ``load_voters`` reads a plain list as given, a static-head file's best
    positive-score heads, and the query heads of a kv-export's best KV heads; needs no kvpress."""
    from dynheads.analysis.headlists import save_head_scores
    from dynheads.analysis.kvheads import write_duo_attention
    from dynheads.kv.presses import load_voters

    assert load_voters([(2, 1), [0, 3]]) == ((2, 1), (0, 3))
    save_head_scores(tmp_path / "static.json", {(1, 2): [0.9], (0, 1): [0.5, 0.7], (2, 0): [0.0]})
    assert load_voters(tmp_path / "static.json") == ((1, 2), (0, 1))  # best first, never the zero-score head
    assert load_voters(str(tmp_path / "static.json"), count=1) == ((1, 2),)
    matrix = np.zeros((3, 2))
    matrix[2, 1], matrix[0, 0] = 0.9, 0.4  # KV head 1 of layer 2 is query heads 2 and 3 of 4
    write_duo_attention(tmp_path / "export", matrix, aggregation="max", source="x", num_heads=4)
    assert load_voters(tmp_path / "export", count=3) == ((2, 2), (2, 3), (0, 0))
    save_head_scores(tmp_path / "zero.json", {(0, 0): [0.0]})
    for bad, message in [([], "at least one"), (tmp_path / "zero.json", "zero score"), (tmp_path, "kv-export")]:
        with pytest.raises(DynheadsError, match=message):
            load_voters(bad)


@needs_kvpress
def test_the_question_free_track_compresses_the_context_alone(lm):
    """Issue 61 item 3: kvpress's question-free track. ``compress_until = c`` prunes only the first c tokens, then
    feeds the rest of the prompt (the question) uncompressed on each press's pruned cache: every token after c stays
    resident, the context holds what the press kept of it, and compressing the whole prompt (c = n - 1) is the
    question-aware default. Sharing one prefill still equals each press alone."""
    from dynheads.kv.press_runs import press_generate_all

    ids, context_end = random_prompt(11, 120), 90
    settings = KVSettings(policy="static", budget=0.34, sink=2, recent=8, static_ranking=((0, 0),), voters=((1, 2),))
    names = ("snapkv", "knorm", "head_tokens", "head_spans", "adakv_snapkv", "duo_attention")  # the last two mask keys
    arms = [(PressSpec(name), settings) for name in names]
    aware = press_generate_all(lm, ids, arms, 4, stop_at_eos=False)
    assert [r.tokens for r in press_generate_all(lm, ids, arms, 4, stop_at_eos=False, compress_until=119)] == [
        r.tokens for r in aware
    ]
    free = press_generate_all(lm, ids, arms, 4, stop_at_eos=False, compress_until=context_end)
    alone = press_generate_all(lm, ids, arms, 4, stop_at_eos=False, compress_until=context_end, share_prefill=False)
    context = press_generate_all(lm, ids[: context_end + 1], arms, 4, stop_at_eos=False)  # the context alone
    heads = lm.num_layers * num_kv_heads(lm)
    question = len(ids) - 1 - context_end  # fed after the compression, never pruned
    for (spec, _), one, other, pruned, whole in zip(arms, free, alone, context, aware, strict=True):
        assert (one.tokens, one.kept_kv) == (other.tokens, other.kept_kv), spec
        # the context holds what the press keeps of it alone; every key of the question sits beside it
        assert one.kept_kv[0] == pruned.kept_kv[0] + question * heads, spec
        assert one.kept_kv[0] != whole.kept_kv[0], spec  # not the question-aware cache
    with pytest.raises(DynheadsError, match="outside the prompt"):
        press_generate_all(lm, ids, arms[:1], 4, compress_until=len(ids))


def test_a_niah_sample_marks_its_haystack_for_the_question_free_track(embedded_tokenizer):
    """The context span of a NIAH prompt is the haystack: it holds the needle and ends before the question."""
    from dynheads.tasks.niah import QUESTION, make_sample

    sample = make_sample(embedded_tokenizer, context_tokens=300, depth=0.5, seed=3)
    start, stop = sample.context_span
    assert start < min(sample.needle_positions) and max(sample.needle_positions) < stop < len(sample.input_ids) - 5
    assert QUESTION in embedded_tokenizer.decode(sample.input_ids[stop:])
    assert QUESTION not in embedded_tokenizer.decode(sample.input_ids[start:stop])
    assert 280 <= stop - start <= 320  # the haystack's 300 tokens, give or take the needle's re-tokenised edges


@needs_kvpress
def test_dynheads_kv_runs_the_question_free_track(tmp_path, embedded):
    """``dynheads kv --track question-free``: the presses compress each NIAH prompt's haystack alone (the question
    follows uncompressed), so a press keeps more of the prompt than at the same ratio over all of it; the manifest
    records the track; an unknown track is refused before any work."""
    import pandas as pd

    from dynheads.experiments.kv import KVConfig, run_kv

    config = KVConfig(
        policies=("full", "kvpress:snapkv"), budgets=(0.1,), lengths=(200,), depths=(0.5,), runs=1, max_new_tokens=4
    )
    tables = {}
    for track in ("question-aware", "question-free"):
        run = run_kv(replace(config, track=track), tmp_path / track, lm=embedded, progress=False)
        assert run.manifest()["config"]["track"] == track
        tables[track] = pd.read_csv(run.path / "table.csv").set_index("policy")
    aware, free = (tables[t].loc["kvpress:snapkv", "kv_fraction"] for t in ("question-aware", "question-free"))
    assert free > aware  # the question's keys all stay: more of the prompt is resident
    with pytest.raises(DynheadsError, match="unknown track"):
        run_kv(replace(config, track="question-only"), tmp_path / "bad", lm=embedded, progress=False)


@needs_kvpress
@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.875])
def test_a_press_at_a_compression_ratio_keeps_that_share_of_the_prompt(lm, ratio):
    """``KVSettings.ratio`` (``--ratios``) sizes a press by kvpress's own compression ratio, not by a budget's bytes:
    the first decode step holds (1 - ratio) of the compressed prompt per KV head, whatever the budget says."""
    from dynheads.kv.press_runs import press_generate

    ids = random_prompt(1)
    heads = lm.num_layers * num_kv_heads(lm)
    settings = KVSettings(policy="static", budget=0.9, ratio=ratio)
    pressed = press_generate(lm, ids, PressSpec("snapkv"), settings, 3, stop_at_eos=False)
    compressed = len(ids) - 1  # the question-aware track compresses all of the prompt but its last token
    assert abs(pressed.kept_kv[0] / heads - ((1 - ratio) * compressed + 1)) <= 1


@needs_kvpress
def test_dynheads_kv_runs_presses_at_the_leaderboards_ratios(tmp_path, embedded):
    """``dynheads kv --ratios``: every press at each ratio (records ``-r<ratio>``, budget = the kept share), the
    policies at their budgets; a press that keeps whole heads, or a ratio outside [0, 1), is refused first."""
    import pandas as pd

    from dynheads.experiments.kv import KVConfig, run_kv

    config = KVConfig(
        policies=("full", "kvpress:snapkv", "kvpress:knorm"),
        ratios=(0.5, 0.875),
        budgets=(0.1,),
        lengths=(200,),
        depths=(0.5,),
        runs=1,
        max_new_tokens=4,
    )
    run = run_kv(config, tmp_path / "kv", lm=embedded, progress=False)
    records = run.records()
    pressed = {r["sample_id"].rsplit("-", 1)[1]: r for r in records if r["policy"] == "kvpress:snapkv"}
    assert set(pressed) == {"r0.5", "r0.875"}
    assert pressed["r0.5"]["budget"] == 0.5 and pressed["r0.875"]["budget"] == 0.125
    assert pressed["r0.875"]["kv_fraction"] < pressed["r0.5"]["kv_fraction"] < 0.6
    table = pd.read_csv(run.path / "table.csv")
    assert sorted(table["ratio"].dropna().unique()) == [0.5, 0.875]
    assert "| ratio 0.875 | kvpress:knorm |" in (run.path / "summary.md").read_text()
    cells = pd.read_csv(run.path / "cells.csv")  # the grid's panels name a press by its ratio
    assert sorted(cells["ratio"].dropna().unique()) == [0.5, 0.875] and cells["ratio"].isna().sum() == 1  # full
    with pytest.raises(DynheadsError, match=r"compression ratios .* in \[0, 1\)"):
        run_kv(replace(config, ratios=(1.0,)), tmp_path / "bad", lm=embedded, progress=False)
    with pytest.raises(DynheadsError, match="kvpress:duo_attention keeps whole KV heads.*without --ratios"):
        resolve_arms(["kvpress:duo_attention"], [0.1], static_given=True, predictor_given=False, ratios=[0.5])
