"""Retrieval heads choose the tokens (``dynheads.kv.token_votes``): the votes are the voters' exact attention from the
observation window, the budget sets the kept count, sinks and recent tokens always stay, and a token the voters
attend most is kept while one they never attend is dropped. The same policy as a kvpress press:
``tests/test_kvpress.py``."""

from __future__ import annotations

import pytest
import torch
from zoo import random_prompt, tiny_model, tiny_sdpa_lm

from dynheads.errors import DynheadsError
from dynheads.kv.token_votes import carried, head_tokens, keep, kept_count, token_scores, window_votes

VOTERS = ((0, 1), (2, 3), (1, 0))


@pytest.fixture(scope="module")
def lm():
    return tiny_sdpa_lm()


def test_votes_are_the_voters_attention_from_the_window(lm):
    ids, window = random_prompt(1), 16
    votes = window_votes(lm, ids, VOTERS, window)
    model = tiny_model("llama")
    model.set_attn_implementation("eager")
    with torch.inference_mode():
        attentions = model(input_ids=torch.tensor([ids[:-1]]), output_attentions=True).attentions
    n = len(ids) - 1
    reference = torch.stack([attentions[layer][0, head, n - window :, : n - window].mean(0) for layer, head in VOTERS])
    assert votes.shape == (n - window,)
    torch.testing.assert_close(votes, reference.mean(0), rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("ratio", [0.5, 0.75, 0.875])  # 19 or more of 159 tokens: above the 15 protected
def test_the_budget_sets_the_count_and_sinks_and_recent_tokens_stay(lm, ratio):
    ids = random_prompt(2, 160)
    n = len(ids) - 1
    kept = head_tokens(lm, ids, VOTERS, ratio, sink=3, recent=8, window=12)
    assert len(kept) == kept_count(n, ratio) == int(n * (1 - ratio)) and len(set(kept)) == len(kept)
    assert set(range(3)) | set(range(n - 12, n)) <= set(kept)  # the window (12) is longer than recent (8)


def test_a_tight_budget_keeps_sinks_first_then_the_latest_tokens():
    scores = token_scores(torch.rand(90, generator=torch.Generator().manual_seed(0)), 100, sink=4, recent=20)
    assert keep(scores, 0.97) == [0, 1, 2]  # 3 of 100: sinks in order
    # kvpress's count: int(100 * (1 - 0.9)) is 9 in floating point
    assert keep(scores, 0.9) == [0, 1, 2, 3, *range(95, 100)]  # every sink, then the latest


def test_the_most_attended_token_is_kept_and_a_never_attended_one_dropped():
    votes = torch.zeros(80)
    votes[30] = 1.0  # every voter's window rows go to token 30; token 60 gets nothing
    kept = keep(token_scores(votes, 100, sink=2, recent=10, pool=5), 0.8)  # 20 tokens: 2 + 20 protected > 20
    assert 30 not in kept  # protected tokens come first: too tight a budget keeps no vote
    kept = keep(token_scores(votes, 100, sink=2, recent=10, pool=5), 0.7)  # 30: 2 sinks, 20 recent, 8 votes
    assert 30 in kept and {28, 29, 31, 32} <= set(kept)  # pooled: the neighbours come with it
    assert 60 not in kept and len(kept) == 30
    unpooled = keep(token_scores(votes, 100, sink=2, recent=10, pool=1), 0.765)  # 23 = 2 + 20 + 1
    assert unpooled == [0, 1, 30, *range(80, 100)]


def test_a_vote_carries_forward_over_its_span_and_not_back():
    votes = torch.zeros(80)
    votes[30] = 1.0  # the cue; the fact is the tokens after it
    assert torch.equal(carried(votes, 0), votes)
    assert carried(votes, 6).nonzero().flatten().tolist() == list(range(30, 37))
    kept = keep(token_scores(votes, 100, sink=2, recent=10, pool=1, span=6), 0.71)  # 29 = 2 + 20 protected + 7
    assert kept == [0, 1, *range(30, 37), *range(80, 100)]
    rows = torch.stack([votes, votes.flip(0)])[None]  # [1, 2, 80]: any leading dimensions, carried along the last
    assert torch.equal(carried(rows, 6)[0, 1], carried(votes.flip(0), 6))
    with pytest.raises(DynheadsError, match="span is a number of keys >= 0"):
        carried(votes, -1)


def test_a_span_keeps_the_tokens_after_the_models_most_voted_one(lm):
    ids, window = random_prompt(3, 120), 16
    votes = window_votes(lm, ids, VOTERS, window)
    best = int(votes[2:90].argmax()) + 2
    kept = head_tokens(lm, ids, VOTERS, 0.7, sink=2, recent=8, window=window, pool=1, span=4)
    assert set(range(best, best + 5)) <= set(kept)


def test_the_model_keeps_its_most_voted_token_and_drops_its_least(lm):
    ids, window = random_prompt(3, 120), 16
    votes = window_votes(lm, ids, VOTERS, window)
    kept = head_tokens(lm, ids, VOTERS, 0.7, sink=2, recent=8, window=window, pool=1)
    assert int(votes[2:].argmax()) + 2 in kept and int(votes[2:].argmin()) + 2 not in kept


def test_bad_voters_and_windows_are_refused(lm):
    with pytest.raises(DynheadsError, match="needs voting heads"):
        head_tokens(lm, random_prompt(), (), 0.5, sink=2, recent=8)
    with pytest.raises(DynheadsError, match="outside 3 layers x 4 heads"):
        head_tokens(lm, random_prompt(), ((3, 0),), 0.5, sink=2, recent=8)
    with pytest.raises(DynheadsError, match="shorter than the prefill"):
        head_tokens(lm, random_prompt(length=20), VOTERS, 0.5, sink=2, recent=8, window=32)
    batch = torch.tensor([random_prompt()])  # a tokenizer's [1, n] input_ids: it read as one 0-token prefill
    with pytest.raises(DynheadsError, match=r"as one sequence, not shape \(1, \d+\) \(ids\[0\]\)"):
        head_tokens(lm, batch, VOTERS, 0.5, sink=2, recent=8)  # type: ignore[arg-type]
    with pytest.raises(DynheadsError, match="compression ratio"):
        kept_count(100, 1.0)
