"""The retrieval-head presses under every kvpress wrapper (issue 61): kvpress's own press matrix, written here for
the dynheads presses on a tiny random Llama.

Each press runs alone and wrapped in every wrapper kvpress 0.5.5 ships that takes a ``ScorerPress``; the compressed
cache must hold what kvpress's own ``SnapKVPress`` holds under the same wrapper at the same ratio (kept keys per
layer, and the keys a head-wise wrapper masks; DMS, sized by a threshold on the scores, masks some), and greedy
decoding must run on it. The cross-layer vote runs alone
and in ``ComposedPress`` and is refused by every other wrapper with one line naming the layer-wise press. Runs where
kvpress is installed (the side venv of ``scripts/kvpress-env.sh``; ``scripts/test.sh`` runs this file there).
"""

from __future__ import annotations

import importlib.util
import warnings

import pytest
import torch
from zoo import random_prompt, tiny_model

from dynheads.errors import DynheadsError

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("kvpress") is None,
    reason="kvpress extra not installed (scripts/kvpress-env.sh makes an environment)",
)

LENGTH, RATIO, VOTERS = 96, 0.5, ((0, 1), (2, 0), (2, 3))

# wrapper name -> how it wraps a ScorerPress (kvpress 0.5.5's wrappers, with knobs that fit a 96-token prompt)
WRAPPERS = {
    "alone": lambda kvpress, press: press,
    "ComposedPress": lambda kvpress, press: kvpress.ComposedPress([press]),
    "KeyRerotationPress": lambda kvpress, press: kvpress.KeyRerotationPress(press=press),
    "AdaKVPress": lambda kvpress, press: kvpress.AdaKVPress(press=press),
    "ChunkPress": lambda kvpress, press: kvpress.ChunkPress(press=press, chunk_length=48),
    "CriticalKVPress": lambda kvpress, press: kvpress.CriticalKVPress(press=press),
    "CriticalAdaKVPress": lambda kvpress, press: kvpress.CriticalAdaKVPress(press=press),
    "DMSPress": lambda kvpress, press: kvpress.DMSPress(press=press, threshold=0.05, sliding_window_size=32),
    "MergingPress": lambda kvpress, press: kvpress.MergingPress(press=press),
    "PerLayerCompressionPress": lambda kvpress, press: kvpress.PerLayerCompressionPress(
        press=press, compression_ratios=[0.5, 0.25, 0.75]
    ),
    "ChunkKVPress": lambda kvpress, press: kvpress.ChunkKVPress(press=press),
    "BlockPress": lambda kvpress, press: kvpress.BlockPress(press=press, block_size=32),
}
CROSS_LAYER_RUNS = {"alone", "ComposedPress"}


@pytest.fixture(scope="module")
def model():
    model = tiny_model("llama")  # 3 layers, 4 query heads, 2 KV heads
    model.set_attn_implementation("sdpa")
    return model


def _layerwise(span: int = 0):
    from dynheads.kv.presses import head_tokens_press

    return head_tokens_press(VOTERS, RATIO, layerwise=True, sink=2, recent=8, window=8, span=span)


def _cross_layer():
    from dynheads.kv.presses import head_tokens_press

    return head_tokens_press(VOTERS, RATIO, sink=2, recent=8, window=8)


def _snapkv():
    import kvpress

    return kvpress.SnapKVPress(compression_ratio=RATIO, window_size=8)


def _run(model, wrapper: str, press, new_tokens: int = 3):
    """Prefill the prompt under the wrapped press, then decode ``new_tokens`` greedily on its cache: the kept keys
    per layer, the keys a head-wise wrapper masks per layer, and the decoded tokens."""
    import kvpress
    from transformers import DynamicCache

    wrapped, ids = WRAPPERS[wrapper](kvpress, press), torch.tensor([random_prompt(1, LENGTH)])
    cache, tokens = DynamicCache(config=model.config), []
    with torch.no_grad(), warnings.catch_warnings(), wrapped(model):
        warnings.filterwarnings("ignore", message="Per layer compression wrapper")  # kvpress: "flash attention only"
        logits = model(ids, past_key_values=cache).logits
        kept = [layer.keys.shape[2] for layer in cache.layers]
        masked = [_masked(layer.self_attn) for layer in model.model.layers]
        for step in range(new_tokens):
            tokens.append(int(logits[0, -1].argmax()))
            logits = model(
                torch.tensor([tokens[-1:]]), past_key_values=cache, position_ids=torch.tensor([[LENGTH + step]])
            ).logits
    return kept, masked, tokens


def _masked(attention) -> int:
    indices = getattr(attention, "masked_key_indices", None)
    attention.masked_key_indices = None  # the next run must not see this run's masks
    return 0 if indices is None else len(indices[0])


@pytest.mark.parametrize("wrapper", sorted(set(WRAPPERS) - {"DMSPress"}))
@pytest.mark.parametrize("span", [0, 4])
def test_the_layerwise_press_compresses_under_every_wrapper_as_snapkv_does(model, wrapper, span):
    kept, masked, tokens = _run(model, wrapper, _layerwise(span))
    reference_kept, reference_masked, _ = _run(model, wrapper, _snapkv())
    assert (kept, masked) == (reference_kept, reference_masked)
    assert sum(kept) < 3 * LENGTH or sum(masked) > 0  # compressed: pruned, or masked by a head-wise wrapper
    assert len(tokens) == 3


def test_dms_masks_the_keys_the_layerwise_press_scores_below_its_threshold(model):
    """DMS sizes nothing: it masks keys leaving its window whose score is below its threshold, so the count depends
    on the scores' scale (attention mass here, as SnapKV's), not on a ratio."""
    kept, masked, tokens = _run(model, "DMSPress", _layerwise())
    assert kept == [LENGTH] * 3 and all(0 < count < 2 * (LENGTH - 32) for count in masked) and len(tokens) == 3


@pytest.mark.parametrize("wrapper", sorted(CROSS_LAYER_RUNS))
def test_the_cross_layer_vote_runs_alone_and_composed(model, wrapper):
    kept, masked, tokens = _run(model, wrapper, _cross_layer())
    assert kept == [int(LENGTH * (1 - RATIO))] * 3 and masked == [0, 0, 0] and len(tokens) == 3


@pytest.mark.parametrize("wrapper", sorted(set(WRAPPERS) - CROSS_LAYER_RUNS))
def test_the_cross_layer_vote_is_refused_by_a_per_layer_wrapper_in_one_line(model, wrapper):
    with pytest.raises(DynheadsError, match=r"layerwise=True") as error:
        _run(model, wrapper, _cross_layer())
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("other", ["snapkv", "itself"])
@pytest.mark.parametrize("first", [True, False])
def test_a_composition_of_the_cross_layer_vote_with_another_press_is_refused_in_one_line(model, other, first):
    """``ComposedPress`` of the cross-layer vote and a press that compresses too (in either order): the other press
    compressed some layer before the vote compresses every layer at the last one, so it is refused (it raised an
    index error inside torch); the layer-wise press composes (above)."""
    import kvpress

    presses = [_cross_layer(), _snapkv() if other == "snapkv" else _cross_layer()]
    composed = kvpress.ComposedPress(presses if first else presses[::-1])
    with pytest.raises(DynheadsError, match=r"no other press may compress a layer before it") as error:
        with torch.no_grad(), composed(model):
            model(torch.tensor([random_prompt(1, LENGTH)]))
    assert "layerwise=True" in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("layerwise", [False, True])
@pytest.mark.parametrize("voter", [(0, 4), (0, -1), (3, 0)])
def test_a_voter_the_model_lacks_is_refused_in_one_line(model, layerwise, voter):
    """A voting query head outside the model (3 layers x 4 query heads): one line naming it (a head index out of
    range raised an IndexError, and -1 silently voted with the last head)."""
    from dynheads.kv.presses import head_tokens_press

    press = head_tokens_press([voter], RATIO, layerwise=layerwise, sink=2, recent=8, window=8)
    with pytest.raises(
        DynheadsError, match=rf"voting head \({voter[0]}, {voter[1]}\) is outside the model's 3 layers x 4"
    ):
        with torch.no_grad(), press(model):
            model(torch.tensor([random_prompt(1, LENGTH)]))


def test_a_voting_layer_keeps_what_the_cross_layer_vote_keeps_when_all_voters_sit_there(model):
    """With every voter in layer 2, layer 2 of the layer-wise press keeps the cross-layer vote's tokens (the same
    rows, pooled and protected alike); the other layers are voted by all their heads instead."""
    import kvpress
    from transformers import DynamicCache

    from dynheads.kv.presses import head_tokens_press

    ids, caches = torch.tensor([random_prompt(4, LENGTH)]), []
    for layerwise in (False, True):
        press = head_tokens_press(((2, 0), (2, 3)), RATIO, layerwise=layerwise, sink=2, recent=8, window=8)
        caches.append(DynamicCache(config=model.config))
        with torch.no_grad(), press(model):
            model(ids, past_key_values=caches[-1])
    assert isinstance(press, kvpress.ScorerPress)
    assert torch.equal(caches[0].layers[2].keys, caches[1].layers[2].keys)
    assert not torch.equal(caches[0].layers[0].keys, caches[1].layers[0].keys)


@pytest.mark.parametrize("make", [_cross_layer, _layerwise])
def test_votes_are_computed_without_autograd(model, make):
    from transformers import DynamicCache

    press = make()
    with warnings.catch_warnings(), press(model):  # autograd on: the model's own forward keeps its graph
        warnings.simplefilter("error")
        model(torch.tensor([random_prompt(5, LENGTH)]), past_key_values=DynamicCache(config=model.config))


def test_a_chunk_shorter_than_the_window_is_refused_in_one_line(model):
    import kvpress

    press = kvpress.ChunkPress(press=_layerwise(), chunk_length=8)  # 8 keys, 8-position window
    from transformers import DynamicCache

    with pytest.raises(DynheadsError, match="window of 8 positions") as error:
        with torch.no_grad(), press(model):
            model(torch.tensor([random_prompt(6, LENGTH)]), past_key_values=DynamicCache(config=model.config))
    assert "\n" not in str(error.value)


def test_the_kv_guides_opening_example_runs_as_written(tmp_path, monkeypatch, capsys):
    """docs/kv.md opens with a kvpress pipeline example: run its code block unchanged but for the hub id, which
    points at a tiny random Llama saved with a byte tokenizer, and its static-head file, written where it says."""
    import re
    from pathlib import Path

    from zoo import byte_tokenizer

    from dynheads.analysis.headlists import save_head_scores

    guide = (Path(__file__).parents[1] / "docs" / "kv.md").read_text(encoding="utf-8")
    block = re.search(r"```python\n(.*?)```", guide, re.S).group(1)
    hub_id = re.search(r'model="([^"]+)"', block).group(1)
    tokenizer = byte_tokenizer("{% for m in messages %}<u>{{ m.content }}</u>{% endfor %}<a>")
    model = tiny_model("llama", vocab_size=len(tokenizer))
    model.save_pretrained(tmp_path / "model")
    tokenizer.save_pretrained(tmp_path / "model")
    monkeypatch.chdir(tmp_path)
    static = re.search(r'head_tokens_press\("([^"]+)"', block).group(1)
    (tmp_path / static).parent.mkdir(parents=True)
    save_head_scores(tmp_path / static, {(2, 1): [0.9], (0, 3): [0.6], (1, 0): [0.0]})
    context = "the magic word is tapir; the sky is green, and cats sleep a lot. " * 3
    exec(block.replace(hub_id, str(tmp_path / "model")), {"context": context, "question": "what is the word?"})
    assert capsys.readouterr().out.strip()  # the pipeline answered (random weights: any text)


def test_the_cross_layer_press_names_a_batch_and_a_short_prompt_apart_and_refuses_negative_windows(model):
    """A batch of two sequences and a prompt no longer than the observation window are two mistakes, each named
    (a batch was reported as a short prompt); negative protected counts are refused when the press is built."""
    from dynheads.kv.presses import head_tokens_press

    with pytest.raises(DynheadsError, match="one sequence at a time, got a batch of 2"):
        with torch.no_grad(), _cross_layer()(model):
            model(torch.tensor([random_prompt(1, LENGTH), random_prompt(2, LENGTH)]))
    with pytest.raises(DynheadsError, match="longer than its window \\(8 tokens\\), got 6"):
        with torch.no_grad(), _cross_layer()(model):
            model(torch.tensor([random_prompt(1, 6)]))
    with pytest.raises(DynheadsError, match="counts >= 0, got sink=-3"):
        head_tokens_press(VOTERS, RATIO, sink=-3)


def test_the_presses_have_kvpress_style_names_and_pickle(tmp_path):
    """As kvpress's own presses: the repr names the class (not ``_token_press_class.<locals>...``), the class is
    importable for ``isinstance``, and a press pickles and comes back equal."""
    import pickle

    from dynheads.kv.presses import HeadTokensPress, LayerHeadTokensPress, head_list_press

    cross, layerwise = _cross_layer(), _layerwise()
    assert isinstance(cross, HeadTokensPress) and isinstance(layerwise, LayerHeadTokensPress)
    assert repr(cross).startswith("HeadTokensPress(compression_ratio=0.5, voters=((0, 1), (2, 0), (2, 3))")
    for press in (cross, layerwise, head_list_press([(0, 1)], sink=2, recent=8)):
        again = pickle.loads(pickle.dumps(press))
        assert type(again) is type(press) and repr(again) == repr(press)


@pytest.mark.parametrize("layerwise", [False, True])
@pytest.mark.parametrize(
    "knobs,message",
    [
        ({"window": 0}, r"observation window >= 1 .*window=0"),
        ({"span": -1}, r"span >= 0, got window=8, span=-1"),
        ({"pool": 4}, r"odd number of keys, got 4"),
    ],
)
def test_a_head_token_press_refuses_a_knob_out_of_range_when_it_is_made(layerwise, knobs, message):
    """As kvpress's presses check theirs at construction: a window of 0 passed until the prefill, where it was
    refused as a prompt "no longer than its window (0 tokens)"; a negative span or an even pooling only in the
    compression. The class built directly (kvpress's way, ``HeadTokensPress(...)``) refuses them too."""
    from dynheads.kv.presses import HeadTokensPress, LayerHeadTokensPress, head_tokens_press

    settings = {"window": 8, **knobs}
    with pytest.raises(DynheadsError, match=message) as error:
        head_tokens_press(VOTERS, RATIO, layerwise=layerwise, **settings)
    assert "\n" not in str(error.value)
    press_class = LayerHeadTokensPress if layerwise else HeadTokensPress
    with pytest.raises(DynheadsError, match=message):
        press_class(compression_ratio=RATIO, voters=VOTERS, **settings)
    with pytest.raises(DynheadsError, match=r"compression ratio is in \[0, 1\), got 1.5"):
        press_class(compression_ratio=1.5, voters=VOTERS)
