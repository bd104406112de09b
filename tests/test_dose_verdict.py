"""Claim 2 as a dose-response: the verdict comes out supported, not supported or inconclusive on constructed
curves (floor, failed controls), and identical paired differences get an exact interval, never a bootstrap [0, 0]."""

from __future__ import annotations

import numpy as np
import pytest

from dynheads.analysis.evidence import EvidenceSettings, identical_interval, paired_difference
from dynheads.report.claims import DOSE_ARMS, DoseCurves, dose_verdict

N = 40
DOSES = (1, 2, 3, 5, 8)
EVIDENCE = EvidenceSettings(resamples=500)


def _curves(harm_per_dose: dict[str, float], *, noise: float = 0.05, seed: int = 0) -> DoseCurves:
    """Log-probability curves: arm a at dose k lowers the clean log-probability by harm[a] * k / 8 (+ noise)."""
    rng = np.random.default_rng(seed)
    baseline = -rng.uniform(0.0, 0.2, N)
    values = {
        arm: {k: baseline - harm * k / 8 - np.abs(rng.normal(0, noise, N)) for k in DOSES}
        for arm, harm in harm_per_dose.items()
    }
    return DoseCurves("log p(clean token)", values, baseline, unit="nats")


def test_dynamic_beyond_both_static_arms_is_supported():
    curves = _curves({"dynamic": 3.0, "static": 1.0, "static_outside": 0.1, "random": 0.1})
    verdict = dose_verdict(curves, "NIAH", EVIDENCE)
    assert verdict.status == "supported", verdict.reason
    assert [e.interval.n for e in verdict.effects] == [N, N]


def test_static_as_harmful_as_dynamic_is_not_supported():
    curves = _curves({"dynamic": 3.0, "static": 3.5, "static_outside": 0.1, "random": 0.1})
    verdict = dose_verdict(curves, "NIAH", EVIDENCE)
    assert verdict.status == "not supported", verdict.reason
    assert "dynamic - static area" in verdict.reason


def test_every_arm_at_the_floor_is_inconclusive_with_the_reason():
    zeros = np.zeros(N)
    values = {arm: {k: zeros for k in DOSES} for arm in DOSE_ARMS}
    curves = DoseCurves("accuracy", values, np.ones(N), bounds=(0.0, 1.0), width=1.0)
    verdict = dose_verdict(curves, "NIAH", EVIDENCE)
    assert verdict.status == "inconclusive"
    assert verdict.reason.startswith("floor: every arm scores 0 at every dose")


def test_a_failed_positive_control_is_inconclusive():
    curves = _curves({"dynamic": 0.2, "static": 0.1, "static_outside": 0.0, "random": 0.0}, noise=0.01)
    verdict = dose_verdict(curves, "NIAH", EVIDENCE)
    assert verdict.status == "inconclusive"
    assert verdict.reason.startswith("positive control failed")


def test_a_failed_negative_control_is_inconclusive():
    curves = _curves({"dynamic": 3.0, "static": 1.0, "static_outside": 0.1, "random": 8.0})
    verdict = dose_verdict(curves, "NIAH", EVIDENCE)
    assert verdict.status == "inconclusive"
    assert verdict.reason.startswith("negative control failed")


def test_missing_arm_is_inconclusive():
    curves = _curves({"dynamic": 3.0, "static": 1.0, "random": 0.1})
    assert "static_outside" in dose_verdict(curves, "NIAH", EVIDENCE).reason


def test_identical_paired_differences_get_an_exact_interval():
    gap = paired_difference(np.zeros(30), np.zeros(30), EVIDENCE, width=1.0)
    assert gap.effect == 0.0
    assert (gap.low, gap.high) == (pytest.approx(-0.1157, abs=1e-4), pytest.approx(0.1157, abs=1e-4))
    assert not identical_interval(np.ones(5), float("nan"), EVIDENCE).defined  # unbounded: no exact interval
    bootstrap = paired_difference(np.zeros(30), np.zeros(30), EVIDENCE)  # without a width: as before
    assert (bootstrap.low, bootstrap.high) == (0.0, 0.0)


@pytest.mark.parametrize(("n", "status"), [(30, "inconclusive"), (40, "not supported")])
def test_identical_area_differences_are_said_and_decided_on_their_exact_interval(n, status):
    ones, half = np.ones(n), np.full(n, 0.5)
    falls = {1: ones, **{k: np.zeros(n) for k in DOSES[1:]}}  # every sample fails from two heads on
    values = {
        "dynamic": falls,
        "static": falls,  # the same on every sample: identical paired differences
        "static_outside": {1: ones, **{k: half for k in DOSES[1:]}},
        "random": {1: ones, **{k: half for k in DOSES[1:]}},
    }
    curves = DoseCurves("accuracy", values, ones, bounds=(0.0, 1.0), width=1.0)
    verdict = dose_verdict(curves, "NIAH", EVIDENCE)
    static_gap = verdict.effects[0].interval
    assert static_gap.low < 0 < static_gap.high  # exact, not [0, 0]: 0/30 bounds at 0.116, 0/40 at 0.088
    assert "every paired difference of dynamic - static area" in verdict.reason
    assert verdict.status == status


def test_the_claim2_card_shows_the_dose_curves_and_every_arm(tmp_path):
    from dynheads.report.build import REPORT_SECTIONS
    from dynheads.report.headline import headline

    curves = _curves({"dynamic": 3.0, "static": 1.0, "static_outside": 0.1, "random": 0.1})
    verdict = dose_verdict(curves, "NIAH", EVIDENCE)
    plots = tmp_path / "ablation" / "plots"
    plots.mkdir(parents=True)
    (plots / "ablation-accuracy.png").write_bytes(b"")  # a matched grid's heat map: not the dose card's figure
    (plots / "dose-teacher.png").write_bytes(b"")
    figure = REPORT_SECTIONS.get("claim2-niah").card_figure  # the section's card figure: dose curves first
    card = headline("claim2-niah", verdict, tmp_path, figure=figure)
    assert card.figure == plots / "dose-teacher.png"
    harm_rows = [row for row in card.rows if row[0].startswith("harm at k=")]
    assert [row[0].split(":")[0] for row in harm_rows] == ["harm at k=1", "harm at k=3"]  # least, middle
    assert all(len(row[1].split(" / ")) == len(DOSE_ARMS) for row in harm_rows)
