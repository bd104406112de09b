"""Teacher-forced single-step ablation: each masked step equals a from-scratch pass on the clean history, for
every masking mode; the settings decoded as one batch equal each setting alone; the dose arms pick their heads:
ceil(f |D_t|) at every step, the dynamic arm inside D_t while f <= 1.

The tiny random model copies nothing (Eq. 1 D_t is empty at every step), so the dose tests find D_t by Eq. 2 at
chance (``relative:1``): sets of 0-2 heads, empty steps among them."""

from __future__ import annotations

import math
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from zoo import NoTokenizer, tiny_model

from dynheads.ablation.cascade import AblationSettings, ablated_generate
from dynheads.ablation.strategies import DOSE_ARMS, MEAN_ARMS
from dynheads.ablation.teacher_forced import forced_ablation
from dynheads.engine.probe import ABLATION_MODES
from dynheads.models import LoadedModel

SPLIT = {"score": "reasoning", "threshold": "relative:1"}  # Eq. 2 at chance: D_t of 0-2 heads on the tiny model
# half of chance: every head is in D_t, far from the threshold, so fp32 rounding between a batch and one row
# cannot move a head across it (at chance it can)
EVERY_HEAD = {"score": "reasoning", "threshold": "relative:0.5"}


class _Sample:
    def __init__(self, ids, needle):
        self.input_ids, self.needle_positions = ids, needle


def _lm(family="llama"):
    return LoadedModel(model=tiny_model(family), tokenizer=NoTokenizer(), name=family, revision="random")


def _sample(seed=1, length=24):
    ids = torch.randint(3, 128, (length,), generator=torch.Generator().manual_seed(seed)).tolist()
    return _Sample(ids, list(range(4, 14)))


def _head_dim(lm):
    config = lm.model.config
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


@contextmanager
def _hooks(lm, heads, replacement):
    """The plain model with each head's slice of the o_proj input at the *last* position replaced by
    ``replacement(layer, head, states, values)`` (``values``: that layer's v_proj output of this forward)."""
    dim, layers, captured, handles = _head_dim(lm), lm.model.model.layers, {}, []

    def value_hook(layer):
        def hook(module, args, output):
            captured[layer] = output

        return hook

    def pre_hook(layer):
        def hook(module, args):
            (states,) = args
            states = states.clone()
            for lyr, head in heads:
                if lyr == layer:
                    states[:, -1, head * dim : (head + 1) * dim] = replacement(layer, head, states, captured[layer])
            return (states,)

        return hook

    for layer in {layer for layer, _ in heads}:
        handles.append(layers[layer].self_attn.v_proj.register_forward_hook(value_hook(layer)))
        handles.append(layers[layer].self_attn.o_proj.register_forward_pre_hook(pre_hook(layer)))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _prompt_means(lm, ids):
    """Each head's mean o_proj input over ``ids`` (the prefilled prompt), ``{layer: [positions, H * D]}`` means."""
    means, handles = {}, []
    for index, layer in enumerate(lm.model.model.layers):

        def hook(module, args, index=index):
            means[index] = args[0][0].mean(0)

        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(hook))
    with torch.no_grad():
        lm.model(torch.tensor([ids]))
    for handle in handles:
        handle.remove()
    return means


def _reference(lm, sample, tokens, heads, mode):
    """From scratch: log p(tokens[t]) with ``heads`` replaced at the last position only (clean history)."""
    config, dim = lm.model.config, _head_dim(lm)
    groups = config.num_attention_heads // config.num_key_value_heads
    means = _prompt_means(lm, sample.input_ids[:-1])

    def replacement(layer, head, states, values):
        if mode == "zero":
            return 0.0
        if mode == "mean":
            return means[layer][head * dim : (head + 1) * dim]
        kv = head // groups  # uniform attention: the mean value over every key the last query sees
        return values[0, :, kv * dim : (kv + 1) * dim].mean(0)

    out = []
    for t, token in enumerate(tokens):
        with _hooks(lm, heads, replacement), torch.no_grad():
            logits = lm.model(torch.tensor([list(sample.input_ids) + tokens[:t]])).logits[0, -1]
        out.append(float(torch.log_softmax(logits.float(), -1)[token]))
    return out


@pytest.mark.parametrize("mode", ABLATION_MODES)
def test_forced_step_equals_from_scratch_masking(mode):
    lm, sample = _lm(), _sample()
    heads = ((0, 1), (2, 3), (1, 0))
    result = forced_ablation(lm, sample, [AblationSettings("fixed", mode=mode, fixed_heads=heads)], 6)
    plain = ablated_generate(lm, sample, AblationSettings("none"), 6)
    assert result.tokens == plain.tokens  # the clean greedy answer
    reference = _reference(lm, sample, result.tokens, heads, mode)
    assert np.allclose(result.masked_logprob[0], reference, atol=1e-4)
    clean = _reference(lm, sample, result.tokens, (), "zero")
    assert np.allclose(result.clean_logprob, clean, atol=1e-4)
    assert np.abs(result.drop(0)).max() > 1e-3  # the masking changed something: the test could fail


def test_batched_settings_equal_each_setting_alone():
    lm, sample = _lm(), _sample(2)
    static = ((2, 1), (0, 3), (1, 2), (2, 0))
    settings = [
        AblationSettings(arm, fraction=fraction, static_ranking=static, seed=5, mode="mean", **SPLIT)
        for arm in ("dynamic", "static", "static_outside", "random")
        for fraction in (0.5, 2.0)
    ]
    together = forced_ablation(lm, sample, settings, 5)
    for index, setting in enumerate(settings):
        alone = forced_ablation(lm, sample, [setting], 5)
        assert alone.masked == [together.masked[index]]
        assert np.allclose(alone.masked_logprob[0], together.masked_logprob[index], atol=1e-5)
        assert alone.flipped[0] == together.flipped[index]


@pytest.mark.parametrize("family", ["llama", "gemma2"])
def test_samples_decoded_together_equal_each_alone(family, monkeypatch):
    """Issue 36: ``forced_ablations`` decodes the samples' clean answers as one batch (prompts of three lengths) and
    measures each from its clean cache rebuilt in one pass over its answer: equal to ``forced_ablation`` of each
    alone up to fp32 rounding (Gemma 2's soft-capped logits have no one pass: those samples are measured alone);
    one sample is the reference path exactly."""
    from dynheads.ablation import teacher_forced

    lm = _lm(family)
    samples = [_sample(5, length=24), _sample(6, length=31), _sample(7, length=40)]
    static = ((2, 1), (0, 3), (1, 2), (2, 0), (0, 0))
    settings = [
        [  # every arm's set is fixed by the stable |D_t| = 12 (D_t's order is fp32 ties: dynamic takes all of it)
            AblationSettings(arm, fraction=f, static_ranking=static, seed=seed, mode="mean", **EVERY_HEAD)
            for arm, f in (("dynamic", 1.0), ("static", 0.5), ("static_outside", 1.0), ("random", 0.5))
        ]
        for seed in range(len(samples))
    ]
    batches, real_decode = [], teacher_forced.decode
    monkeypatch.setattr(
        teacher_forced, "decode", lambda sessions, *a: batches.append(len(sessions)) or real_decode(sessions, *a)
    )
    together = teacher_forced.forced_ablations(lm, samples, settings, 6)
    assert batches[0] == len(samples)  # the clean answers decoded as one batch
    for sample, rows, batched in zip(samples, settings, together, strict=True):
        alone = forced_ablation(lm, sample, rows, 6)
        assert len(alone.tokens) >= 3
        assert batched.tokens == alone.tokens and _as_sets(batched.masked) == _as_sets(alone.masked)
        np.testing.assert_allclose(batched.clean_logprob, alone.clean_logprob, rtol=0, atol=2e-5)
        np.testing.assert_allclose(batched.masked_logprob, alone.masked_logprob, rtol=0, atol=2e-5)
        assert batched.flipped == alone.flipped
        assert np.abs(np.asarray(batched.masked_logprob) - np.asarray(batched.clean_logprob)[None]).max() > 1e-3
    assert teacher_forced.forced_ablations(lm, samples[:1], settings[:1], 6) == [
        forced_ablation(lm, samples[0], settings[0], 6)
    ]


FRACTIONS = (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)


def _as_sets(masked):
    """Per setting and step the heads removed, as a set (the order a step removes them in changes nothing)."""
    return [[sorted(step) for step in per_step] for per_step in masked]


@pytest.mark.parametrize("length", [24, 60])  # D_t of 0-2 heads (empty steps among them), of 4-8 heads
def test_every_arm_masks_ceil_f_times_d_t_and_dynamic_stays_inside_d_t(length):
    """Issue 59: at step t every arm masks ceil(f |D_t|) heads (none where D_t is empty); the dynamic arm is D_t's
    first heads while f <= 1 (a subset of D_t), D_t then the step's next-ranked heads past 1; static the list's
    top, static_outside its top outside D_t, random a draw per step; the mean arms the answer's mean |D_t|."""
    lm, sample = _lm(), _sample(3, length=length)
    order = np.random.default_rng(0).permutation(lm.num_layers * lm.num_heads)
    static = tuple((int(i) // lm.num_heads, int(i) % lm.num_heads) for i in order)  # every head, ranked
    grid = [(arm, f) for arm in DOSE_ARMS for f in FRACTIONS]
    settings = [AblationSettings(arm, fraction=f, static_ranking=static, seed=4, **SPLIT) for arm, f in grid]
    settings += [AblationSettings(MEAN_ARMS[arm], matching="mean", static_ranking=static, **SPLIT) for arm in MEAN_ARMS]
    result = forced_ablation(lm, sample, settings, 6)
    counts, heads = result.dynamic_counts, lm.num_layers * lm.num_heads
    assert (0 in counts and max(counts) == 2) if length == 24 else min(counts) >= 4  # the cases the test is for
    for row, (arm, f) in enumerate(grid):
        for t, (masked, dynamic) in enumerate(zip(result.masked[row], result.dynamic, strict=True)):
            k = min(math.ceil(f * len(dynamic)), heads)
            outside = [h for h in static if h not in set(dynamic)]
            assert len(masked) == (min(k, len(outside)) if arm == "static_outside" else k), (arm, f, t)
            if arm == "dynamic" and f <= 1:
                assert set(masked) <= set(dynamic) and masked == dynamic[:k]
            if arm == "dynamic" and f > 1:
                assert masked[: len(dynamic)] == dynamic and len(set(masked)) == k
            if arm == "static":
                assert masked == list(static[:k])
            if arm == "static_outside":
                assert masked == outside[:k]
    random = result.masked[grid.index(("random", 1.0))]
    assert len({tuple(step) for step in random if step}) > 1  # a new draw at each step
    mean = round(float(np.mean(counts)))
    for row in range(len(grid), len(settings)):
        assert [len(step) for step in result.masked[row]] == [mean] * len(counts)  # the paper's literal controls


def test_ceil_of_the_fraction_is_rounded_before_it_is_taken():
    from dynheads.ablation.cascade import dose_count

    assert [dose_count(f, 4) for f in (0.25, 0.5, 0.75, 1.0, 1.5, 2.0)] == [1, 2, 3, 4, 6, 8]
    assert dose_count(0.1, 30) == 3 and dose_count(0.3, 10) == 3 and dose_count(1.0, 0) == 0
    assert dose_count(0.25, 1) == 1  # a non-empty D_t always loses at least one head


@pytest.mark.parametrize(("score", "threshold"), [("copy", "relative:3"), ("reasoning", "relative:1")])
def test_a_dose_ranks_every_head_with_d_t_first(score, threshold):
    from dynheads.engine.decoding import DecodingSession

    lm, sample = _lm(), _sample(6, length=120)
    session = DecodingSession(lm, sample.input_ids, sample.needle_positions, max_new_tokens=1)
    session.forward(len(sample.input_ids) - 1)
    step = session.forward(1)
    spec = AblationSettings("dynamic", score=score, threshold=threshold).score_spec()
    predicted = int(step.logits.argmax())
    dynamic = spec.step_heads(step.stats, session.row, predicted)
    ranking = spec.step_ranking(step.stats, session.row, predicted)
    heads = lm.num_layers * lm.num_heads
    assert sorted(ranking) == sorted((layer, head) for layer in range(lm.num_layers) for head in range(lm.num_heads))
    assert len(ranking) == heads and ranking[: len(dynamic)] == dynamic
    rest = ranking[len(dynamic) :]
    values = step.stats.needle_mass if score == "copy" else step.stats.reasoning_scores()
    assert [float(values[h]) for h in rest] == sorted((float(values[h]) for h in rest), reverse=True)
    if score == "reasoning":
        assert 0 < len(dynamic) < heads  # the threshold splits the heads: D_t first is a real constraint


@pytest.mark.parametrize("family", ["llama", "qwen3", "phi3", "mistral", "gemma2"])
@pytest.mark.parametrize("mode", ABLATION_MODES)
def test_the_one_pass_equals_the_step_by_step_decode(family, mode, monkeypatch):
    """Every step of every setting in one pass against the shared clean cache (``engine.teacher``) gives the
    log-probabilities and flips of decoding the settings' rows step by step; a model whose attention the pass does
    not reproduce (Mistral's sliding window, Gemma 2's soft-capped logits) is decoded step by step."""
    from dynheads.engine import decoding, teacher

    lm, sample = _lm(family), _sample(4, length=40)
    static = ((2, 1), (0, 3), (1, 2), (2, 0), (0, 0))
    settings = [  # Mistral's window leaves no Eq. 2 score: D_t is empty there, the given counts still mask heads
        AblationSettings("dynamic", fraction=0.5, static_ranking=static, seed=3, mode=mode, **EVERY_HEAD),
        *(
            AblationSettings(arm, matching="mean", count=2, static_ranking=static, seed=3, mode=mode, **EVERY_HEAD)
            for arm in ("static", "random")
        ),
    ]
    passes = []
    real_pass = teacher.teacher_pass

    def counted(*args, **kwargs):
        passes.append("tried")
        found = real_pass(*args, **kwargs)
        passes.append("one pass")
        return found

    monkeypatch.setattr(decoding, "teacher_pass", counted)
    one = forced_ablation(lm, sample, settings, 6)

    def unsupported(*args, **kwargs):
        raise teacher.Unsupported("step by step")

    monkeypatch.setattr(decoding, "teacher_pass", unsupported)
    stepwise = forced_ablation(lm, sample, settings, 6)
    reproduced = family not in ("mistral", "gemma2")
    assert passes == (["tried", "one pass"] if reproduced else ["tried"])
    assert one.tokens == stepwise.tokens and one.masked == stepwise.masked
    assert len(one.tokens) >= 3
    np.testing.assert_allclose(one.masked_logprob, stepwise.masked_logprob, rtol=0, atol=2e-5)
    assert one.flipped == stepwise.flipped
    assert np.abs(np.asarray(one.masked_logprob) - np.asarray(one.clean_logprob)[None]).max() > 1e-3


def test_the_contrast_arm_masks_the_second_scores_top_heads_as_many_as_d_t():
    """Issue 63: with D_t from the write score (W_t) and ``contrast`` another score, the contrast arm masks
    ceil(f |W_t|) heads at step t, the contrast score's own set first: with the contrast equal to the score it is
    exactly the dynamic arm at every dose, and it records the contrast set's size per step."""
    lm, sample = _lm(), _sample(3, length=60)
    write = {"score": "write", "threshold": "0"}  # every head whose needle keys write the token up: about half
    same = [
        AblationSettings(arm, fraction=f, contrast="write", contrast_threshold="0", **write)
        for arm in ("dynamic", "contrast")
        for f in FRACTIONS
    ]
    result = forced_ablation(lm, sample, same, 6)
    assert 0 < max(result.dynamic_counts) < lm.num_layers * lm.num_heads
    for i in range(len(FRACTIONS)):
        assert result.masked[len(FRACTIONS) + i] == result.masked[i]
    assert result.contrast_sizes == result.dynamic_counts

    other = [AblationSettings("contrast", fraction=f, contrast="reasoning", **write) for f in FRACTIONS]
    heads = lm.num_layers * lm.num_heads
    result = forced_ablation(lm, sample, other, 6)
    for row, f in enumerate(FRACTIONS):
        for masked, dynamic in zip(result.masked[row], result.dynamic, strict=True):
            assert len(set(masked)) == len(masked) == min(math.ceil(round(f * len(dynamic), 9)), heads)
    assert result.contrast_sizes != result.dynamic_counts  # Eq. 2's sets at 3 x chance are not the write sets


def test_a_contrast_arm_without_a_contrast_score_and_a_write_score_at_a_multiple_of_chance_are_refused():
    from dynheads.errors import DynheadsError

    lm, sample = _lm(), _sample(3)
    with pytest.raises(DynheadsError, match="needs a second head score"):
        forced_ablation(lm, sample, [AblationSettings("contrast", fraction=1.0, **SPLIT)], 2)
    with pytest.raises(DynheadsError, match="not an attention share"):
        forced_ablation(lm, sample, [AblationSettings("dynamic", fraction=1.0, score="write")], 2)
