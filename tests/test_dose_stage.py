"""The dose-response stage in fractions of each step's |D_t| (issue 59): records of both metrics, dose.csv with
intervals (dose and compensation parts), the figures, the numbers Claim 2 reads at f = 1 (and its verdict from
them), an old fixed-k run read without a traceback, the static list's source in the manifest, and the refusals.

The tiny model copies nothing, so D_t is Eq. 2's at chance here (sets of 0-2 heads): the fractions mask heads."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from dynheads.ablation import cascade as ablation
from dynheads.ablation.strategies import DOSE_ARMS, MEAN_ARMS
from dynheads.errors import DynheadsError
from dynheads.experiments import dose as dose_module
from dynheads.experiments.ablation import AblationConfig
from dynheads.experiments.paper_stages import run_claim2
from dynheads.report import claims
from dynheads.report.claim_parts import operating_point
from dynheads.tables import read_summaries


@pytest.fixture(autouse=True)
def eq2_at_chance(monkeypatch):
    """D_t by Eq. 2 at chance: the tiny model copies nothing, so Eq. 1 would leave every step empty."""
    real = dose_module.AblationSettings
    monkeypatch.setattr(
        dose_module, "AblationSettings", lambda **kw: real(**{**kw, "score": "reasoning", "threshold": "relative:1"})
    )


def _static(tmp_path, split="static"):
    """A ranked head list with a static stage's summary beside it (fitted on ``split``)."""
    (tmp_path / "static_summary.json").write_text(json.dumps({"split": split, "num_tests": 4, "num_counted": 3}))
    path = tmp_path / "static_heads.json"
    path.write_text(json.dumps(["2-1", "0-3", "1-2", "2-0", "0-0"]))
    return str(path)


def _config(model_dir, static, **overrides) -> AblationConfig:
    values = dict(model=str(model_dir), lengths=(200,), depths=(0.0, 1.0), runs=1, max_new_tokens=3, seed=3)
    dosed = {"fractions": (0.5, 1.0), "compensation": (2.0,)}
    return AblationConfig(**{**values, "static": static, **dosed, **overrides})


def test_dose_stage_writes_both_metrics_curves_and_claim2_numbers(tiny_model_dir, tiny_lm, tmp_path):
    static = _static(tmp_path)
    run = run_claim2(_config(tiny_model_dir, static, metric="both"), tmp_path / "run", lm=tiny_lm, progress=False)
    records = run.records()
    teacher_records = [r for r in records if r["kind"] == "teacher"]
    assert len(teacher_records) == 2  # one per sample
    assert sum(r["kind"] == "cascade" for r in records) == 2 * (1 + len(DOSE_ARMS) * 3)  # none + arms x fractions
    for record in teacher_records:
        assert isinstance(record["correct"], bool) and record["nonempty_steps"] <= record["steps"]
        assert set(record["arms"]) == {*DOSE_ARMS, *MEAN_ARMS} and set(record["arms"]["static_mean"]) == {"1"}
        if record["nonempty_steps"]:  # dynamic at f = 1 masks exactly D_t, past it D_t and more
            assert record["arms"]["dynamic"]["1"]["overlap"] == record["arms"]["dynamic"]["2"]["overlap"] == 1.0
    table = pd.read_csv(run.path / "dose.csv")
    teacher = table[table["family"] == "teacher"]
    assert set(teacher["metric"]) == {"drop", "drop_nonempty", "flip"}
    assert set(teacher["arm"]) == {*DOSE_ARMS, *MEAN_ARMS}
    assert set(teacher["fraction"]) == {0.5, 1.0, 2.0} and (teacher[teacher["metric"] == "drop"]["n"] == 2).all()
    assert set(teacher[teacher["fraction"] == 2.0]["part"]) == {"compensation"}
    assert set(teacher[teacher["fraction"] <= 1.0]["part"]) == {"dose"}
    assert "none" in set(table[table["family"] == "cascade"]["arm"])
    for name in ("dose-teacher", "compensation-teacher", "dose-cascade", "compensation-cascade"):
        assert (run.path / "plots" / f"{name}.png").is_file(), name
    manifest = run.manifest()
    assert manifest["static_source"]["fitted_on"]["split"] == "static" and manifest["design"] == "fraction"
    numbers = read_summaries(run.path)["summary.md"].numbers
    point = operating_point(numbers)
    assert point is not None and set(point.drop) == {*DOSE_ARMS, *MEAN_ARMS} and len(point.correct) == 2
    verdict = claims.operating_point_verdict(point, "NIAH")
    assert verdict.status == "inconclusive"  # 2 samples: a failed control or the floor of 30, said in the reason
    assert verdict.reason


def test_an_old_fixed_k_run_renders_as_the_old_design(tmp_path):
    """A run dir of an older dynheads (every arm at k heads per step) renders without a traceback and says so."""
    from dynheads import stages
    from dynheads.analysis.evidence import EvidenceSettings
    from dynheads.report.claim_parts import OLD_DOSE_DESIGN
    from dynheads.report.headline import headline
    from dynheads.report.sections import claim2_niah
    from dynheads.tables import Summary, write_summary

    folder = tmp_path / stages.ABLATION
    folder.mkdir()
    old = {"design": "dose", "doses": [1, 2], "arms": list(DOSE_ARMS), "teacher": {"logprob": {}, "samples": 2}}
    write_summary(folder, "summary.md", Summary(["old"], old, "old"))
    section = claim2_niah
    parts = section.build(_study_folder(tmp_path, EvidenceSettings()))
    verdict = next(part for part in parts if isinstance(part, claims.Verdict))
    assert verdict.status == "inconclusive" and verdict.reason == OLD_DOSE_DESIGN
    assert headline("claim2-niah", verdict, tmp_path, figure=section.card_figure).rows


def _study_folder(root, evidence):
    from dynheads.report.sections import StudyFolder
    from dynheads.report.study import qa_task

    return StudyFolder(root, evidence, qa_task(root))


def test_dose_stage_refuses_a_static_list_fitted_on_the_evaluated_stream(tiny_model_dir, tiny_lm, tmp_path):
    static = _static(tmp_path, split="analysis")
    with pytest.raises(DynheadsError, match="fitted on the 'analysis' stream"):
        run_claim2(_config(tiny_model_dir, static), tmp_path / "run", lm=tiny_lm, progress=False)


def test_dose_settings_are_checked(tiny_model_dir, tmp_path):
    static = _static(tmp_path)
    with pytest.raises(DynheadsError, match="fixed doses .* are retired"):
        _config(tiny_model_dir, static, doses=(1, 2)).check()  # an old config: said plainly
    with pytest.raises(DynheadsError, match="must hold 1"):
        _config(tiny_model_dir, static, fractions=(0.25, 0.5)).check()
    with pytest.raises(DynheadsError, match=r"lie in \(0, 1\]"):
        _config(tiny_model_dir, static, fractions=(0.5, 1.0, 1.5)).check()
    with pytest.raises(DynheadsError, match="lie above 1"):
        _config(tiny_model_dir, static, compensation=(1.0,)).check()
    with pytest.raises(DynheadsError, match="each dose once: 0.5 is given more than once"):
        _config(tiny_model_dir, static, fractions=(0.5, 0.5, 1.0)).check()
    with pytest.raises(DynheadsError, match="each dose once: 2 is given"):
        _config(tiny_model_dir, static, compensation=(2.0, 2)).check()
    # 1.0000001 is named "1" (the operating point's name) but masks ceil(1.0000001 x 4) = 5 heads: never merged
    with pytest.raises(DynheadsError, match="each dose once: 1 is given .* agree to 6 digits"):
        _config(tiny_model_dir, static, compensation=(1.0000001,)).check()
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
    assert len(shared) == 2 * (1 + len(DOSE_ARMS) * 3) and len(prefilled) == 2  # one prefill per sample
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


def test_the_operating_point_reads_the_heads_each_arm_masked(tiny_model_dir, tiny_lm, tmp_path):
    """A static list of one scored head cannot give |D_t| heads outside D_t: static_outside masks fewer heads than
    the dynamic arm, and the numbers Claim 2 reads carry that (per arm and sample, at f = 1), so the verdict can
    refuse an unmatched control (tests/test_dose_verdict.py)."""
    (tmp_path / "static_summary.json").write_text(json.dumps({"split": "static", "num_tests": 4, "num_counted": 3}))
    (tmp_path / "static_heads.json").write_text(json.dumps({"2-1": [1.0], "0-3": [0.0], "1-2": [0.0]}))
    config = _config(tiny_model_dir, str(tmp_path / "static_heads.json"), depths=(0.0, 0.5, 1.0), compensation=())
    run = run_claim2(config, tmp_path / "run", lm=tiny_lm, progress=False)
    point = operating_point(read_summaries(run.path)["summary.md"].numbers)
    records = run.records()
    for arm in DOSE_ARMS:
        assert list(point.masked[arm]) == [r["arms"][arm]["1"]["masked"] for r in records]
    assert (point.masked["random"] == point.masked["dynamic"]).all()
    assert (point.masked["static_outside"] < point.masked["dynamic"]).any()  # the case the test is for
    decided = replace(point, correct=np.ones(len(records), dtype=bool))  # the tiny model answers nothing correctly
    verdict = claims.operating_point_verdict(decided, "NIAH")
    assert verdict.status == "inconclusive" and "static_outside masked fewer heads than D_t" in verdict.reason
