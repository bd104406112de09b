"""The write score (``dynheads.scores.write_scores``) against an eager oracle, every family and the embedded model.

Oracle: transformers' own eager forward over the traced sequence (``output_attentions=True``) gives each layer's
attention row of the step's query, and hooks on the value projections give every key's value vector; from them and
the weights (the unembedding row of the emitted token, each head's columns of ``o_proj``) the oracle sums
``a_j u_yᵀ W_O^{l,h} v_j`` over the needle keys and over the other keys and rescales the latter as LOCOS does.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from zoo import FAMILIES, NoTokenizer, eager_forward, tiny_model

import dynheads
from dynheads.engine.decoding import DecodingSession
from dynheads.engine.probe import Measure, RowEdit
from dynheads.errors import DynheadsError
from dynheads.models import LoadedModel
from dynheads.scores import ScoreSpec, score_values

PROMPT_LEN, STEPS, NEEDLE = 20, 4, [5, 6, 7, 8]
HEAD_OUTPUTS = Measure(head_outputs=True)  # what a pass measures for the write score


class Sample:
    def __init__(self, ids: list[int], needle: list[int]):
        self.input_ids, self.needle_positions = ids, needle


def eager_rows_and_values(model, ids: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Per layer: the ``[H, S]`` eager attention rows of the last position and the ``[S, H_kv, D]`` value vectors
    of every position (the value projection's output; Phi-3's fused projection holds them in its last columns)."""
    config = model.config.get_text_config()
    kv_heads, layers = config.num_key_value_heads, config.num_hidden_layers
    values: dict[int, torch.Tensor] = {}

    def keep(layer: int, fused: bool):
        def hook(module, args, output):
            part = output[..., -kv_heads * head_dims[layer] :] if fused else output
            values[layer] = part[0].view(part.shape[1], kv_heads, head_dims[layer]).float()

        return hook

    attentions = [layer.self_attn for layer in model.model.layers]
    head_dims = [attention.head_dim for attention in attentions]
    handles = [
        (attention.v_proj if hasattr(attention, "v_proj") else attention.qkv_proj).register_forward_hook(
            keep(index, not hasattr(attention, "v_proj"))
        )
        for index, attention in enumerate(attentions)
    ]
    try:
        out = eager_forward(model, ids)
    finally:
        for handle in handles:
            handle.remove()
    return [a[0, :, -1].float() for a in out.attentions], [values[layer] for layer in range(layers)]


def oracle_write(model, ids: torch.Tensor, token: int, needle: list[int]) -> torch.Tensor:
    """``[L, H]``: the write score of the query at ``ids``' last position toward ``token``, from eager rows."""
    rows, values = eager_rows_and_values(model, ids)
    unembedding = model.get_output_embeddings().weight.detach()[token].float()
    keys = ids.shape[1]
    inside = [p for p in needle if p < keys]
    other = [p for p in range(keys) if p not in inside]
    scores = []
    for layer, attention in enumerate(layer.self_attn for layer in model.model.layers):
        heads, head_dim = rows[layer].shape[0], attention.head_dim
        groups = heads // values[layer].shape[1]
        weight = attention.o_proj.weight.detach().float()
        per_head = []
        for head in range(heads):
            direction = unembedding @ weight[:, head * head_dim : (head + 1) * head_dim]  # [D]
            writes = rows[layer][head] * (values[layer][:, head // groups] @ direction)  # [S]
            per_head.append(writes[inside].sum() - writes[other].sum() * len(inside) / len(other))
        scores.append(torch.stack(per_head))
    return torch.stack(scores)


def assert_write_equals_oracle(lm: LoadedModel, prompt: list[int], needle: list[int], steps: int) -> None:
    trace = dynheads.trace(lm, Sample(prompt, needle), max_new_tokens=steps, stop_at_eos=False, head_outputs=True)
    sequence = prompt + trace.tokens.tolist()
    assert trace.scores["write"].shape == (steps, lm.num_layers, lm.num_heads)
    for step in range(steps):
        ids = torch.tensor([sequence[: len(prompt) + step]])
        expected = oracle_write(lm.model, ids, int(trace.tokens[step]), needle).cpu()
        got = torch.from_numpy(trace.scores["write"][step])
        scale = float(expected.abs().max())
        assert scale > 0, step
        assert (got - expected).abs().max() <= 1e-4 * scale, (lm.name, step)


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_write_score_equals_the_eager_oracle_at_every_step(family):
    lm = LoadedModel(model=tiny_model(family), tokenizer=NoTokenizer(), name=family, revision="random")
    prompt = torch.randint(3, 128, (PROMPT_LEN,), generator=torch.Generator().manual_seed(4)).tolist()
    assert_write_equals_oracle(lm, prompt, NEEDLE, STEPS)


@pytest.mark.embedded
def test_write_score_of_the_embedded_model_equals_the_eager_oracle(embedded):
    """SmolLM2: 30 layers x 9 heads, GQA 3, tied embeddings; a prompt whose answer is in the needle."""
    ids = embedded.tokenizer("The magic word is 1f3c. Remember it: the magic word is", return_tensors="pt")
    prompt = ids["input_ids"][0].tolist()
    assert_write_equals_oracle(embedded, prompt, list(range(0, 9)), 3)


def test_write_score_is_measured_before_a_head_is_removed():
    """A removed head's statistics are those of the row it computed (as for Eq. 1 and Eq. 2): its write score
    under the ablation equals its score without it at the same pass."""
    lm = LoadedModel(model=tiny_model("llama"), tokenizer=NoTokenizer(), name="llama", revision="random")
    prompt = torch.randint(3, 128, (PROMPT_LEN,), generator=torch.Generator().manual_seed(5)).tolist()
    plain = DecodingSession(lm, prompt, NEEDLE, max_new_tokens=1)
    removed = DecodingSession(lm, prompt, NEEDLE, max_new_tokens=1)
    first = plain.forward(PROMPT_LEN, HEAD_OUTPUTS)
    second = removed.forward(PROMPT_LEN, HEAD_OUTPUTS, edits=[RowEdit(removed=frozenset({(2, 1)}))])
    plain_needle, _ = first.stats.logit_contributions(7)
    removed_needle, _ = second.stats.logit_contributions(7)
    assert torch.equal(plain_needle[2, 1], removed_needle[2, 1])
    assert not torch.equal(first.logits, second.logits)  # the head was removed


def test_a_trace_records_the_write_score_only_when_asked_and_nothing_else_moves():
    """Off by default (the heads' outputs are measured only when asked); asking adds the score and leaves every
    other number of the trace as it was, bit for bit."""
    lm = LoadedModel(model=tiny_model("qwen2"), tokenizer=NoTokenizer(), name="qwen2", revision="random")
    prompt = torch.randint(3, 128, (PROMPT_LEN,), generator=torch.Generator().manual_seed(6)).tolist()
    plain = dynheads.trace(lm, Sample(prompt, NEEDLE), max_new_tokens=STEPS, stop_at_eos=False)
    asked = dynheads.trace(lm, Sample(prompt, NEEDLE), max_new_tokens=STEPS, stop_at_eos=False, head_outputs=True)
    assert "write" not in plain.scores and set(asked.scores) == set(plain.scores) | {"write"}
    assert asked.scores["write"].shape == (STEPS, lm.num_layers, lm.num_heads)
    for name, values in plain.scores.items():
        assert np.array_equal(values, asked.scores[name]), name
    for name in ("tokens", "argmax_pos", "needle_mass", "max_prob", "context_mass", "context_entropy", "hidden"):
        assert np.array_equal(getattr(plain, name), getattr(asked, name)), name
    with pytest.raises(DynheadsError, match="re-trace with --write-score") as error:
        score_values(plain.scores, "write")
    assert "\n" not in str(error.value)


def test_a_pass_that_did_not_measure_the_heads_outputs_refuses_the_write_score():
    """Never a write score of zeros: the step statistics of a pass without ``head_outputs`` have none to read."""
    lm = LoadedModel(model=tiny_model("llama"), tokenizer=NoTokenizer(), name="llama", revision="random")
    prompt = torch.randint(3, 128, (PROMPT_LEN,), generator=torch.Generator().manual_seed(7)).tolist()
    session = DecodingSession(lm, prompt, NEEDLE, max_new_tokens=2)
    stats = session.forward(PROMPT_LEN).stats
    assert stats.needle_values is None and stats.off_values is None
    with pytest.raises(DynheadsError, match="did not measure the heads' outputs") as error:
        stats.logit_contributions(7)
    assert "\n" not in str(error.value)
    session.write([7])
    measured = session.forward(1, HEAD_OUTPUTS).stats  # the next pass asks: it has them
    assert measured.needle_values is not None and measured.logit_contributions(7)[0].shape == (3, 4)


def test_the_write_score_takes_absolute_or_fitted_thresholds_never_multiples_of_chance():
    assert ScoreSpec("write", threshold="0.5").describe() == "write score > 0.5"
    fitted = ScoreSpec("write", threshold="calibrated:5").describe()
    assert fitted == "write score > a value fitted to a mean of 5 heads per step on a fitting stream"
    with pytest.raises(DynheadsError, match="not an attention share") as error:
        ScoreSpec("write", threshold="relative:3")
    assert "\n" not in str(error.value)


def test_a_calibrated_rule_fits_an_absolute_write_threshold_on_a_disjoint_stream(tmp_path):
    """``calibrated:M`` on the write score fits a value in logits (not a multiple of chance) on the fitting run's
    traces so that M heads per step are active there on average, and dynamism applies that value to another run."""
    import json

    from dynheads.io import write_json
    from dynheads.runs import RunDir
    from dynheads.thresholds import ReasoningThreshold
    from dynheads.views.analyses import dynamism_report

    lm = LoadedModel(model=tiny_model("llama"), tokenizer=NoTokenizer(), name="llama", revision="random")

    def run(name: str, seeds: list[int]) -> RunDir:
        folder = RunDir(tmp_path / name)
        folder.start("niah", {"seed": 0}, None, {"questions": {"ids": [f"q{s}" for s in seeds]}})
        for seed in seeds:
            prompt = torch.randint(3, 128, (PROMPT_LEN,), generator=torch.Generator().manual_seed(seed)).tolist()
            trace = dynheads.trace(
                lm, Sample(prompt, NEEDLE), max_new_tokens=STEPS, stop_at_eos=False, head_outputs=True
            )
            folder.save_sample({"sample_id": f"q{seed}"}, trace)
        return folder

    fit, evaluated = run("fit", [10, 11, 12]), run("eval", [13, 14])
    write_json(tmp_path / "static.json", ["0-1", "2-3"])
    dynamism_report(
        evaluated.path,
        tmp_path / "static.json",
        score="write",
        threshold="calibrated:2",
        fit_run=fit.path,
        out_dir=tmp_path,
    )
    saved = json.loads((tmp_path / "dynamism.json").read_text())
    applied = ReasoningThreshold.parse(saved["threshold"])
    assert applied.mode == "absolute" and applied.value > 0
    fitted = np.concatenate([trace.scores["write"] for _, trace in fit.iter_traces()])
    assert (fitted > applied.value).sum(axis=(1, 2)).mean() == pytest.approx(2, abs=0.1)
    assert saved["threshold_fit"]["fit_mean_size"] == pytest.approx(2, abs=0.1)
    assert "write score" in (tmp_path / "dynamism.md").read_text()
