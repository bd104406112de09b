"""QRHead's heads on a needle stream (issue 63's detector panel): per test, the attention mass the question rows put
on the needle minus the same under the content-free query, equal to eager attention; the list ranks heads by its
mean over the static stream's tests and loads like any static list."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dynheads.analysis.headlists import load_head_list
from dynheads.errors import DynheadsError
from dynheads.experiments.static import run_static_qrhead
from dynheads.rag.rerank import needle_prompt
from dynheads.settings import StaticConfig
from dynheads.tasks.registry import get_task


def _eager_needle_mass(model, ids: list[int], rows: tuple[int, int], needle: tuple[int, int]) -> np.ndarray:
    """``[L, H]``: eager attention from ``rows`` onto the ``needle`` keys, summed over keys, averaged over rows."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            attentions = model(torch.tensor([ids]), output_attentions=True).attentions
    finally:
        model.set_attn_implementation(previous)
    return np.stack(
        [a[0, :, rows[0] : rows[1], needle[0] : needle[1]].float().sum(-1).mean(-1).numpy() for a in attentions]
    )


def test_qrhead_needle_scores_equal_eager_attention_and_rank_the_list(tiny_model_dir, tiny_lm, tmp_path):
    config = StaticConfig(model=str(tiny_model_dir), lengths=(200,), depths=(0.2, 0.8), samples=2, max_new_tokens=4)
    run = run_static_qrhead(config, tmp_path / "qrhead", lm=tiny_lm, progress=False)
    records = run.records()
    assert len(records) == 2 and all(r["seed"] is not None for r in records)  # the static stream's seeded tests
    grid = get_task("niah").grid(config.niah_config(), tiny_lm.tokenizer)
    per_test = []
    for sample in grid.samples:
        prompt = needle_prompt(tiny_lm.tokenizer, sample, get_task("niah").prompt(config.niah_config())["question"])
        assert prompt.spans == ((sample.needle_positions[0], sample.needle_positions[-1] + 1),)
        assert prompt.query[0] >= sample.context_span[1]  # the question rows come after the haystack
        real = _eager_needle_mass(tiny_lm.model, prompt.input_ids, prompt.query, prompt.spans[0])
        null = _eager_needle_mass(tiny_lm.model, prompt.null_ids, prompt.null_query, prompt.spans[0])
        saved = np.load(run.arrays_path(sample.sample_id))["qrhead"]
        np.testing.assert_allclose(saved, real - null, atol=1e-5)
        per_test.append(real - null)
    heads = load_head_list(run.path / "static_heads-qrhead.json", tiny_lm.num_layers, tiny_lm.num_heads)
    mean = np.mean(per_test, axis=0)
    order = np.argsort(-mean.ravel(), kind="stable")[:5]
    best = [(int(k) // mean.shape[1], int(k) % mean.shape[1]) for k in order]
    assert list(heads.heads[:5]) == best
    summary = (run.path / "static_summary-qrhead.json").read_text()
    assert '"split": "static"' in summary and '"num_tests": 2' in summary


def test_a_question_task_is_refused_before_the_model_loads(tmp_path):
    config = StaticConfig(model="/no/such/model", task="hotpotqa", samples=2)
    with pytest.raises(DynheadsError, match="use dynheads rerank"):
        run_static_qrhead(config, tmp_path / "q", progress=False)
