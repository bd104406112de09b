"""Adding a head score touches this file alone: registered here, it is traced, stored and analysed by name.

Two scores are declared below from the probe's step statistics: ``sink_argmax`` (binary: the head's most-attended
key is one of the first ``sink_size`` keys) and ``context_share`` (continuous: the head's attention mass on the
prompt over its whole row). The oracle is transformers' own eager attention over the traced sequence.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from zoo import NoTokenizer, tiny_model

import dynheads
from dynheads.analysis.cca import samples_from_traces
from dynheads.analysis.dynamism import dynamism_stats
from dynheads.analysis.static import ReasoningTest, static_reasoning_heads
from dynheads.engine.decoding import DecodingSession
from dynheads.errors import DynheadsError
from dynheads.io import write_json
from dynheads.models import LoadedModel
from dynheads.runs import RunDir
from dynheads.scores import HEAD_SCORES, SINK_SIZE, ScoreSpec, register_score
from dynheads.traces import Trace
from dynheads.views.analyses import dynamic_sets, dynamism_report

PROMPT_LEN, STEPS, NEEDLE = 24, 5, [10, 11, 12]


def sink_argmax(stats, row, predicted: int) -> torch.Tensor:
    return stats.argmax_pos < row.sink_size


def context_share(stats, row, predicted: int) -> torch.Tensor:
    return stats.context_mass / stats.total_mass


@pytest.fixture
def new_scores():
    register_score(
        "sink_argmax",
        sink_argmax,
        binary=True,
        label="sink argmax score",
        help="the head's most-attended key is one of the first sink keys",
    )
    register_score(
        "context_share",
        context_share,
        binary=False,
        label="context share",
        help="the head's attention mass on the prompt over its whole row",
    )
    yield
    HEAD_SCORES.unregister("sink_argmax")
    HEAD_SCORES.unregister("context_share")


class Sample:
    def __init__(self, seed: int):
        self.input_ids = torch.randint(3, 128, (PROMPT_LEN,), generator=torch.Generator().manual_seed(seed)).tolist()
        self.needle_positions = NEEDLE


@pytest.fixture(scope="module")
def lm():
    return LoadedModel(model=tiny_model("llama"), tokenizer=NoTokenizer(), name="llama", revision="random")


def traced(lm, seed: int = 0) -> Trace:
    return dynheads.trace(lm, Sample(seed), max_new_tokens=STEPS, stop_at_eos=False, head_outputs=True)


def eager_rows(lm, trace: Trace) -> torch.Tensor:
    """``[step, layer, head, key]`` attention rows of each step's query (the position that predicts its token),
    from one eager forward over prompt + generated tokens."""
    ids = torch.tensor([Sample(0).input_ids + trace.tokens[:-1].tolist()])
    previous = lm.model.config._attn_implementation
    lm.model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            attentions = lm.model(ids, output_attentions=True).attentions
    finally:
        lm.model.set_attn_implementation(previous)
    rows = torch.stack([a[0] for a in attentions])  # [layer, head, query, key]
    return rows[:, :, PROMPT_LEN - 1 :].permute(2, 0, 1, 3).float()


def test_a_registered_score_is_traced_by_name_with_the_eager_values(lm, new_scores):
    trace = traced(lm)
    assert list(trace.scores) == ["copy", "reasoning", "write", "sink_argmax", "context_share"]
    rows = eager_rows(lm, trace)  # keys past a step's query are masked to 0
    sink = trace.scores["sink_argmax"]
    assert sink.dtype == np.bool_ and sink.shape == (STEPS, 3, 4)
    np.testing.assert_array_equal(sink, (rows.argmax(-1) < SINK_SIZE).numpy())
    assert 0 < sink.sum() < sink.size  # the oracle is not trivially all-False or all-True
    share = trace.scores["context_share"]
    assert share.dtype == np.float32
    np.testing.assert_allclose(share, (rows[..., :PROMPT_LEN].sum(-1) / rows.sum(-1)).numpy(), atol=1e-5)
    assert share.min() < 0.9 < share.max()


def test_registering_a_score_leaves_the_existing_scores_unchanged(lm, new_scores):
    with_new = traced(lm)
    HEAD_SCORES.unregister("sink_argmax")
    HEAD_SCORES.unregister("context_share")
    without = traced(lm)
    assert list(without.scores) == ["copy", "reasoning", "write"]
    for name in ("copy", "reasoning", "write"):
        np.testing.assert_array_equal(with_new.scores[name], without.scores[name])


def test_a_registered_score_round_trips_through_the_trace_file(lm, new_scores, tmp_path):
    trace = traced(lm)
    trace.save(tmp_path / "t.parquet")
    assert {"sink_argmax_score", "context_share_score"} <= set(pq.read_schema(tmp_path / "t.parquet").names)
    meta = json.loads(pq.read_schema(tmp_path / "t.parquet").metadata[b"dynheads"])
    assert meta["scores"] == ["copy", "reasoning", "write", "sink_argmax", "context_share"]
    HEAD_SCORES.unregister("sink_argmax")  # the file describes its own scores: loading needs no registry
    loaded = Trace.load(tmp_path / "t.parquet")
    assert list(loaded.scores) == list(trace.scores)
    for name, values in trace.scores.items():
        assert loaded.scores[name].dtype == values.dtype
        np.testing.assert_array_equal(loaded.scores[name], values)
    np.testing.assert_array_equal(loaded.copy_scores, trace.copy_scores)


def test_analyses_take_a_registered_score_by_name(lm, new_scores, tmp_path):
    run = RunDir(tmp_path / "run")
    run.start("niah", {"seed": 0}, None)
    traces = [traced(lm, seed) for seed in range(3)]
    for seed, trace in enumerate(traces):
        run.save_sample({"sample_id": f"s{seed}", "needle_positions": NEEDLE}, trace)
    write_json(tmp_path / "static.json", ["0-0", "1-2", "2-3"])
    ranking = [(0, 0), (1, 2), (2, 3)]

    stats = dynamism_report(run.path, tmp_path / "static.json", score="sink_argmax", ks=(2,), out_dir=tmp_path)
    assert stats == dynamism_stats([t.scores["sink_argmax"] for t in traces], ranking, ks=(2,))
    assert stats.mean_size > 0
    assert "sink argmax score" in (tmp_path / "dynamism.md").read_text()

    continuous = dynamism_report(
        run.path, tmp_path / "static.json", score="context_share", threshold="0.9", ks=(2,), out_dir=tmp_path
    )
    assert continuous == dynamism_stats([t.scores["context_share"] > 0.9 for t in traces], ranking, ks=(2,))
    assert "context share > 0.9" in (tmp_path / "dynamism.md").read_text()
    assert json.loads((tmp_path / "dynamism.json").read_text())["threshold"] == "0.9"

    samples = samples_from_traces(traces, "context_share")
    assert all(
        np.array_equal(scores, t.scores["context_share"].reshape(STEPS, 12))
        for (_, scores), t in zip(samples, traces, strict=True)
    )

    heads, empty = static_reasoning_heads([ReasoningTest(t, 1.0) for t in traces], score="context_share")
    expected = np.mean([t.scores["context_share"].astype(np.float64).mean(axis=0) for t in traces], axis=0)
    np.testing.assert_allclose(heads.mean_scores, expected)
    assert empty == 0 and heads.ranking[0] == np.unravel_index(expected.argmax(), expected.shape)


def test_the_live_step_ranks_a_registered_binary_score_by_attention(lm, new_scores):
    session = DecodingSession(lm, Sample(0).input_ids, NEEDLE, max_new_tokens=1)
    result = session.forward(PROMPT_LEN)
    heads = ScoreSpec("sink_argmax").step_heads(result.stats, session.row, int(result.logits.argmax()))
    active = result.stats.argmax_pos < SINK_SIZE
    assert len(heads) > 1  # an order to check
    assert sorted(heads) == sorted(map(tuple, torch.nonzero(active).tolist()))
    weights = [float(result.stats.max_prob[head]) for head in heads]
    assert weights == sorted(weights, reverse=True)


def test_an_unknown_score_is_one_line(lm):
    trace = traced(lm)
    with pytest.raises(DynheadsError, match="score must be one of copy, reasoning, write, got 'sink_argmax'") as error:
        dynamic_sets(trace, "sink_argmax", "0.1")
    assert "\n" not in str(error.value)


def test_a_trace_without_a_score_says_so(lm, new_scores):
    old = Trace.load(Path(__file__).parent / "fixtures" / "trace-v1.parquet")
    assert list(old.scores) == ["copy", "reasoning"]  # files before the scores key hold the first two
    with pytest.raises(DynheadsError, match="holds no 'sink_argmax' score"):
        dynamic_sets(old, "sink_argmax", "0.1")


def test_a_score_declaration_is_checked(new_scores):
    assert HEAD_SCORES.names()[:2] == ["copy", "reasoning"] and "sink_argmax" in HEAD_SCORES
    assert HEAD_SCORES.help("sink_argmax") == "the head's most-attended key is one of the first sink keys"
    with pytest.raises(DynheadsError, match="already registered"):
        register_score("sink_argmax", sink_argmax, binary=True, label="again", help="again")
    with pytest.raises(DynheadsError, match="one word"):
        register_score("sink argmax", sink_argmax, binary=True, label="x", help="x")  # it names a file column
    with pytest.raises(DynheadsError, match="one-line help"):
        register_score("sink2", sink_argmax, binary=True, label="x", help="two\nlines")
    assert "sink2" not in HEAD_SCORES
