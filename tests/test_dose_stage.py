"""The dose-response stage: records of both metrics, dose.csv with intervals, the figures, the numbers Claim 2
reads (and its verdict from them), the static list's source in the manifest, and the refusals."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from dynheads.ablation import per_step as ablation
from dynheads.ablation.strategies import DOSE_ARMS
from dynheads.errors import DynheadsError
from dynheads.experiments.ablation import AblationConfig
from dynheads.experiments.dose import run_claim2
from dynheads.models import load_model
from dynheads.report import claims
from dynheads.report.build import dose_curves
from dynheads.tables import read_summaries


@pytest.fixture(scope="module")
def tiny_lm(tiny_model_dir):
    return load_model(tiny_model_dir)


def _static(tmp_path, split="static"):
    """A ranked head list with a static stage's summary beside it (fitted on ``split``)."""
    (tmp_path / "static_summary.json").write_text(json.dumps({"split": split, "num_tests": 4, "num_counted": 3}))
    path = tmp_path / "static_heads.json"
    path.write_text(json.dumps(["2-1", "0-3", "1-2", "2-0", "0-0"]))
    return str(path)


def _config(model_dir, static, **overrides) -> AblationConfig:
    values = dict(model=str(model_dir), lengths=(200,), depths=(0.0, 1.0), runs=1, max_new_tokens=3, seed=3)
    return AblationConfig(**{**values, "static": static, "doses": (1, 2), **overrides})


def test_dose_stage_writes_both_metrics_curves_and_claim2_numbers(tiny_model_dir, tiny_lm, tmp_path):
    static = _static(tmp_path)
    run = run_claim2(_config(tiny_model_dir, static, metric="both"), tmp_path / "run", lm=tiny_lm, progress=False)
    records = run.records()
    assert sum(r["kind"] == "teacher" for r in records) == 2  # one per sample
    assert sum(r["kind"] == "cascade" for r in records) == 2 * (1 + len(DOSE_ARMS) * 2)  # none + arms x doses
    table = pd.read_csv(run.path / "dose.csv")
    teacher = table[table["family"] == "teacher"]
    assert set(teacher["metric"]) == {"drop", "flip"} and set(teacher["arm"]) == set(DOSE_ARMS)
    assert set(teacher["dose"]) == {1, 2} and (teacher["n"] == 2).all()
    assert (teacher["masked"] == teacher["dose"]).all()  # every arm masks the dose at every step
    assert "none" in set(table[table["family"] == "cascade"]["arm"])
    assert (run.path / "plots" / "dose-teacher.png").is_file() and (run.path / "plots" / "dose-cascade.png").is_file()
    manifest = run.manifest()
    assert manifest["static_source"]["fitted_on"]["split"] == "static" and manifest["design"] == "dose"
    numbers = read_summaries(run.path)["summary.md"].numbers
    curves = dose_curves(numbers)
    assert curves is not None and curves.metric == "log p(clean token)"
    assert sorted(curves.values["static_outside"]) == [1, 2] and len(curves.baseline) == 2
    verdict = claims.dose_verdict(curves, "NIAH")
    assert verdict.status == "inconclusive"  # 2 samples: a failed control or the floor of 30, said in the reason
    assert verdict.reason


def test_dose_stage_refuses_a_static_list_fitted_on_the_evaluated_stream(tiny_model_dir, tiny_lm, tmp_path):
    static = _static(tmp_path, split="analysis")
    with pytest.raises(DynheadsError, match="fitted on the 'analysis' stream"):
        run_claim2(_config(tiny_model_dir, static), tmp_path / "run", lm=tiny_lm, progress=False)


def test_dose_settings_are_checked(tiny_model_dir, tmp_path):
    static = _static(tmp_path)
    with pytest.raises(DynheadsError, match="a dose masks at least one head"):
        _config(tiny_model_dir, static, doses=(0, 2)).check()
    with pytest.raises(DynheadsError, match="unknown dose-response metric"):
        _config(tiny_model_dir, static, metric="bogus").check()
    with pytest.raises(DynheadsError, match="static head list"):
        run_claim2(_config(tiny_model_dir, None), tmp_path / "run")


def test_cascade_arms_and_doses_share_one_prefill_per_sample(tiny_model_dir, tiny_lm, tmp_path, monkeypatch):
    """Issue 36: a sample's none + arms x doses cascade records fork one prefill; they equal every row prefilled
    alone."""
    config = _config(tiny_model_dir, _static(tmp_path), metric="cascade")
    prefilled, real = [], ablation.prefilled_session
    monkeypatch.setattr(
        ablation, "prefilled_session", lambda lm, s, *a: prefilled.append(s.sample_id) or real(lm, s, *a)
    )
    shared = run_claim2(config, tmp_path / "shared", lm=tiny_lm, progress=False).records()
    assert len(shared) == 2 * (1 + len(DOSE_ARMS) * 2) and len(prefilled) == 2  # one prefill per sample
    monkeypatch.setattr(
        ablation, "shared_prefills", lambda lm, samples, setting, n: [real(lm, s, setting, n) for s in samples]
    )
    assert run_claim2(config, tmp_path / "per-row", lm=tiny_lm, progress=False).records() == shared


def test_teacher_records_in_batches_equal_batch_one(tiny_model_dir, tiny_lm, tmp_path):
    """Issue 36: ``--batch-size 4`` decodes four samples' clean answers together; each record equals batch 1's up
    to fp32 rounding (the same answer, heads and flips)."""
    config = _config(tiny_model_dir, _static(tmp_path), depths=(0.0, 0.5, 1.0), max_new_tokens=4)
    one = run_claim2(config, tmp_path / "b1", lm=tiny_lm, progress=False).records()
    four = run_claim2(config, tmp_path / "b4", lm=tiny_lm, progress=False, batch_size=4).records()
    assert len(one) == len(four) == 3 and all(r["steps"] >= 2 for r in one)
    for a, b in zip(one, four, strict=True):
        assert (a["sample_id"], a["generated"], a["steps"]) == (b["sample_id"], b["generated"], b["steps"])
        assert b["clean_logprob"] == pytest.approx(a["clean_logprob"], abs=2e-5)
        for arm, doses in a["arms"].items():
            for dose, values in doses.items():
                assert b["arms"][arm][dose]["masked"] == values["masked"]
                assert b["arms"][arm][dose]["flip"] == values["flip"]
                assert b["arms"][arm][dose]["drop"] == pytest.approx(values["drop"], abs=2e-5)
