"""Claim 2 at the operating point (f = 1, exactly D_t; issue 59) on constructed per-sample arrays: dynamic beyond
static outside D_t and random is supported, equal drops are decided by their interval, a static arm that masks
most of D_t makes dynamic - static "not separable" (never "not supported"), only correct answers with a non-empty
step decide, and the card shows the reading."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from dynheads.analysis.evidence import EvidenceSettings, identical_interval, paired_difference
from dynheads.report.claims import NOT_SEPARABLE, OPERATING_POINT_ARMS, OperatingPoint, operating_point_verdict

N = 40
EVIDENCE = EvidenceSettings(resamples=500)


def _point(drops: dict[str, float], overlaps: dict[str, float] | None = None, *, seed: int = 0, n: int = N):
    """Per arm a per-sample drop of ``drops[arm]`` nats (+ noise) on non-empty steps, the same over all steps."""
    rng = np.random.default_rng(seed)
    drop = {arm: value + rng.normal(0, 0.05, n) for arm, value in drops.items()}
    overlap = {"dynamic": 1.0, "static": 0.2, "static_outside": 0.0, "random": 0.1} | (overlaps or {})
    return OperatingPoint(
        drop, {arm: v.copy() for arm, v in drop.items()}, {a: np.full(n, v) for a, v in overlap.items()}, np.ones(n)
    )


def test_dynamic_beyond_static_outside_and_random_is_supported():
    point = _point({"dynamic": 2.0, "static": 1.9, "static_outside": 0.1, "random": 0.05})
    verdict = operating_point_verdict(point, "NIAH", EVIDENCE)
    assert verdict.status == "supported", verdict.reason
    assert [e.name.split(" drop")[0] for e in verdict.effects] == ["dynamic - static_outside", "dynamic - random"]
    assert [e.interval.n for e in verdict.effects] == [N, N]
    assert verdict.contrasts["dynamic - static_outside"] == verdict.contrasts["dynamic - random"] == "supported"
    assert verdict.contrasts["dynamic - static"] == "inconclusive"  # 0.1 apart: beside, and it decides nothing
    assert "over all steps of all 40 samples" in verdict.reason


def test_equal_drops_are_decided_by_their_interval():
    point = _point({"dynamic": 2.0, "static": 2.0, "static_outside": 2.0, "random": 2.0})
    verdict = operating_point_verdict(point, "NIAH", EVIDENCE)
    assert verdict.status == "not supported", verdict.reason  # the intervals lie below the margin of 0.1
    wide = _point({"dynamic": 2.0, "static": 2.0, "static_outside": 2.0, "random": 2.0}, n=N)
    wide.drop["random"][:] = 2.0 + np.random.default_rng(1).normal(0, 1.0, N)  # a noisy control: wide interval
    noisy = operating_point_verdict(wide, "NIAH", EVIDENCE)
    assert noisy.status in ("not supported", "inconclusive")
    assert noisy.status == "inconclusive" or "dynamic - static_outside" in noisy.reason
    few = operating_point_verdict(_point(dict.fromkeys(OPERATING_POINT_ARMS, 2.0), n=12), "NIAH", EVIDENCE)
    assert few.status == "not supported" or "below the floor" in few.reason


def test_a_static_arm_inside_d_t_is_not_separable_never_not_supported():
    point = _point({"dynamic": 2.0, "static": 2.0, "static_outside": 0.1, "random": 0.05}, {"static": 0.69})
    verdict = operating_point_verdict(point, "NIAH", EVIDENCE)
    assert verdict.contrasts["dynamic - static"] == NOT_SEPARABLE.format(overlap=0.69)
    assert verdict.contrasts["dynamic - static"].startswith("not separable: D_t lies inside the static list")
    assert verdict.status == "supported"  # decided by static_outside and random, not by D_t against itself
    assert "not supported" not in verdict.reason
    separable = _point({"dynamic": 2.0, "static": 2.0, "static_outside": 0.1, "random": 0.05}, {"static": 0.3})
    assert operating_point_verdict(separable, "NIAH", EVIDENCE).contrasts["dynamic - static"] == "not supported"


def test_only_correct_answers_with_a_non_empty_step_decide():
    point = _point({"dynamic": 2.0, "static": 1.9, "static_outside": 0.1, "random": 0.05})
    correct = np.ones(N, dtype=bool)
    correct[:5] = False
    point.drop["dynamic"][5:8] = np.nan  # no step with |D_t| > 0
    for arm in ("static", "static_outside", "random"):
        point.drop[arm][5:8] = np.nan
    verdict = operating_point_verdict(
        OperatingPoint(point.drop, point.drop_all_steps, point.overlap, correct), "NIAH", EVIDENCE
    )
    assert verdict.numbers["samples"] == N and verdict.numbers["samples_correct"] == N - 5
    assert verdict.numbers["samples_decided"] == N - 8 and verdict.effects[0].interval.n == N - 8
    wrong = OperatingPoint(point.drop, point.drop_all_steps, point.overlap, np.zeros(N, dtype=bool))
    assert operating_point_verdict(wrong, "NIAH", EVIDENCE).status == "inconclusive"


def test_a_failed_positive_control_or_a_missing_arm_is_inconclusive():
    weak = operating_point_verdict(_point({"dynamic": 0.2, "static": 0.1, "static_outside": 0.0, "random": 0.0}), "X")
    assert weak.status == "inconclusive" and weak.reason.startswith("positive control failed")
    missing = _point({"dynamic": 2.0, "static": 1.0, "random": 0.1})
    assert "static_outside" in operating_point_verdict(missing, "NIAH", EVIDENCE).reason
    assert operating_point_verdict(None, "NIAH").status == "inconclusive"


def test_the_margin_is_a_parameter():
    point = _point({"dynamic": 2.0, "static": 1.9, "static_outside": 1.5, "random": 1.5})
    assert operating_point_verdict(point, "NIAH", EVIDENCE).status == "supported"
    assert operating_point_verdict(point, "NIAH", EVIDENCE, margin=1.0).status == "not supported"


def test_identical_paired_differences_get_an_exact_interval():
    gap = paired_difference(np.zeros(30), np.zeros(30), EVIDENCE, width=1.0)
    assert gap.effect == 0.0
    assert (gap.low, gap.high) == (pytest.approx(-0.1157, abs=1e-4), pytest.approx(0.1157, abs=1e-4))
    assert not identical_interval(np.ones(5), float("nan"), EVIDENCE).defined  # unbounded: no exact interval
    bootstrap = paired_difference(np.zeros(30), np.zeros(30), EVIDENCE)  # without a width: as before
    assert (bootstrap.low, bootstrap.high) == (0.0, 0.0)


def test_the_claim2_card_shows_the_operating_point_and_the_static_reading(tmp_path):
    from dynheads.report.headline import headline
    from dynheads.report.sections import claim2_niah

    point = _point({"dynamic": 2.0, "static": 2.0, "static_outside": 0.1, "random": 0.05}, {"static": 0.69})
    verdict = operating_point_verdict(point, "NIAH", EVIDENCE)
    plots = tmp_path / "ablation" / "plots"
    plots.mkdir(parents=True)
    (plots / "ablation-accuracy.png").write_bytes(b"")  # a matched grid's heat map: not the dose card's figure
    (plots / "dose-teacher.png").write_bytes(b"")
    figure = claim2_niah.card_figure  # the section's card figure: dose curves first
    card = headline("claim2-niah", verdict, tmp_path, figure=figure)
    assert card.figure == plots / "dose-teacher.png"
    labels = [row[0] for row in card.rows]
    assert labels[0].startswith("dynamic - static_outside drop") and labels[1].startswith("dynamic - random drop")
    assert labels[2].startswith("dynamic - static (beside; static holds 0.69 of D_t)")
    assert "not separable" in card.rows[2][1]


def test_a_control_that_masked_fewer_heads_than_d_t_is_not_matched():
    """A static list with too few scored heads outside D_t leaves static_outside masking fewer heads than D_t (it
    never pads with zero-score heads): its small drop would credit D_t with the heads it left unmasked, so the
    verdict is inconclusive and says which control, not "supported"."""
    drops = {"dynamic": 2.0, "static": 1.9, "static_outside": 0.1, "random": 0.05}
    masked = {arm: np.full(N, 4.0) for arm in drops}
    matched = _point(drops)
    assert operating_point_verdict(replace(matched, masked=masked), "NIAH", EVIDENCE).status == "supported"
    short = {**masked, "static_outside": np.full(N, 4.0)}
    short["static_outside"][:3] = 1.5  # three samples where the list ran out of heads outside D_t
    verdict = operating_point_verdict(replace(matched, masked=short), "NIAH", EVIDENCE)
    assert verdict.status == "inconclusive"
    assert "not matched" in verdict.reason and "static_outside masked fewer heads than D_t on 3 of 40" in verdict.reason
    static_short = {**masked, "static": np.full(N, 1.0)}  # static decides nothing: its count is not checked here
    assert operating_point_verdict(replace(matched, masked=static_short), "NIAH", EVIDENCE).status == "supported"


def test_an_answer_without_steps_leaves_the_all_steps_note_defined():
    """A clean answer that ends at once has no drop (None in its record, NaN here): the note over all steps leaves
    it out and says so, where it read "undefined" for every contrast."""
    point = _point({"dynamic": 2.0, "static": 1.9, "static_outside": 0.1, "random": 0.05})
    for table in (point.drop, point.drop_all_steps):
        for values in table.values():
            values[0] = np.nan
    verdict = operating_point_verdict(point, "NIAH", EVIDENCE)
    assert verdict.status == "supported"
    assert "over all steps of the 39 samples with a step: dynamic - static_outside 1.8" in verdict.reason
    assert "undefined" not in verdict.reason
