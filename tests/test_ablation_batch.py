"""The batched two-pass ablation against the batch-1 reference ``ablated_generate``.

Each batch mixes strategies (dynamic by Eq. 2, random with a fixed count, fixed heads, none), prompts of
different lengths (left-padded caches, sliding windows holding pads) and a stop token that ends sequences at
different steps, so rows mask different heads at different steps and leave the batch at their own end.
"""

from __future__ import annotations

import pytest
from test_batching import prompts, tiny_family_lm

from dynheads import niah
from dynheads.ablation import cascade as ablation
from dynheads.ablation.cascade import AblationSettings, ablated_generate, ablated_generate_batch
from dynheads.errors import DynheadsError


def mixed_settings(mode: str) -> list[AblationSettings]:
    common = dict(mode=mode, sink_size=2, local_window=4)
    return [
        AblationSettings(strategy="dynamic", score="reasoning", threshold="0.2", **common),
        AblationSettings(strategy="random", matching="mean", count=3, seed=5, **common),
        AblationSettings(strategy="fixed", fixed_heads=((0, 1), (1, 0)), **common),
        AblationSettings(strategy="none", **common),
    ]


def assert_same_ablation(reference, batched, context):
    assert batched.tokens == reference.tokens, context
    assert batched.stop_reason == reference.stop_reason, context
    assert batched.dynamic_counts == reference.dynamic_counts, context
    assert batched.masked == reference.masked, context
    assert batched.compensated == reference.compensated, context
    assert batched.text == reference.text, context


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma2"])
@pytest.mark.parametrize("mode", ["zero", "uniform"])
def test_batched_ablation_equals_batch_one(family, mode):
    lm = tiny_family_lm(family)
    samples, settings = prompts(seed=6), mixed_settings(mode)
    reference = [ablated_generate(lm, s, a, 10) for s, a in zip(samples, settings, strict=True)]
    lm.model.generation_config.eos_token_id = int(reference[3].tokens[4])  # the un-ablated row stops mid-way
    reference = [ablated_generate(lm, s, a, 10) for s, a in zip(samples, settings, strict=True)]
    assert len({len(r.tokens) for r in reference}) > 1, "rows should leave the batch at different steps"
    assert any(r.masked[0] for r in reference) and any(not m for r in reference for m in r.masked)
    batched = ablated_generate_batch(lm, samples, settings, 10)
    for index, (ref, got) in enumerate(zip(reference, batched, strict=True)):
        assert_same_ablation(ref, got, f"{family} {mode} sample {index}")


def test_batched_ablation_refuses_mixed_masking_modes():
    lm = tiny_family_lm("llama")
    settings = mixed_settings("zero")[:1] + mixed_settings("uniform")[1:2]
    with pytest.raises(DynheadsError, match="one masking mode"):
        ablated_generate_batch(lm, prompts()[:2], settings, 4)
    with pytest.raises(DynheadsError, match="2 samples but 1"):
        ablated_generate_batch(lm, prompts()[:2], settings[:1], 4)


def test_embedded_model_batched_niah_ablation_equals_batch_one(embedded):
    """Eq. 1 dynamic heads of a real copying model: the rows mask the heads that copy the UUID."""
    tok = embedded.tokenizer
    samples = [
        niah.make_sample(tok, context_tokens=n, depth=d, seed=s)
        for n, d, s in ((300, 0.5, 1), (180, 0.2, 2), (420, 0.9, 3))
    ]
    settings = [
        AblationSettings(strategy="dynamic"),
        AblationSettings(strategy="random", seed=1),
        AblationSettings(strategy="dynamic", max_dynamic=2),
    ]
    reference = [ablated_generate(embedded, s, a, 12) for s, a in zip(samples, settings, strict=True)]
    assert sum(len(m) for r in reference for m in r.masked) > 0, "the embedded model should copy"
    for index, (ref, got) in enumerate(
        zip(reference, ablated_generate_batch(embedded, samples, settings, 12), strict=True)
    ):
        assert_same_ablation(ref, got, f"embedded sample {index}")


@pytest.mark.parametrize("mode", ["zero", "mean"])
def test_the_arms_of_one_prompt_share_its_prefill_and_equal_each_arm_alone(monkeypatch, mode):
    """Issue 36: the strategies of one sample fork one prefill of its prompt. Decoded one row at a time they
    equal each strategy run by itself exactly; as one batch, as the batch tests above."""
    lm = tiny_family_lm("qwen2")
    sample, other = prompts(seed=6)[:2]
    settings = mixed_settings(mode)
    reference = [ablated_generate(lm, sample, a, 8) for a in settings] + [ablated_generate(lm, other, settings[0], 8)]
    assert any(r.masked[0] for r in reference) and len({tuple(r.tokens) for r in reference}) > 1
    prefilled = []
    real = ablation.prefilled_session
    monkeypatch.setattr(ablation, "prefilled_session", lambda lm, s, *a: prefilled.append(s) or real(lm, s, *a))
    rows = [sample] * len(settings) + [other]
    for rows_together in (1, None):
        prefilled.clear()
        shared = ablated_generate_batch(lm, rows, settings + settings[:1], 8, rows_together=rows_together)
        assert prefilled == [sample, other]  # one prefill per distinct prompt
        for index, (ref, got) in enumerate(zip(reference, shared, strict=True)):
            assert_same_ablation(ref, got, f"{mode} row {index}, {rows_together} together")
    with pytest.raises(DynheadsError, match="at least one at a time"):
        ablated_generate_batch(lm, rows[:1], settings[:1], 4, rows_together=0)
