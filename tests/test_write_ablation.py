"""The dose-response with D_t from the write score (W_t, issue 63) and the contrast arm: every arm, the contrast one
in both metrics, the score and threshold named in the summary, the contrast set's size recorded per sample."""

from __future__ import annotations

import json
from dataclasses import replace

import pandas as pd
import pytest

from dynheads.ablation.strategies import DOSE_ARMS, MEAN_ARMS
from dynheads.errors import DynheadsError
from dynheads.experiments.ablation import AblationConfig
from dynheads.experiments.paper_stages import run_claim2
from dynheads.tables import read_summaries
from dynheads.views.threshold_fit import fit_threshold


def _tiny_grid(tiny_model_dir, **settings) -> AblationConfig:
    """An ablation of the tiny model's two-sample NIAH grid (200 tokens, depths 0 and 1), with ``settings``."""
    grid = {"lengths": (200,), "depths": (0.0, 1.0), "runs": 1, "max_new_tokens": 3, "seed": 3}
    return AblationConfig(model=str(tiny_model_dir), **grid | settings)


def test_a_write_score_dose_run_masks_w_t_against_as_many_copy_ranked_heads(tiny_model_dir, tiny_lm, tmp_path):
    (tmp_path / "static_summary.json").write_text(json.dumps({"split": "static", "num_tests": 4, "num_counted": 3}))
    (tmp_path / "static_heads.json").write_text(json.dumps(["2-1", "0-3", "1-2", "2-0", "0-0"]))
    config = _tiny_grid(
        tiny_model_dir,
        static=str(tmp_path / "static_heads.json"),
        fractions=(0.5, 1.0),
        compensation=(),
        metric="both",
        score="write",
        threshold="0",  # every head whose needle keys push the token up: about half of the tiny model's
        contrast="copy",
    )
    run = run_claim2(config, tmp_path / "run", lm=tiny_lm, progress=False)
    arms = {*DOSE_ARMS, "contrast"}
    teacher = [r for r in run.records() if r["kind"] == "teacher"]
    assert len(teacher) == 2 and all(set(r["arms"]) == arms | set(MEAN_ARMS) for r in teacher)
    assert all(r["mean_dynamic"] > 0 and r["mean_contrast"] == 0.0 for r in teacher)  # Eq. 1 never fires here
    table = pd.read_csv(run.path / "dose.csv")
    assert set(table[table["family"] == "teacher"]["arm"]) == arms | set(MEAN_ARMS)
    assert set(table[table["family"] == "cascade"]["arm"]) == arms | {"none"}
    contrast = table[(table["arm"] == "contrast") & (table["metric"] == "drop")]
    dynamic = table[(table["arm"] == "dynamic") & (table["metric"] == "drop")]
    assert list(contrast["masked"]) == list(dynamic["masked"])  # as many heads as W_t, dose by dose
    assert run.manifest()["arms"] == [*DOSE_ARMS, "contrast"] and run.manifest()["contrast"] == "copy"
    text = (run.path / "summary.md").read_text()
    assert "D_t here: write score > 0 (--score write)" in text and "by the Eq. 1 copy score" in text
    assert read_summaries(run.path)["summary.md"].numbers["arms"] == [*DOSE_ARMS, "contrast"]


def _decoy_run(tiny_model_dir, tiny_lm, out, split: str):
    """A traced decoy run of the tiny model on the ``split`` seed stream: what a null:Q threshold is fitted on."""
    from dynheads.experiments.experiment import run_task
    from dynheads.settings import NiahConfig

    config = NiahConfig(model=str(tiny_model_dir), lengths=(200,), depths=(0.0, 1.0), runs=1, max_new_tokens=3, seed=3)
    config = replace(config, split=split, write_score=True)  # the write score's null is fitted on its values
    return run_task("niah_decoy", config, out, lm=tiny_lm, progress=False)


def test_the_ablation_fits_a_null_threshold_on_a_decoy_run_and_records_the_fit(tiny_model_dir, tiny_lm, tmp_path):
    decoy = _decoy_run(tiny_model_dir, tiny_lm, tmp_path / "decoy", "static")
    expected = fit_threshold("null:0.5", "write", decoy.path)
    (tmp_path / "static_heads.json").write_text(json.dumps(["2-1", "0-3", "1-2", "2-0", "0-0"]))
    config = _tiny_grid(
        tiny_model_dir,
        static=str(tmp_path / "static_heads.json"),
        fractions=(1.0,),
        compensation=(),
        score="write",
        threshold="null:0.5",
        fit_run=str(decoy.path),
    )
    run = run_claim2(config, tmp_path / "run", lm=tiny_lm, progress=False)
    manifest = run.manifest()
    assert manifest["config"]["threshold"] == "null:0.5" and manifest["config"]["fit_run"] == str(decoy.path)
    assert manifest["threshold_fit"] == expected.to_dict() and expected.fit_steps > 0
    applied = replace(config, threshold=expected.applied, fit_run=None)
    fixed = run_claim2(applied, tmp_path / "fixed", lm=tiny_lm, progress=False)
    teacher = {r["sample_id"]: r["arms"] for r in run.records()}
    assert teacher == {r["sample_id"]: r["arms"] for r in fixed.records()}  # the fitted value is what decided D_t
    assert f"fitted by the rule null:0.5 on the decoy run {decoy.path}" in (run.path / "summary.md").read_text()


def test_a_fitting_run_on_the_evaluated_seed_stream_is_refused_before_any_work(tiny_model_dir, tiny_lm, tmp_path):
    decoy = _decoy_run(tiny_model_dir, tiny_lm, tmp_path / "decoy", "analysis")  # the ablation's own stream
    config = _tiny_grid(
        tiny_model_dir,
        fractions=(),
        strategies=("dynamic",),
        score="write",
        threshold="null:0.5",
        fit_run=str(decoy.path),
    )
    with pytest.raises(DynheadsError, match="shares the seed or needle value of 2 of the samples"):
        run_claim2(config, tmp_path / "run", lm=tiny_lm, progress=False)
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"score": "write", "threshold": "null:0.1"}, "is fitted on a traced run: give it with --fit-run"),
        ({"score": "write", "threshold": "0.5", "fit_run": "runs/decoy"}, "threshold 0.5 is fixed: drop it"),
        ({"threshold": "null:0.1", "fit_run": "runs/decoy"}, "copy score is binary and takes no threshold"),
    ],
)
def test_a_fit_run_without_a_fitted_threshold_and_the_reverse_are_refused_in_one_line(settings, message):
    with pytest.raises(DynheadsError, match=message):
        AblationConfig(**settings).check()


def test_a_panel_list_masks_what_the_static_arm_masks_with_that_list_as_static(tiny_model_dir, tiny_lm, tmp_path):
    """A detector panel at matched count: each list masks its top |D_t| heads per step, exactly as the static arm
    of a run whose --static is that list; the manifest keeps each list's top heads, panel-overlap.csv their overlap."""
    (tmp_path / "static_summary.json").write_text(json.dumps({"split": "static", "num_tests": 4, "num_counted": 3}))
    lists = {"a": ["2-1", "0-3", "1-2", "2-0", "0-0"], "b": ["1-1", "0-3", "2-2", "2-1"]}
    for name, heads in lists.items():
        (tmp_path / f"static_heads-{name}.json").write_text(json.dumps(heads))
    base = _tiny_grid(
        tiny_model_dir,
        static=str(tmp_path / "static_heads-a.json"),
        fractions=(1.0,),
        compensation=(),
        score="write",
        threshold="0",
        contrast="copy",
    )
    panel = replace(base, panel=(f"b={tmp_path / 'static_heads-b.json'}",))
    run = run_claim2(panel, tmp_path / "panel", lm=tiny_lm, progress=False)
    alone = run_claim2(
        replace(base, static=str(tmp_path / "static_heads-b.json")), tmp_path / "b", lm=tiny_lm, progress=False
    )
    by_sample = {r["sample_id"]: r["arms"] for r in alone.records()}
    for record in run.records():
        assert record["arms"]["list:b"] == by_sample[record["sample_id"]]["static"]
        assert record["arms"]["static"] != record["arms"]["list:b"]  # two lists, two arms
    manifest = run.manifest()
    assert manifest["arms"] == [*DOSE_ARMS, "contrast", "list:b"] and manifest["panel"]["list:b"]["top"] == lists["b"]
    overlap = pd.read_csv(run.path / "panel-overlap.csv")
    assert overlap.to_dict("records") == [
        {"k": 10, "list": "static", "other": "list:b", "shared": 2},
        {"k": 20, "list": "static", "other": "list:b", "shared": 2},
    ]
    effects = pd.read_csv(run.path / "panel.csv")
    assert (
        list(effects["arm"]) == ["dynamic", "static", "contrast", "list:b"]
        and "Detector panel" in (run.path / "summary.md").read_text()
    )


def test_panel_effects_pair_each_list_with_d_t_on_the_decided_samples_only():
    from dynheads.analysis.evidence import EvidenceSettings
    from dynheads.views.dose_tables import panel_effects

    def arms(dynamic, static, listed):
        return {"dynamic": {"1": dynamic}, "static": {"1": static}, "list:x": {"1": listed}}

    teacher = {  # sample 3 is wrong and sample 4 has no non-empty step: neither is decided on
        "correct": [True, True, True, False, True],
        "nonempty_steps": [2, 3, 1, 4, 0],
        "drop_nonempty": arms([2.0, 3.0, 4.0, 9.0, None], [1.0, 1.0, 1.0, 0.0, None], [2.0, 2.0, 5.0, 0.0, None]),
        "overlap": arms([1.0, 1.0, 1.0, 1.0, None], [0.5, 0.5, 0.0, 0.0, None], [1.0, 0.5, 0.5, 0.0, None]),
    }
    table = panel_effects(teacher, ["static", "list:x"], EvidenceSettings(resamples=200)).set_index("arm")
    assert table.loc["dynamic", "drop"] == 3.0 and table.loc["dynamic", "n"] == 3
    assert table.loc["static", "dynamic_minus"] == 2.0 and table.loc["list:x", "dynamic_minus"] == 0.0
    assert table.loc["static", "overlap"] == pytest.approx(1 / 3) and table.loc["list:x", "overlap"] == pytest.approx(
        2 / 3
    )
    assert pd.isna(table.loc["dynamic", "dynamic_minus"])


@pytest.mark.parametrize(
    ("panel", "message"),
    [(("b",), "takes NAME=FILE entries"), (("b=missing.json",), "head list not found: missing.json")],
)
def test_a_malformed_panel_is_refused_in_one_line(panel, message):
    with pytest.raises(DynheadsError, match=message):
        AblationConfig(panel=panel).check()
