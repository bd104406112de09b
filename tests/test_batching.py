"""Batched tracing against batch-1 tracing: every sequence of a batch is traced as if it were alone.

Oracle: ``trace`` (batch 1, the reference path, itself checked against eager attention in
test_probe_exactness). Prompts of different lengths share a batch, so the cache is left-padded and the
sliding windows (Mistral, Qwen2, Gemma 2/3, window 8) hold pads for the short prompts; Gemma 2 soft-caps.
A stop token chosen from the reference traces makes sequences end at different steps.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from zoo import FAMILIES, NoTokenizer, tiny_model

from dynheads import niah
from dynheads.engine.tracing import trace, trace_batch
from dynheads.errors import DynheadsError
from dynheads.models import LoadedModel

SCORE_TOL, HIDDEN_TOL = 1e-5, 1e-5
LENGTHS = (5, 23, 14, 40)  # shorter and longer than the sliding window, unsorted


class Prompt:
    def __init__(self, input_ids, needle_positions):
        self.input_ids, self.needle_positions = input_ids, needle_positions


def assert_same_trace(reference, batched, context=""):
    assert batched.tokens.tolist() == reference.tokens.tolist(), context
    assert batched.stop_reason == reference.stop_reason, context
    assert batched.prompt_length == reference.prompt_length
    assert np.array_equal(batched.argmax_pos, reference.argmax_pos), context
    assert np.array_equal(batched.copy_scores, reference.copy_scores), context
    assert np.allclose(batched.chance, reference.chance, rtol=1e-6), context  # each sequence's own chance share
    for name in ("needle_mass", "max_prob", "context_mass"):
        assert np.abs(getattr(batched, name) - getattr(reference, name)).max(initial=0) <= SCORE_TOL, (context, name)
    assert_same_reasoning_scores(reference, batched, context)
    assert set(batched.scores) == set(reference.scores), context
    if "write" in reference.scores:  # asked for (head_outputs): logits, to fp32 rounding of each step's largest
        ref, got = reference.scores["write"], batched.scores["write"]
        scale = np.maximum(np.abs(ref).max(axis=(1, 2), keepdims=True, initial=0), 1e-6)
        assert (np.abs(got - ref) <= 1e-4 * scale).all(), (context, "write")
    # fp32 matrix-matrix vs matrix-vector products accumulate in a different order through every layer:
    # compare relative to each step's largest component (SmolLM2's hidden states reach tens).
    scale = np.maximum(np.abs(reference.hidden).max(axis=-1, keepdims=True, initial=0), 1)
    assert (np.abs(batched.hidden - reference.hidden) <= HIDDEN_TOL * scale).all(), context


def assert_same_reasoning_scores(reference, batched, context):
    """Eq. 2 to fp32 rounding, propagated through the ratio: needle / (total - excluded).

    Where the denominator is tiny (almost all mass on sink and local keys) the subtraction cancels and
    even batch 1 is rounding noise (scores above 1 appear); there only the denominators must agree.
    """
    ref, got = reference.reasoning_scores, batched.reasoning_scores
    assert np.array_equal(got[reference.needle_mass == 0], ref[reference.needle_mass == 0]), context
    scored = ref > 0
    denominator = np.where(scored, reference.needle_mass / np.where(scored, ref, 1), np.inf)
    bound = SCORE_TOL * (1 + ref) / np.minimum(denominator, 1)
    conditioned = denominator >= 1e-3
    assert (np.abs(got - ref)[conditioned] <= bound[conditioned]).all(), context
    both = scored & (got > 0)
    got_denominator = batched.needle_mass[both] / got[both]
    assert np.abs(got_denominator - denominator[both]).max(initial=0) <= SCORE_TOL, context


def tiny_family_lm(family: str) -> LoadedModel:
    """A random tiny model of ``family`` (tests/zoo.py) with no tokenizer (not conftest's ``tiny_lm`` fixture)."""
    return LoadedModel(model=tiny_model(family), tokenizer=NoTokenizer(), name=family, revision="random")


def prompts(seed: int = 3) -> list[Prompt]:
    generator = torch.Generator().manual_seed(seed)
    return [
        Prompt(torch.randint(3, 128, (n,), generator=generator).tolist(), list(range(2, min(n, 9)))) for n in LENGTHS
    ]


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_batched_traces_equal_batch_one_traces(family):
    lm = tiny_family_lm(family)
    samples = prompts()
    settings = dict(sink_size=2, local_window=4, head_outputs=True)  # the write score too
    reference = [trace(lm, s, 12, **settings) for s in samples]
    # A stop token that one sequence emits mid-way: the sequences now end at different steps.
    lm.model.generation_config.eos_token_id = int(reference[1].tokens[5])
    reference = [trace(lm, s, 12, **settings) for s in samples]
    assert len({len(r.tokens) for r in reference}) > 1, "the stop token should end sequences at different steps"
    batched = trace_batch(lm, samples, 12, **settings)
    for index, (ref, got) in enumerate(zip(reference, batched, strict=True)):
        assert_same_trace(ref, got, f"{family} sample {index}")


@pytest.mark.parametrize("family", ["llama", "gemma2"])
@pytest.mark.parametrize("mode", ["zero", "uniform"])
def test_batched_traces_with_removed_heads_equal_batch_one(family, mode):
    lm = tiny_family_lm(family)
    samples = prompts(seed=4)
    settings = dict(removed_heads=[(0, 1), (2, 3)], ablation_mode=mode, stop_at_eos=False, head_outputs=True)
    reference = [trace(lm, s, 8, **settings) for s in samples]
    for ref, got in zip(reference, trace_batch(lm, samples, 8, **settings), strict=True):
        assert_same_trace(ref, got, f"{family} {mode}")


def test_batch_of_one_is_the_reference_path():
    lm = tiny_family_lm("qwen2")
    sample = prompts()[2]
    (got,) = trace_batch(lm, [sample], 10)
    ref = trace(lm, sample, 10)
    assert np.array_equal(got.needle_mass, ref.needle_mass) and np.array_equal(got.hidden, ref.hidden)


def test_embedded_model_batched_niah_equals_batch_one(embedded):
    tok = embedded.tokenizer
    samples = [
        niah.make_sample(tok, context_tokens=n, depth=d, seed=s)
        for n, d, s in ((300, 0.5, 1), (180, 0.2, 2), (420, 0.9, 3))
    ]
    assert len({len(s.input_ids) for s in samples}) == 3
    reference = [trace(embedded, s, 16) for s in samples]
    for index, (ref, got) in enumerate(zip(reference, trace_batch(embedded, samples, 16), strict=True)):
        assert_same_trace(ref, got, f"embedded sample {index}")


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_rows_force_their_own_responses_with_their_own_context_ends(family):
    """Issue 35: one batch teacher-forces each row's own response (of its own length) and measures each row's
    context up to its own end (HaluEval's batches); every row equals ``trace`` of that sample alone."""
    lm = tiny_family_lm(family)
    samples = prompts(seed=8)
    generator = torch.Generator().manual_seed(9)
    forced = [torch.randint(3, 128, (n,), generator=generator).tolist() for n in (5, 2, 7, 4)]
    ends = [max(len(s.input_ids) - 3, 1) for s in samples]
    reference = [trace(lm, s, forced_tokens=f, context_end=e) for s, f, e in zip(samples, forced, ends, strict=True)]
    batched = trace_batch(lm, samples, forced_rows=forced, context_ends=ends)
    assert [r.tokens.tolist() for r in batched] == forced
    for index, (ref, got) in enumerate(zip(reference, batched, strict=True)):
        assert_same_trace(ref, got, f"{family} forced row {index}")
    with pytest.raises(DynheadsError, match="not both"):
        trace_batch(lm, samples, forced_tokens=forced[0], forced_rows=forced)
    with pytest.raises(DynheadsError, match="4 samples but 1 forced responses"):
        trace_batch(lm, samples, forced_rows=forced[:1])
    with pytest.raises(DynheadsError, match="4 samples but 2 context ends"):
        trace_batch(lm, samples, forced_rows=forced, context_ends=ends[:2])
