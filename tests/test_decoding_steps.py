"""The one greedy loop (``DecodingSession.steps``) and the probe passed as a forward keyword argument."""

from __future__ import annotations

import pytest
import torch
from zoo import FAMILIES, NoTokenizer, tiny_model

from dynheads.decoding import DecodingSession, trace
from dynheads.errors import DynheadsError
from dynheads.models import LoadedModel
from dynheads.probe import AttentionProbe, attached


def _lm(family="llama"):
    return LoadedModel(model=tiny_model(family), tokenizer=NoTokenizer(), name=family, revision="random")


def _prompt(seed=0, length=16):
    return torch.randint(3, 128, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_the_probe_reaches_the_attention_only_through_the_forward_call(family):
    """No global state: under ``attached`` a forward without the probe's keyword argument is plain attention (SDPA;
    chunked eager for Gemma 2's soft-capped logits, which SDPA cannot take) and leaves the probe untouched; with it,
    every layer of every family reports its statistics."""
    model = tiny_model(family)
    ids = torch.tensor([_prompt(1)])
    probe = AttentionProbe(model.config.num_hidden_layers, model.config.num_attention_heads)
    probe.begin_forward(ids.shape[1] - 1)
    with torch.no_grad():
        plain = model(ids).logits[0, -1]
        with attached(model, probe) as probe_kwargs:
            without = model(ids).logits[0, -1]
            assert float(probe.stats.total_mass.abs().sum()) == 0.0
            traced = model(ids, **probe_kwargs).logits[0, -1]
    assert (without - plain).abs().max() <= 1e-4  # eager-default families: SDPA vs eager rounding
    assert (traced - plain).abs().max() <= 1e-4
    assert torch.allclose(probe.stats.total_mass, torch.ones_like(probe.stats.total_mass), atol=1e-5)
    assert model.config._attn_implementation in ("sdpa", "eager")  # restored after the block


def test_two_probes_on_one_model_do_not_see_each_other():
    model = tiny_model("llama")
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    first, second = AttentionProbe(layers, heads), AttentionProbe(layers, heads)
    first.set_removed_heads([(0, 1)])  # a setting of the first probe only
    ids = torch.tensor([_prompt(2)])
    first.begin_forward(ids.shape[1] - 1)
    second.begin_forward(ids.shape[1] - 1)
    with torch.no_grad(), attached(model, first) as first_kwargs, attached(model, second) as second_kwargs:
        removed = model(ids, **first_kwargs).logits[0, -1]
        intact = model(ids, **second_kwargs).logits[0, -1]
    assert (removed - intact).abs().max() > 1e-4
    assert (intact - model(ids).logits[0, -1]).abs().max() <= 1e-4


def test_steps_is_the_greedy_loop_of_trace():
    lm = _lm()
    sample = type("S", (), {"input_ids": _prompt(3), "needle_positions": [2, 3]})()
    traced = trace(lm, sample, max_new_tokens=6, stop_at_eos=False)
    session = DecodingSession(lm, sample.input_ids, sample.needle_positions, max_new_tokens=6)
    steps = session.steps(6)
    for step in steps:
        assert torch.equal(session.copy_scores(step.result.stats, step.token),
                           torch.from_numpy(traced.copy_scores[step.index]))
    assert steps.tokens == traced.tokens.tolist() and steps.stop_reason == "max_new_tokens"
    assert session.length == len(sample.input_ids) + 5  # no pass after the last step


def test_a_replaced_token_is_emitted_and_fed():
    lm = _lm()
    prompt = _prompt(4)
    session = DecodingSession(lm, prompt, [], max_new_tokens=4)
    steps = session.steps(4)
    for step in steps:
        step.token = 7 + step.index
    assert steps.tokens == [7, 8, 9, 10]
    assert session.ids[len(prompt) : len(prompt) + 3].tolist() == [7, 8, 9]  # fed to the next passes
    forced = DecodingSession(lm, prompt + [7, 8, 9], [], max_new_tokens=1)
    last = forced.forward(len(prompt) + 3).logits
    assert (step.result.logits - last).abs().max() <= 1e-4  # the last pass read the replaced tokens


def test_a_stop_token_ends_the_loop_unemitted_and_rerun_needs_a_checkpoint():
    lm = _lm()
    session = DecodingSession(lm, _prompt(5), [], max_new_tokens=5)
    steps = session.steps(5, stop_ids={99})
    seen = []
    for step in steps:
        seen.append(step.index)
        with pytest.raises(DynheadsError, match="rerunnable"):
            step.rerun()
        if step.index == 1:
            step.token = 99
    assert seen == [0, 1] and steps.stop_reason == "eos" and len(steps.tokens) == 1


def test_rerun_replaces_the_pass():
    lm = _lm()
    prompt = _prompt(6)
    session = DecodingSession(lm, prompt, [], max_new_tokens=3)
    session.forward(len(prompt) - 1)
    reruns = []
    for step in session.steps(3, rerunnable=True):
        session.probe.set_removed_heads([(1, 2)])
        reruns.append(step.rerun())
        session.probe.set_removed_heads(())
        assert step.token == int(reruns[-1].logits.argmax())
    assert session.length == len(prompt) + 2  # the clean passes left nothing in the cache
    reference = DecodingSession(lm, prompt, [], max_new_tokens=1)
    reference.forward(len(prompt) - 1)
    reference.probe.set_removed_heads([(1, 2)])
    masked = reference.forward(1)
    assert torch.equal(reruns[0].logits, masked.logits)
    clean = DecodingSession(lm, prompt, [], max_new_tokens=1)
    clean.forward(len(prompt) - 1)
    assert not torch.equal(clean.forward(1).logits, masked.logits)  # the removal changed the pass
