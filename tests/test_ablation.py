"""The two-pass ablated decoder: 'none' is plain generation, masked passes equal from-scratch removal."""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch
from zoo import NoTokenizer, tiny_model

from dynheads.ablation import cascade as ablation
from dynheads.ablation.cascade import AblationSettings, ablated_generate, matched_count
from dynheads.engine.decoding import DecodingSession
from dynheads.engine.probe import RowEdit
from dynheads.engine.tracing import trace
from dynheads.errors import DynheadsError
from dynheads.models import LoadedModel


class _Sample:
    def __init__(self, ids, needle):
        self.input_ids, self.needle_positions = ids, needle


def _lm(family="llama"):
    return LoadedModel(model=tiny_model(family), tokenizer=NoTokenizer(), name=family, revision="random")


@contextmanager
def _heads_removed_from(lm, heads, first):
    """The plain model with ``heads`` removed ("zero": their slice of the o_proj input) at every query position
    >= ``first``: an independent reference for the decoder, which removes them at each recomputed position."""
    config = lm.model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads

    def pre_hook(layer_heads):
        def hook(module, args):
            (states,) = args
            states = states.clone()
            for head in layer_heads:
                states[:, first:, head * head_dim : (head + 1) * head_dim] = 0.0
            return (states,)

        return hook

    by_layer = {}
    for layer, head in heads:
        by_layer.setdefault(layer, []).append(head)
    layers = lm.model.model.layers
    handles = [layers[layer].self_attn.o_proj.register_forward_pre_hook(pre_hook(hs)) for layer, hs in by_layer.items()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _sample(seed=0, length=24):
    ids = torch.randint(3, 128, (length,), generator=torch.Generator().manual_seed(seed)).tolist()
    return _Sample(ids, list(range(4, 14)))


@pytest.mark.parametrize("family", ["llama", "gemma3"])
def test_none_strategy_is_plain_generation(family):
    lm, sample = _lm(family), _sample()
    with torch.no_grad():
        plain = lm.model.generate(
            torch.tensor([sample.input_ids]), max_new_tokens=10, min_new_tokens=10, do_sample=False, pad_token_id=0
        )
    result = ablated_generate(lm, sample, AblationSettings(strategy="none"), max_new_tokens=10)
    assert result.tokens == plain[0, len(sample.input_ids) :].tolist()
    assert all(m == [] for m in result.masked)


@pytest.mark.parametrize("family", ["llama", "qwen2"])  # qwen2 here has sliding-window layers (window 8)
def test_masked_step_equals_from_scratch_removal(family):
    lm, sample = _lm(family), _sample(1)
    heads = ((0, 1), (2, 3), (1, 0))
    steps = 6
    result = ablated_generate(lm, sample, AblationSettings(strategy="fixed", fixed_heads=heads), steps)
    assert len(result.tokens) == steps
    # From scratch: the whole sequence in one forward, heads removed at every position the decoder
    # recomputed (the last prompt token and every generated token), intact on the rest of the prompt.
    n = len(sample.input_ids)
    logits = []
    for t in range(steps):
        ids = torch.tensor([sample.input_ids + result.tokens[:t]])
        with _heads_removed_from(lm, heads, n - 1), torch.no_grad():
            logits.append(lm.model(ids).logits[0, -1])
    assert [int(x.argmax()) for x in logits] == result.tokens
    # Numerically too: the decoder's masked pass (cached prefix + one recomputed position) at step 0.
    session = DecodingSession(lm, sample.input_ids, [], max_new_tokens=1)
    session.forward(n - 1)
    session.probe.set_edits([RowEdit(removed=frozenset(heads))])
    assert (session.forward(1).logits - logits[0]).abs().max() <= 1e-4


def test_dynamic_ablation_masks_the_copy_heads_and_reports_counts():
    lm = _lm()
    # A prompt that repeats a pattern: the induction-like copy makes some heads point into the needle.
    base = torch.randint(3, 128, (10,), generator=torch.Generator().manual_seed(3)).tolist()
    sample = _Sample(base + base + base[:3], list(range(10, 20)))
    traced = trace(lm, sample, max_new_tokens=5, stop_at_eos=False)
    result = ablated_generate(lm, sample, AblationSettings(strategy="dynamic"), 5)
    # Step 0 is identical in both decoders: same clean pass, so the same dynamic set.
    assert result.dynamic_counts[0] == int(traced.copy_scores[0].sum())
    assert sorted(result.masked[0]) == sorted(traced.dynamic_heads(0))
    limited = ablated_generate(lm, sample, AblationSettings(strategy="dynamic", max_dynamic=1), 5)
    assert all(len(m) <= 1 for m in limited.masked)


def test_static_and_random_mask_the_matched_count():  # the mean-count reading (matching="mean")
    lm, sample = _lm(), _sample(4)
    ranking = tuple((layer, head) for layer in range(3) for head in range(4))
    static = ablated_generate(
        lm, sample, AblationSettings(strategy="static", matching="mean", count=3, static_ranking=ranking), 4
    )
    assert all(m == list(ranking[:3]) for m in static.masked)
    random_a = ablated_generate(lm, sample, AblationSettings(strategy="random", matching="mean", count=3, seed=7), 4)
    random_b = ablated_generate(lm, sample, AblationSettings(strategy="random", matching="mean", count=3, seed=7), 4)
    assert random_a.masked == random_b.masked and all(len(m) == 3 for m in random_a.masked)
    assert len({tuple(m) for m in random_a.masked}) > 1  # a new draw at each step
    assert matched_count([2, 3, 4, 3]) == 3


def test_bad_settings_are_refused():
    lm, sample = _lm(), _sample()
    with pytest.raises(DynheadsError, match="needs a head count"):
        ablated_generate(lm, sample, AblationSettings(strategy="random", matching="mean"), 2)
    with pytest.raises(DynheadsError, match="static head list"):
        ablated_generate(lm, sample, AblationSettings(strategy="static", matching="mean", count=2), 2)
    with pytest.raises(DynheadsError, match="does not have"):
        ablated_generate(lm, sample, AblationSettings(strategy="fixed", fixed_heads=((9, 9),)), 2)
    with pytest.raises(DynheadsError, match="unknown ablation strategy"):
        ablated_generate(lm, sample, AblationSettings(strategy="bogus"), 2)


def test_per_step_matching_masks_each_steps_own_dynamic_count(monkeypatch):
    """Default matching: at step t static / random mask exactly |D_t| heads, D_t from the control run's own
    clean pass at that step (here a stub rule, so that the counts vary from step to step)."""
    stub_sets = [(2, 1), (0, 3), (1, 0)]
    monkeypatch.setattr(
        ablation, "_dynamic_heads", lambda session, step, predicted, settings: stub_sets[: predicted % 4]
    )
    lm, sample = _lm(), _sample(5)
    ranking = tuple((layer, head) for layer in reversed(range(3)) for head in range(4))
    static = ablated_generate(lm, sample, AblationSettings(strategy="static", static_ranking=ranking), 8)
    random = ablated_generate(lm, sample, AblationSettings(strategy="random", seed=3), 8)
    for result in (static, random):
        assert [len(m) for m in result.masked] == result.dynamic_counts
        assert len(set(result.dynamic_counts)) > 1  # not one constant count in disguise
    assert static.masked == [list(ranking[:count]) for count in static.dynamic_counts]


def test_per_step_matching_reads_the_real_clean_pass():
    """Until the first step that masks something, the control run is the traced run, so its first non-empty
    D_t (real Eq. 1, no stub) is the traced step's, and exactly that many static heads are masked there."""
    lm, sample = _lm(), _sample(6)
    sample.needle_positions = list(range(len(sample.input_ids)))  # the whole prompt: this random model copies at t=1
    traced = trace(lm, sample, max_new_tokens=6, stop_at_eos=False)
    counts = [int(scores.sum()) for scores in traced.copy_scores]
    first = next(t for t, count in enumerate(counts) if count > 0)  # StopIteration = the prompt copies nothing
    ranking = tuple((layer, head) for layer in range(3) for head in range(4))
    static = ablated_generate(lm, sample, AblationSettings(strategy="static", static_ranking=ranking), first + 1)
    assert static.dynamic_counts == counts[: first + 1]
    assert [len(m) for m in static.masked] == counts[: first + 1]


def test_matching_settings_are_checked():
    lm, sample = _lm(), _sample()
    with pytest.raises(DynheadsError, match="unknown matching 'median'"):
        ablated_generate(lm, sample, AblationSettings(strategy="random", matching="median"), 2)
    with pytest.raises(DynheadsError, match="head count goes with matching='mean'"):
        ablated_generate(lm, sample, AblationSettings(strategy="random", count=2), 2)


def test_reasoning_heads_are_ordered_by_their_eq2_score():
    """Progressive ablation under Eq. 2 removes the highest-scoring reasoning heads first (not the heads with
    the highest attention peak anywhere, usually the sink)."""
    lm, sample = _lm(), _sample(6, length=120)  # keys 4..87 scored: outside the sink and the local window
    session = DecodingSession(lm, sample.input_ids, sample.needle_positions, max_new_tokens=1)
    session.forward(len(sample.input_ids) - 1)
    step = session.forward(1)
    settings = AblationSettings(strategy="dynamic", score="reasoning", threshold=0.0)
    heads = ablation._dynamic_heads(session.row, step, int(step.logits.argmax()), settings)
    scores = step.stats.reasoning_scores()
    assert len(heads) == int((scores > 0.0).sum()) > 2
    assert float(scores.max()) < 0.9  # scores spread out (not all ~1), so the order below is not float noise
    assert [float(scores[h]) for h in heads] == sorted((float(scores[h]) for h in heads), reverse=True)
    by_peak = sorted(heads, key=lambda h: (-float(step.stats.max_prob[h]), h))
    assert by_peak != heads  # the two orders differ on this step, so the check above decides something
    limited = ablated_generate(
        lm, sample, AblationSettings(strategy="dynamic", score="reasoning", threshold=0.0, max_dynamic=2), 1
    )
    assert limited.masked[0] == heads[:2]


@pytest.mark.parametrize("threshold", ["0.2", "relative:0.5"])
def test_eq2_dynamic_sets_follow_the_threshold_mode(threshold):
    # Step 0 of the ablated decoder sees the same clean pass as the tracer: its Eq. 2 set must be the traced
    # scores above the threshold, a multiple of the traced chance share in relative mode.
    from dynheads.thresholds import ReasoningThreshold

    lm, sample = _lm(), _sample(seed=4, length=60)
    traced = trace(lm, sample, max_new_tokens=3, stop_at_eos=False, local_window=8)
    settings = AblationSettings(strategy="dynamic", score="reasoning", threshold=threshold, local_window=8)
    result = ablated_generate(lm, sample, settings, 3)
    expected = ReasoningThreshold.parse(threshold).active(traced.reasoning_scores, traced.chance)[0]
    assert result.dynamic_counts[0] == int(expected.sum()) > 0
