"""The dose-response with D_t from the write score (W_t, issue 63) and the contrast arm: every arm, the contrast one
in both metrics, the score and threshold named in the summary, the contrast set's size recorded per sample."""

from __future__ import annotations

import json

import pandas as pd

from dynheads.ablation.strategies import DOSE_ARMS, MEAN_ARMS
from dynheads.experiments.ablation import AblationConfig
from dynheads.experiments.paper_stages import run_claim2
from dynheads.tables import read_summaries


def test_a_write_score_dose_run_masks_w_t_against_as_many_copy_ranked_heads(tiny_model_dir, tiny_lm, tmp_path):
    (tmp_path / "static_summary.json").write_text(json.dumps({"split": "static", "num_tests": 4, "num_counted": 3}))
    (tmp_path / "static_heads.json").write_text(json.dumps(["2-1", "0-3", "1-2", "2-0", "0-0"]))
    config = AblationConfig(
        model=str(tiny_model_dir),
        lengths=(200,),
        depths=(0.0, 1.0),
        runs=1,
        max_new_tokens=3,
        seed=3,
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
