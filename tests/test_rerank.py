"""Heads as a re-ranker: the span score against eager attention, constructed cases, metrics, stream refusal."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers as tf
from zoo import FAMILIES, NoTokenizer, tiny_model

from dynheads.analysis.ranking import mean_interval, qrhead_scores, ranking_metrics, top_heads
from dynheads.decoding import DecodingSession
from dynheads.errors import DynheadsError
from dynheads.models import LoadedModel
from dynheads.rag.rerank import RerankPrompt, bm25_scores, ranking, span_scores
from dynheads.scores import SpanScore, span_ranking

TOL = 1e-5


def eager_attentions(model, ids: list[int]) -> list[torch.Tensor]:
    """``[H, q, kv]`` attention of every layer from transformers' own eager path."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(torch.tensor([ids]), output_attentions=True)
    finally:
        model.set_attn_implementation(previous)
    return [a[0].float() for a in out.attentions]


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("split", [0, 14])  # one pass, or a cached prefix then the query part (as re-ranking runs)
def test_span_mass_equals_eager_attention_summed(family, split):
    model = tiny_model(family)
    lm = LoadedModel(model=model, tokenizer=NoTokenizer(), name=family, revision="random")
    torch.manual_seed(3)
    ids = torch.randint(3, 128, (30,)).tolist()
    score = SpanScore(query=(22, 27), spans=((1, 6), (6, 13), (15, 20)))
    session = DecodingSession(lm, ids, max_new_tokens=1)
    if split:
        session.forward(split)
    session.probe.set_span_score(score)
    mass = session.forward(len(ids) - split).stats.span_mass  # [L, H, S]
    for layer, attention in enumerate(eager_attentions(model, ids)):
        rows = attention[:, 22:27]  # [H, query rows, kv]
        expected = torch.stack([rows[:, :, a:b].sum(dim=(1, 2)) for a, b in score.spans], dim=-1)
        assert (mass[layer] - expected).abs().max() <= TOL, (family, layer)


def test_span_score_refuses_query_outside_the_pass():
    model = tiny_model("llama")
    lm = LoadedModel(model=model, tokenizer=NoTokenizer(), name="llama", revision="random")
    session = DecodingSession(lm, list(range(3, 33)), max_new_tokens=1)
    session.forward(25)
    session.probe.set_span_score(SpanScore(query=(20, 27), spans=((1, 6),)))
    with pytest.raises(DynheadsError, match="not all in this pass"):
        session.forward(5)
