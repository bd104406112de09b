"""Decoy needles and ``null:Q`` thresholds (issue 63): a decoy task is its base task prompt for prompt with the
needle positions moved to a needle-free haystack span of the same length; a ``null:Q`` rule is fitted on a traced
decoy run so that the decoy spans mark Q heads per step, and is refused on anything else or on shared samples."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dynheads.errors import DynheadsError
from dynheads.io import write_json
from dynheads.runs import RunDir
from dynheads.settings import NiahConfig
from dynheads.tasks.decoy import decoy_span
from dynheads.tasks.registry import get_task
from dynheads.thresholds import ReasoningThreshold, fit_absolute
from dynheads.traces import Trace
from dynheads.views.analyses import dynamism_report


@pytest.mark.parametrize("seed", range(40))
def test_a_decoy_span_has_the_needles_length_inside_the_haystack_and_misses_the_needle(seed):
    rng = np.random.default_rng(seed)
    start, room = int(rng.integers(0, 50)), int(rng.integers(30, 400))
    width = int(rng.integers(1, room // 2 + 1))
    first = start + int(rng.integers(0, room - width + 1))
    needle = list(range(first, first + width))
    if max(first - start, start + room - first - width) < width:  # neither side holds a span of the needle's length
        with pytest.raises(DynheadsError, match="no room for a decoy span"):
            decoy_span(needle, (start, start + room))
        return
    decoy = decoy_span(needle, (start, start + room))
    assert len(decoy) == width and decoy == list(range(decoy[0], decoy[0] + width))
    assert start <= decoy[0] and decoy[-1] < start + room and not set(decoy) & set(needle)


def test_no_room_for_a_decoy_is_refused_in_one_line():
    with pytest.raises(DynheadsError, match="no room for a decoy span"):
        decoy_span(list(range(5, 15)), (0, 20))


@pytest.mark.parametrize("base", ["niah", "spelled_niah", "spelled_niah_paraphrased"])
def test_the_decoy_task_keeps_its_base_prompts_and_answers_and_moves_only_the_needle(base, embedded_tokenizer):
    config = NiahConfig(lengths=(500,), depths=(0.2, 0.8), runs=1)
    plain = get_task(base).grid(config, embedded_tokenizer).samples
    decoys = get_task(f"{base}_decoy").grid(config, embedded_tokenizer).samples
    for sample, decoy in zip(plain, decoys, strict=True):
        assert decoy.input_ids == sample.input_ids and decoy.answer == sample.answer
        assert decoy.sample_id == sample.sample_id and decoy.seed == sample.seed
        assert decoy.meta["decoy_of"] == sample.needle_positions
        assert len(decoy.needle_positions) == len(sample.needle_positions)
        assert not set(decoy.needle_positions) & set(sample.needle_positions)
        low, high = sample.context_span
        assert low <= min(decoy.needle_positions) and max(decoy.needle_positions) < high


def _write_trace(scores: np.ndarray, hidden: np.ndarray | None = None) -> Trace:
    steps = scores.shape[0]
    zeros = np.zeros(scores.shape, np.float32)
    return Trace(
        tokens=np.arange(steps, dtype=np.int64),
        token_texts=["t"] * steps,
        text="",
        argmax_pos=zeros.astype(np.int32),
        needle_mass=zeros,
        max_prob=zeros,
        scores={"copy": zeros.astype(bool), "reasoning": zeros, "write": scores.astype(np.float32)},
        hidden=np.zeros((steps, 4), np.float32) if hidden is None else hidden.astype(np.float32),
        prompt_length=10,
        stop_reason="eos",
        chance=np.full(steps, 0.01, np.float32),
    )


def _run(path, kind: str, seeds: list[int], arrays: list[np.ndarray], hidden: list | None = None) -> RunDir:
    run = RunDir(path)
    run.start(kind, {"seed": 0}, None)
    for i, (seed, scores) in enumerate(zip(seeds, arrays, strict=True)):
        run.save_sample({"sample_id": f"s{seed}", "seed": seed}, _write_trace(scores, hidden and hidden[i]))
    return run


def test_a_null_rule_is_the_value_at_which_decoy_spans_mark_q_heads_per_step(tmp_path):
    rng = np.random.default_rng(3)
    decoy_arrays = [rng.normal(0, 0.2, (n, 30, 9)) for n in (8, 12)]
    evaluated_arrays = [rng.normal(0, 0.2, (10, 30, 9)) + 2.0 * (rng.random((10, 30, 9)) < 0.02)]
    decoy = _run(tmp_path / "decoy", "niah_decoy", [1, 2], decoy_arrays)
    evaluated = _run(tmp_path / "eval", "niah", [3], evaluated_arrays)
    write_json(tmp_path / "static.json", ["0-2"])
    stats = dynamism_report(
        evaluated.path,
        tmp_path / "static.json",
        score="write",
        threshold="null:0.5",
        fit_run=decoy.path,
        out_dir=tmp_path,
    )
    saved = json.loads((tmp_path / "dynamism.json").read_text())
    value = fit_absolute([a.astype(np.float32) for a in decoy_arrays], 0.5)
    assert ReasoningThreshold.parse(saved["threshold"]).value == pytest.approx(value, rel=1e-5)
    record = saved["threshold_fit"]
    assert record["rule"] == "null:0.5" and record["fit_mean_size"] == pytest.approx(0.5, abs=0.05)
    assert record["fit_samples"] == ["s1", "s2"] and record["fit_steps"] == 20
    assert stats.mean_size > 3  # the planted heads (2 % of 270, about 5 per step) stand above the null
    assert "on the decoy run" in (tmp_path / "dynamism.md").read_text()


def test_null_and_calibrated_rules_refuse_the_wrong_fitting_run_and_shared_samples(tmp_path):
    rng = np.random.default_rng(4)
    arrays = [rng.normal(0, 0.2, (5, 30, 9))]
    evaluated = _run(tmp_path / "eval", "niah", [3], arrays)
    write_json(tmp_path / "static.json", ["0-2"])

    def report(threshold, fit_run):
        dynamism_report(
            evaluated.path,
            tmp_path / "static.json",
            score="write",
            threshold=threshold,
            fit_run=fit_run,
            out_dir=tmp_path,
        )

    with pytest.raises(DynheadsError, match="no decoy run"):
        report("null:0.1", _run(tmp_path / "plain", "niah", [1], arrays).path)
    decoy = _run(tmp_path / "decoy", "niah_decoy", [1], arrays)
    with pytest.raises(DynheadsError, match="is a decoy run"):
        report("calibrated:5", decoy.path)
    with pytest.raises(DynheadsError, match="fitting stream"):
        report("null:0.1", _run(tmp_path / "same-seeds", "niah_decoy", [3], arrays).path)
    with pytest.raises(DynheadsError, match="rule to fit"):
        ReasoningThreshold.parse("null:0.1").cutoff(None)
    with pytest.raises(DynheadsError, match="null:0.1"):
        ReasoningThreshold.parse("nul:0.1")
    assert not (tmp_path / "dynamism.json").exists()


def test_a_static_run_ranks_pooled_write_heads_beside_wus_list(tmp_path):
    """``dynheads static --score write``: the same traces, heads ranked by their mean write score over steps, then
    over the tests Wu's ROUGE-1 filter counts, into files of their own (LOCOS-style pooled write heads)."""
    from dynheads.analysis.headlists import load_head_list
    from dynheads.experiments.static import write_static
    from dynheads.settings import StaticConfig

    rng = np.random.default_rng(5)
    arrays = [rng.normal(0, 0.1, (6, 30, 9)) for _ in range(3)]
    arrays[0][:, 4, 2] += 3.0  # a counted test where head 4-2 writes the answer
    arrays[2][:, 7, 1] += 9.0  # a test the filter drops (recall 0): its head must not lead
    run = RunDir(tmp_path / "static")
    run.start("niah", {"seed": 0}, None)
    for index, (scores, recall) in enumerate(zip(arrays, (1.0, 0.8, 0.0), strict=True)):
        run.save_sample({"sample_id": f"s{index}", "metrics": {"rouge1_recall": recall}}, _write_trace(scores))
    heads = write_static(run, StaticConfig(score="write"))
    assert heads.num_counted == 2 and heads.ranking[0] == (4, 2)
    assert load_head_list(run.path / "static_heads-write.json").heads[0] == (4, 2)
    summary = json.loads((run.path / "static_summary-write.json").read_text())
    assert summary["num_counted"] == 2 and summary["top20"][0] == "L4-H2"
    assert not (run.path / "static_heads.json").exists()  # Wu's list is the copy score's, written by score copy
    from dynheads.resources import STATIC_HEADS, Evaluated, fit_record

    record = fit_record(run.path / "static_heads-write.json", STATIC_HEADS, Evaluated("this run", split="analysis"))
    assert record["fitted_on"]["split"] == "static" and record["fitted_on"]["counted"] == 2  # its own summary
    with pytest.raises(DynheadsError, match="fitted on the 'static' stream"):
        fit_record(run.path / "static_heads-write.json", STATIC_HEADS, Evaluated("this run", split="static"))


def test_ablation_configs_take_a_score_and_a_contrast_and_refuse_what_cannot_decide_d_t():
    from dynheads.settings import AblationConfig

    assert AblationConfig().score_kind() == "copy" and AblationConfig(score="write").score_kind() == "write"
    with pytest.raises(DynheadsError, match="not an attention share"):
        AblationConfig(score="write", static="x.json").check()  # the default threshold is a multiple of chance
    with pytest.raises(DynheadsError, match="not an attention share"):
        AblationConfig(contrast="write", static="x.json").check()
    with pytest.raises(DynheadsError, match="score must be one of"):
        AblationConfig(score="writes", threshold="1", static="x.json").check()
    with pytest.raises(DynheadsError, match="--contrast copy"):
        AblationConfig(fractions=(), strategies=("contrast",)).check()
    AblationConfig(score="write", threshold="2.4", contrast="copy", static="x.json").check()


def test_set_overlap_counts_what_two_scores_share_step_by_step():
    from dynheads.analysis.dynamism import set_overlap

    a = np.zeros((4, 2, 3), bool)
    b = np.zeros((4, 2, 3), bool)
    a[0, 0, :2] = True  # step 0: A = {0-0, 0-1}, B = {0-1}
    b[0, 0, 1] = True
    a[1, 1, 0] = True  # step 1: A only
    b[2, 1, 2] = True  # step 2: B only; step 3: neither
    overlap = set_overlap([a[:2], a[2:]], [b[:2], b[2:]])  # two samples of two steps
    assert overlap["steps"] == 4 and overlap["mean_size_first"] == 0.75 and overlap["mean_size_second"] == 0.5
    assert overlap["first_in_second"] == pytest.approx((0.5 + 0.0) / 2)
    assert overlap["second_in_first"] == pytest.approx((1.0 + 0.0) / 2)
    assert (overlap["first_only_steps"], overlap["second_only_steps"]) == (1, 1)
    assert overlap["jaccard"] == pytest.approx((0.5 + 0 + 0) / 3)
    with pytest.raises(DynheadsError, match="differ in shape"):
        set_overlap([a], [b[:, :1]])


def test_what_reads_a_scores_values_takes_the_write_score_without_a_threshold():
    """The head predictor, CCA and static lists read the write score's values: no threshold is asked for."""
    from dynheads.analysis.cca import samples_from_traces

    trace = _write_trace(np.random.default_rng(6).normal(0, 1, (5, 30, 9)))
    ((hidden, targets),) = samples_from_traces([trace], "write")
    assert hidden.shape == (5, 4) and np.array_equal(targets, trace.scores["write"].reshape(5, 270))
    with pytest.raises(DynheadsError, match="holds no 'copy2' score|score must be one of"):
        samples_from_traces([trace], "copy2")


def test_the_head_predictor_learns_the_sets_a_null_threshold_decides(tmp_path):
    """``predictor train --score write --threshold null:Q --fit-run DECOY``: the targets are W_t (0/1 per head and
    step), trained as a classifier and ranked as D_t is; the fit is recorded beside the metrics."""
    from dynheads.analysis.head_predictor import HeadPredictorConfig
    from dynheads.views.probing import train_probe_on_run
    from dynheads.views.threshold_fit import resolve_threshold

    rng = np.random.default_rng(5)
    hidden = [rng.normal(0, 1, (12, 4)) for _ in range(10)]
    arrays = [rng.normal(0, 0.1, (12, 3, 4)) for _ in range(10)]
    for h, a in zip(hidden, arrays, strict=True):
        a[:, 0, 1] += 3.0 * (h[:, 0] > 0)  # head (0, 1) writes the answer whenever the state's first unit is up
    evaluated = _run(tmp_path / "eval", "niah", list(range(10, 20)), arrays, hidden)
    decoy = _run(tmp_path / "decoy", "niah_decoy", [1, 2], [rng.normal(0, 0.1, (12, 3, 4)) for _ in range(2)])
    sets = resolve_threshold("null:0.1", "write", evaluated.path, decoy.path)
    config = HeadPredictorConfig(hidden_sizes=(8,), epochs=2, splits=1)
    train_probe_on_run(evaluated.path, config, score="write", out_dir=tmp_path / "probe", progress=False, sets=sets)
    metrics = json.loads((tmp_path / "probe" / "metrics.json").read_text())
    assert metrics["task"] == "binary" and metrics["threshold_fit"] == sets.to_dict()
    assert 0 < metrics["baseline"]["positive_rate"] < 0.2  # head (0, 1) on about half the steps: 1 of 12 heads
    assert "write sets (threshold" in (tmp_path / "probe" / "metrics.md").read_text()
    with pytest.raises(DynheadsError, match="copy is binary"):  # a threshold on 0/1 values would change nothing
        train_probe_on_run(evaluated.path, config, score="copy", out_dir=tmp_path / "p2", progress=False, sets=sets)
