"""The one decode loop (``decoding.decode`` and its step policies) and the probe as a forward keyword argument."""

from __future__ import annotations

import warnings

import pytest
import torch
from zoo import FAMILIES, NoTokenizer, tiny_model

from dynheads.engine.decoding import DecodingSession, Emit, Rerun, StepPolicy, Stop, decode
from dynheads.engine.probe import AttentionProbe, Measure, RowEdit, attached
from dynheads.engine.tracing import trace
from dynheads.errors import DynheadsError
from dynheads.kv.cache import HeadwiseCache, headwise_generate
from dynheads.models import LoadedModel, with_cache


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
    first.set_edits([RowEdit(removed=frozenset({(0, 1)}))])  # a setting of the first probe only
    ids = torch.tensor([_prompt(2)])
    first.begin_forward(ids.shape[1] - 1)
    second.begin_forward(ids.shape[1] - 1)
    with torch.no_grad(), attached(model, first) as first_kwargs, attached(model, second) as second_kwargs:
        removed = model(ids, **first_kwargs).logits[0, -1]
        intact = model(ids, **second_kwargs).logits[0, -1]
    assert (removed - intact).abs().max() > 1e-4
    assert (intact - model(ids).logits[0, -1]).abs().max() <= 1e-4


def test_a_decoding_loop_switches_the_attention_once_and_restores_it(monkeypatch):
    """Switching the attention implementation walks every module: ``decode`` routes once for all its passes (a
    session's passes inside it do not switch again), and the model's own implementation is back afterwards."""
    lm = _lm()
    model = lm.model
    before = model.config._attn_implementation
    switches = []
    switch = model.set_attn_implementation
    monkeypatch.setattr(model, "set_attn_implementation", lambda name: (switches.append(name), switch(name))[1])
    sample = type("S", (), {"input_ids": _prompt(4), "needle_positions": [2]})()
    traced = trace(lm, sample, max_new_tokens=5, stop_at_eos=False)
    assert traced.num_steps == 5  # a prefill and four decode passes
    assert switches == ["dynheads_probe", before]
    assert model.config._attn_implementation == before
    session = DecodingSession(lm, sample.input_ids, max_new_tokens=1)
    session.forward()  # a pass outside a decoding loop switches for itself
    assert switches[2:] == ["dynheads_probe", before]


class _Policy(StepPolicy):
    """A test policy: emits ``emit(index, result)`` (default greedy), optionally reruns once under ``rerun_edit``."""

    def __init__(self, emit=None, rerun_edit=None, rerunnable=False):
        self.emit, self.rerun_edit, self.rerunnable = emit, rerun_edit, rerunnable
        self.seen = []  # (index, rerun, result)

    def after(self, index, row, result, rerun):
        self.seen.append((index, rerun, result))
        if self.rerun_edit is not None and not rerun:
            return Rerun(self.rerun_edit)
        return self.emit(index, result) if self.emit else Emit(int(result.logits.argmax()))


def test_decode_is_the_greedy_loop_of_trace():
    lm = _lm()
    sample = type("S", (), {"input_ids": _prompt(3), "needle_positions": [2, 3]})()
    traced = trace(lm, sample, max_new_tokens=6, stop_at_eos=False)
    session = DecodingSession(lm, sample.input_ids, sample.needle_positions, max_new_tokens=6)
    policy = _Policy()
    (decoded,) = decode([session], [policy], 6)
    for index, _, result in policy.seen:
        token = decoded.tokens[index]
        assert torch.equal(session.copy_scores(result.stats, token), torch.from_numpy(traced.copy_scores[index]))
    assert decoded.tokens == traced.tokens.tolist() and decoded.stop_reason == "max_new_tokens"
    assert session.length == len(sample.input_ids) + 5  # no pass after the last step


def test_an_emitted_token_is_fed():
    lm = _lm()
    prompt = _prompt(4)
    session = DecodingSession(lm, prompt, [], max_new_tokens=4)
    policy = _Policy(emit=lambda index, result: Emit(7 + index))
    (decoded,) = decode([session], [policy], 4)
    assert decoded.tokens == [7, 8, 9, 10]
    assert session.ids[len(prompt) : len(prompt) + 3].tolist() == [7, 8, 9]  # fed to the next passes
    forced = DecodingSession(lm, prompt + [7, 8, 9], [], max_new_tokens=1)
    last = forced.forward(len(prompt) + 3).logits
    assert (policy.seen[-1][2].logits - last).abs().max() <= 1e-4  # the last pass read the emitted tokens


def test_stop_ends_the_row_unemitted_and_rerun_needs_a_checkpoint():
    lm = _lm()
    session = DecodingSession(lm, _prompt(5), [], max_new_tokens=5)
    policy = _Policy(emit=lambda index, result: Stop("eos") if index == 1 else Emit(int(result.logits.argmax())))
    (decoded,) = decode([session], [policy], 5)
    assert [index for index, _, _ in policy.seen] == [0, 1] and decoded.stop_reason == "eos"
    assert len(decoded.tokens) == 1
    last = _Policy(emit=lambda index, result: Emit(5, stop_reason="done"))
    (decoded,) = decode([DecodingSession(lm, _prompt(5), [], max_new_tokens=5)], [last], 5)
    assert decoded.tokens == [5] and decoded.stop_reason == "done"  # emitted, then the row ends
    with pytest.raises(DynheadsError, match="rerunnable"):
        decode([DecodingSession(lm, _prompt(5), [], max_new_tokens=5)], [_Policy(rerun_edit=RowEdit())], 5)


def test_rerun_replaces_the_pass():
    lm = _lm()
    prompt = _prompt(6)
    session = DecodingSession(lm, prompt, [], max_new_tokens=3)
    session.forward(len(prompt) - 1)
    policy = _Policy(rerun_edit=RowEdit(removed=frozenset({(1, 2)})), rerunnable=True)
    (decoded,) = decode([session], [policy], 3)
    reruns = [result for _, rerun, result in policy.seen if rerun]
    assert decoded.tokens == [int(result.logits.argmax()) for result in reruns]
    assert session.length == len(prompt) + 2  # the clean passes left nothing in the cache
    reference = DecodingSession(lm, prompt, [], max_new_tokens=1)
    reference.forward(len(prompt) - 1)
    reference.probe.set_edits([RowEdit(removed=frozenset({(1, 2)}))])
    masked = reference.forward(1)
    assert torch.equal(reruns[0].logits, masked.logits)
    clean = DecodingSession(lm, prompt, [], max_new_tokens=1)
    clean.forward(len(prompt) - 1)
    assert not torch.equal(clean.forward(1).logits, masked.logits)  # the removal changed the pass


@pytest.mark.parametrize("family", ["llama", "mistral"])  # mistral: sliding window, the cache drops old keys
def test_rollback_leaves_no_trace_in_the_cache(family):
    lm = _lm(family)
    prompt = _prompt(7, length=24)
    session = DecodingSession(lm, prompt, [], max_new_tokens=4)
    session.forward(len(prompt))
    before = [(layer.keys.clone(), layer.values.clone()) for layer in session.cache.layers]
    saved = session.checkpoint()
    session.append(5)
    session.forward(1)
    session.rollback(saved)
    assert session.length == len(prompt) and session.written == len(prompt)
    for (keys, values), layer in zip(before, session.cache.layers, strict=True):
        assert torch.equal(keys, layer.keys) and torch.equal(values, layer.values)


def test_batched_rows_rerun_alone_and_equal_batch_one():
    """In a batch, only the rows that ask rerun; every row equals its batch-1 decode."""
    lm = _lm()
    prompts = [_prompt(8, 12), _prompt(9, 16), _prompt(10, 9)]

    def policies():
        return [
            _Policy(rerun_edit=RowEdit(removed=frozenset({(1, 2)})), rerunnable=True),
            _Policy(),
            _Policy(rerun_edit=RowEdit(removed=frozenset({(0, 0), (1, 3)}), mode="uniform"), rerunnable=True),
        ]

    def sessions():
        return [DecodingSession(lm, prompt, [], max_new_tokens=5) for prompt in prompts]

    alone = [decode([session], [policy], 5)[0] for session, policy in zip(sessions(), policies(), strict=True)]
    with pytest.raises(DynheadsError, match="one ablation mode"):
        decode(sessions(), policies(), 5)
    together_policies = policies()[:2]
    together = decode(sessions()[:2], together_policies, 5)
    assert [d.tokens for d in together] == [d.tokens for d in alone[:2]]
    assert [rerun for _, rerun, _ in together_policies[1].seen] == [False] * 5


def test_the_cache_goes_by_the_keyword_the_model_takes():
    class Before(torch.nn.Module):  # transformers < 5.24 (kvpress's 5.2)
        def forward(self, input_ids=None, past_key_values=None): ...

    class After(torch.nn.Module):  # 5.24 deprecates past_key_values for cache; 5.40 removes it
        def forward(self, input_ids=None, cache=None, **kwargs): ...

    assert with_cache(Before(), "kv") == {"past_key_values": "kv"} and with_cache(After(), "kv") == {"cache": "kv"}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_decoding_hands_the_cache_by_a_keyword_that_is_not_deprecated(family):
    lm = _lm(family)
    sample = type("S", (), {"input_ids": _prompt(4), "needle_positions": [2, 3]})()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*past_key_values.*")
        trace(lm, sample, max_new_tokens=3, stop_at_eos=False)
        if family == "llama":  # the per-head KV cache models no sliding-window layers (mistral, qwen2, gemma)
            headwise_generate(lm, sample.input_ids, [(0, 0)], sink=1, recent=2, max_new_tokens=3, stop_at_eos=False)


def test_a_session_under_the_models_own_attention_measures_nothing_and_decodes_alone():
    """``probed=False`` (the per-head cache, kvpress presses): logits equal the plain model's, ``stats`` refuses with
    the reason, and such a session neither merges into a batch nor forks."""
    lm = _lm()
    ids = _prompt(4)
    session = DecodingSession(lm, ids, max_new_tokens=2, probed=False)
    result = session.forward()
    with torch.no_grad():
        plain = lm.model(torch.tensor([ids])).logits[0, -1].float()
    assert torch.allclose(result.logits, plain, atol=1e-5)
    assert result.measured is None
    with pytest.raises(DynheadsError, match="probed=False"):
        _ = result.stats
    other = DecodingSession(lm, ids, max_new_tokens=2)
    other.forward()
    with pytest.raises(DynheadsError, match="one at a time"):
        DecodingSession.merge([session, other], 2)
    with pytest.raises(DynheadsError, match="own cache"):
        DecodingSession(lm, ids, max_new_tokens=2, cache=HeadwiseCache([[0]] * 3, 2, 1, 2)).copies(1)


def test_text_positions_give_each_token_its_place_in_the_text_whatever_the_cache_holds():
    """A pruned cache is shorter than the text: with ``text_positions`` a token's position is its index in the text
    (checked through the rotary embedding: a session whose cache lost its first token still decodes the next
    token at the same position as an unpruned one, so the two logits differ only by the lost key)."""
    lm = _lm()
    ids = _prompt(6)
    positions = []

    def record(module, args, kwargs, out) -> None:
        positions.append((kwargs["position_ids"] if "position_ids" in kwargs else args[1]).tolist())

    hook = lm.model.base_model.rotary_emb.register_forward_hook(record, with_kwargs=True)
    try:
        session = DecodingSession(lm, ids, max_new_tokens=2, probed=False, text_positions=True)
        session.forward(len(ids) - 1)
        for layer in session.cache.layers:  # prune the first key of every layer, as a press would
            layer.keys, layer.values = layer.keys[:, :, 1:], layer.values[:, :, 1:]
        session.forward(1)
    finally:
        hook.remove()
    assert positions == [[list(range(len(ids) - 1))], [[len(ids) - 1]]]


def test_one_loop_no_module_but_the_session_runs_the_model():
    """Every forward pass of a model in ``src/dynheads`` goes through ``DecodingSession._run``: no other module calls
    a model (``model(...)``, ``lm.model(...)``, ``.generate(...)``); the per-head cache and kvpress's presses decode
    as sessions of the one loop."""
    import ast
    from pathlib import Path

    import dynheads

    calls = []
    for path in Path(dynheads.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                func = node.func
                name = func.id if isinstance(func, ast.Name) else func.attr if isinstance(func, ast.Attribute) else ""
                if name in ("model", "generate"):
                    calls.append(f"{path.name}:{node.lineno}")
    assert [call.split(":")[0] for call in calls] == ["decoding.py"], calls


def test_a_pass_measures_what_its_caller_declares_and_nothing_carries_over():
    """Rows and span scores are declared per pass (``Measure``): a pass with rows keeps them, the next pass without
    keeps none; policies of one batch that declare different measures are refused with the reason."""
    lm = _lm()
    session = DecodingSession(lm, _prompt(8), max_new_tokens=3)
    kept = session.forward(measure=Measure(rows=frozenset({(0, 1), (2, 0)})))
    assert set(kept.stats.rows) == {(0, 1), (2, 0)}
    session.append(int(kept.logits.argmax()))
    assert session.forward(1).stats.rows == {}

    class Keeps(StepPolicy):
        def __init__(self, heads):
            self.heads = frozenset(heads)

        def measure(self, index):
            return Measure(rows=self.heads)

    sessions = [DecodingSession(lm, _prompt(seed), max_new_tokens=3) for seed in (1, 2)]
    with pytest.raises(DynheadsError, match="measure the same"):
        decode(sessions, [Keeps({(0, 0)}), Keeps({(1, 1)})], 3)


class _Sample:
    def __init__(self, input_ids, needle_positions=(2, 3)):
        self.input_ids, self.needle_positions = input_ids, list(needle_positions)


def test_a_prompt_of_another_models_token_ids_is_refused_in_one_line():
    """The tiny model reads ids 0..127: a sample tokenised for a larger vocabulary is named, not an IndexError from
    the embedding lookup; the check sits in the session, so every decoding path (trace, ablation, KV) has it."""
    lm = _lm()
    assert lm.vocab_size == 128
    for ids, first in ((_prompt()[:5] + [128, 4000], 128), ([-1, *_prompt()[:5]], -1)):
        with pytest.raises(DynheadsError, match=f"token id {first}, outside this model's vocabulary of 128 ids"):
            trace(lm, _Sample(ids), max_new_tokens=2)
        with pytest.raises(DynheadsError, match="tokenised for another model"):
            DecodingSession(lm, ids, max_new_tokens=2)


def test_trace_refuses_arguments_of_the_wrong_kind_in_one_line():
    from dynheads.engine.tracing import trace_batch

    lm, sample = _lm(), _Sample(_prompt())
    cases = [
        (lambda: trace("model", sample), "trace needs a model from dynheads.load_model\\(\\), got str"),
        (lambda: trace(lm, "a prompt"), "a sample needs input_ids and needle_positions .*got str"),
        (lambda: trace_batch(lm, sample), "trace_batch takes a list of samples, got _Sample"),
        (lambda: trace(lm, sample, max_new_tokens="4"), "max_new_tokens must be an integer of at least 1, got '4'"),
        (lambda: trace(lm, sample, max_new_tokens=0), "max_new_tokens must be an integer of at least 1, got 0"),
        (lambda: trace(lm, sample, sink_size=-1), "sink_size must be an integer of at least 0, got -1"),
        (lambda: trace(lm, sample, local_window=2.5), "local_window must be an integer of at least 0, got 2.5"),
    ]
    for call, says in cases:
        with pytest.raises(DynheadsError, match=says) as error:
            call()
        assert "\n" not in str(error.value)
    assert trace_batch(lm, []) == []
