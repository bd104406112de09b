"""The real per-head KV cache: greedy decoding equals the masked simulation of ``kv.retention`` (static policy), and
the bytes it holds are those of the whole heads plus the streaming heads' windows."""

from __future__ import annotations

import pytest
import torch
from zoo import NoTokenizer, tiny_model

from dynheads.errors import DynheadsError
from dynheads.kv.cache import HeadwiseCache, headwise_generate
from dynheads.kv.retention import KVSettings, kv_generate, kv_token_bytes
from dynheads.models import LoadedModel


class _Sample:
    def __init__(self, ids, needle=()):
        self.input_ids, self.needle_positions = ids, list(needle)


def _prompt(seed=0, length=40):
    return torch.randint(3, 128, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


def _simulated(lm, ids, ranking, sink, recent, new_tokens):
    every = len(ranking) / (lm.num_layers * lm.model.config.num_key_value_heads)
    settings = KVSettings(policy="static", budget=every, static_ranking=tuple(ranking), sink=sink, recent=recent)
    return kv_generate(lm, _Sample(ids), settings, max_new_tokens=new_tokens, stop_at_eos=False)


@pytest.mark.parametrize("family", ["llama", "qwen3", "phi3"])
@pytest.mark.parametrize("sink,recent", [(1, 2), (4, 8), (0, 5), (2, 1)])
def test_greedy_decoding_equals_the_simulation(family, sink, recent):
    lm = LoadedModel(model=tiny_model(family), tokenizer=NoTokenizer(), name=family, revision="random")
    ranking = [(0, 0), (2, 1), (1, 1)]  # 3 of the 6 KV heads whole (3 layers x 2 KV heads, G = 2)
    ids = _prompt(sum(map(ord, family)))
    simulated = _simulated(lm, ids, ranking, sink, recent, 10)
    real = headwise_generate(lm, ids, ranking, sink=sink, recent=recent, max_new_tokens=10, stop_at_eos=False)
    assert real.tokens == simulated.tokens
    # 49 tokens cached (39 prefilled + 10 decoded); a streaming head keeps sink + recent - 1 between steps
    token = kv_token_bytes(lm)
    assert real.full_bytes == 3 * 2 * 49 * token
    assert real.cache_bytes == (3 * 49 + 3 * (sink + recent - 1)) * token


def test_every_head_whole_is_the_unmodified_model_and_no_head_whole_frees_the_rest():
    lm = LoadedModel(model=tiny_model("llama"), tokenizer=NoTokenizer(), name="llama", revision="random")
    ids = _prompt(7)
    every = [(layer, kv) for layer in range(3) for kv in range(2)]
    whole = headwise_generate(lm, ids, every, sink=1, recent=2, max_new_tokens=6, stop_at_eos=False)
    assert (
        whole.tokens
        == kv_generate(lm, _Sample(ids), KVSettings(policy="full"), max_new_tokens=6, stop_at_eos=False).tokens
    )
    assert whole.cache_bytes == whole.full_bytes
    none = headwise_generate(lm, ids, [], sink=1, recent=2, max_new_tokens=6, stop_at_eos=False)
    assert none.cache_bytes == 6 * (1 + 1) * kv_token_bytes(lm)
    simulated = kv_generate(
        lm, _Sample(ids), KVSettings(policy="none", sink=1, recent=2), max_new_tokens=6, stop_at_eos=False
    )
    assert none.tokens == simulated.tokens
    short = [5, 9]  # a one-token prefill
    assert (
        headwise_generate(lm, short, [(0, 1)], sink=1, recent=2, max_new_tokens=4, stop_at_eos=False).tokens
        == _simulated(lm, short, [(0, 1)], 1, 2, 4).tokens
    )


def test_bad_uses_are_refused():
    lm = LoadedModel(model=tiny_model("mistral"), tokenizer=NoTokenizer(), name="mistral", revision="random")
    with pytest.raises(DynheadsError, match="sliding-window"):
        headwise_generate(lm, _prompt(), [(0, 0)], sink=1, recent=2, max_new_tokens=2)
    with pytest.raises(DynheadsError, match="recent >= 1"):
        HeadwiseCache([[0]], 2, sink=1, recent=0)


@pytest.mark.parametrize(
    "head,where",
    [((0, 2), "the 2 KV heads"), ((0, -1), "the 2 KV heads"), ((3, 0), "3 layers"), ((-1, 0), "3 layers")],
)
def test_a_kv_head_the_model_lacks_is_refused_in_one_line(head, where):
    """3 layers x 2 KV heads: a query head's index (an IndexError inside torch), a negative KV head (a reshape
    error) or layer (-1 silently kept a head of the last layer) is one line naming it."""
    lm = LoadedModel(model=tiny_model("llama"), tokenizer=NoTokenizer(), name="llama", revision="random")
    with pytest.raises(DynheadsError, match=rf"KV head \({head[0]}, {head[1]}\) is .*{where}") as error:
        headwise_generate(lm, _prompt(), [head], sink=1, recent=2, max_new_tokens=2)
    assert "\n" not in str(error.value)
    with pytest.raises(DynheadsError, match="outside the 2 KV heads"):
        HeadwiseCache([[0], [2], []], 2, sink=1, recent=2)


def test_embedded_model_equals_the_simulation_and_frees_memory(embedded):
    from dynheads.tasks import niah

    sample = niah.make_sample(embedded.tokenizer, context_tokens=300, depth=0.5, seed=3)
    ranking = [(layer, kv) for layer in (14, 15, 16, 17, 18, 19) for kv in range(3)][:12]  # 12 of 90 KV heads
    simulated = _simulated(embedded, sample.input_ids, ranking, 4, 32, 12)
    real = headwise_generate(
        embedded, sample.input_ids, ranking, sink=4, recent=32, max_new_tokens=12, stop_at_eos=False
    )
    assert real.tokens == simulated.tokens
    assert real.cache_bytes < 0.25 * real.full_bytes
