"""Intervals and three-way decisions on data with a known answer."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import pytest
from scipy.stats import DegenerateDataWarning

import dynheads
from dynheads.analysis.evidence import (
    UNDEFINED,
    BatchedStatistic,
    Effect,
    EvidenceSettings,
    Interval,
    combine,
    group_interval,
    identical_interval,
    interval,
    mean_interval,
    minimum_detectable_effect,
    paired_difference,
    pooled_interval,
)

SETTINGS = EvidenceSettings()
PACKAGE = Path(dynheads.__file__).parent


def test_identical_arms_give_an_interval_around_zero():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=200), rng.normal(size=200)  # one distribution, two draws
    gap = paired_difference(a, b, SETTINGS)
    assert gap.low < 0 < gap.high and gap.n == 200
    assert Effect("gap", gap, 0.0).decide(SETTINGS.floor)[0] == "inconclusive"


def test_a_large_effect_is_supported_and_its_mirror_is_not():
    rng = np.random.default_rng(1)
    base = rng.normal(size=50)
    better = paired_difference(base + 1.0, base + rng.normal(scale=0.1, size=50), SETTINGS)
    assert better.low > 0.9 and better.high < 1.1
    assert Effect("gap", better, 0.1).decide(30) == ("supported", "gap: the interval lies above 0.1")
    worse = paired_difference(base - 1.0, base, SETTINGS)
    assert Effect("gap", worse, 0.1).decide(30)[0] == "not supported"
    assert Effect("share", worse, 0.1, "below").decide(30)[0] == "supported"


def test_the_interval_of_a_mean_covers_the_true_mean_about_95_percent_of_the_time():
    rng = np.random.default_rng(2)
    found = [mean_interval(rng.normal(0.3, 1.0, 40), EvidenceSettings(resamples=400, seed=i)) for i in range(60)]
    hits = sum(found_interval.low < 0.3 < found_interval.high for found_interval in found)
    assert hits >= 50  # nominal 57 of 60; a broken interval (zero width, wrong centre) scores far lower


def test_paired_resampling_cancels_what_the_arms_share():
    rng = np.random.default_rng(3)
    shared = rng.normal(scale=10.0, size=60)  # large per-sample variation common to both arms
    paired = paired_difference(shared + 0.5, shared, SETTINGS)
    assert paired.high - paired.low < 1e-9 and paired.effect == pytest.approx(0.5)


def test_statistics_of_indices_and_undefined_effects():
    counts = np.array([[3, 0], [0, 3], [1, 1]], float)
    pooled = interval(3, lambda idx: counts[idx].sum(0)[0] / counts[idx].sum(), SETTINGS)
    assert pooled.effect == pytest.approx(4 / 8) and 0 <= pooled.low <= pooled.high <= 1
    assert interval(0, lambda idx: 0.0, SETTINGS) == UNDEFINED
    single = interval(1, lambda idx: 2.0, SETTINGS)
    assert single.effect == 2.0 and not single.defined
    nan = interval(5, lambda idx: math.nan, SETTINGS)
    assert not nan.defined and nan.n == 5
    assert mean_interval(np.array([np.nan, np.nan]), SETTINGS) == UNDEFINED


def test_floor_ties_and_combination():
    tight = Interval(0.5, 0.4, 0.6, 10)
    assert Effect("x", tight, 0.1).decide(30) == ("inconclusive", "x: n=10 is below the floor of 30 samples")
    tie = Interval(0.0, 0.0, 0.0, 40)
    assert Effect("x", tie, 0.0).decide(30)[0] == "inconclusive"
    undefined = Effect("r2", UNDEFINED, 0.0, undefined_reason="constant target")
    assert undefined.decide(30) == ("inconclusive", "r2 is undefined: constant target")
    good = Effect("a", Interval(0.5, 0.4, 0.6, 40), 0.1)
    bad = Effect("b", Interval(0.0, -0.1, 0.05, 40), 0.1)
    assert combine([good, good], 30)[0] == "supported"
    assert combine([good, bad], 30)[0] == "not supported"
    assert combine([good, undefined], 30) == ("inconclusive", "r2 is undefined: constant target")
    assert combine([bad, undefined], 30)[0] == "not supported"
    # issue 59: beside the rule, the smallest effect an interval of this width finds at 80 % power
    # ((1.960 + 0.842) x 0.1 / 1.960 = 0.143)
    assert good.line() == "a 0.500 [0.400, 0.600] (n=40), rule > 0.1; detects 0.143 at 80 % power"
    assert math.isnan(minimum_detectable_effect(Interval(0.5, 0.5, 0.5, 40)))


def test_the_seed_makes_intervals_reproducible():
    values = np.random.default_rng(4).normal(size=30)
    assert mean_interval(values, EvidenceSettings(seed=7)) == mean_interval(values, EvidenceSettings(seed=7))
    assert mean_interval(values, EvidenceSettings(seed=7)) != mean_interval(values, EvidenceSettings(seed=8))


def test_a_batched_statistic_bootstraps_the_same_resamples_as_its_one_by_one_form():
    """``many`` sees the resamples scipy draws for the plain statistic, all at once: the same interval."""
    values = np.random.default_rng(3).normal(size=25)
    one = BatchedStatistic(lambda idx: float(values[idx].mean()), lambda rows: values[rows].mean(axis=1))
    settings = EvidenceSettings(resamples=300, seed=4)
    batched, plain = interval(25, one, settings), interval(25, lambda idx: float(values[idx].mean()), settings)
    assert batched.effect == plain.effect and batched.n == plain.n == 25
    assert batched.low == pytest.approx(plain.low, abs=1e-12) and batched.high == pytest.approx(plain.high, abs=1e-12)
    assert batched.low < plain.effect < batched.high
    pooled = pooled_interval([(25, one), (20, one)], settings)
    plain_pooled = pooled_interval([(25, one.one), (20, one.one)], settings)
    assert (pooled.low, pooled.high) == pytest.approx((plain_pooled.low, plain_pooled.high), abs=1e-12)


def test_a_pooled_interval_holds_the_spread_between_splits():
    """Two splits whose effects are 0 and 1 on every resample: the effect is their mean and the interval spans
    both, where either split alone gives a zero-width interval."""
    parts = [(10, lambda idx: 0.0), (12, lambda idx: 1.0)]
    pooled = pooled_interval(parts, EvidenceSettings(resamples=200))
    assert (pooled.effect, pooled.low, pooled.high, pooled.n) == (0.5, 0.0, 1.0, 10)
    single = interval(10, lambda idx: 0.0, EvidenceSettings(resamples=200))
    assert single.low == single.high == 0.0
    assert not pooled_interval([], EvidenceSettings()).defined
    assert math.isnan(pooled_interval([(1, lambda idx: 0.5)], EvidenceSettings()).low)


def test_a_mean_is_a_point_when_every_sample_agrees_unless_it_is_bounded():
    """One mean helper for every table: around the mean, no interval from one sample; agreeing samples give a
    point (nothing to resample), or for a bounded metric (a proportion) the exact interval of the agreement."""
    assert mean_interval(np.full(10, 0.5), SETTINGS) == Interval(0.5, 0.5, 0.5, 10)
    assert math.isnan(mean_interval(np.array([1.0]), SETTINGS, bounds=(0.0, 1.0)).low)
    mixed = mean_interval(np.array([0.0, 1.0] * 20), SETTINGS, bounds=(0.0, 1.0))
    assert 0.3 < mixed.low < 0.5 < mixed.high < 0.7
    agreeing = mean_interval(np.ones(20), SETTINGS, bounds=(0.0, 1.0))
    assert agreeing == identical_interval(np.ones(20), math.inf, SETTINGS, bounds=(0.0, 1.0))
    assert 0.8 < agreeing.low < 1.0 == agreeing.high and agreeing.effect == 1.0


def test_a_group_interval_resamples_whole_groups():
    """Units of one group move together: 30 groups of 5 identical units give the interval of the 30 group values
    (not of 150 independent units), with the same resamples."""
    values = np.random.default_rng(1).normal(size=30)
    groups = np.repeat(np.arange(30), 5)
    units = np.repeat(values, 5)
    grouped = group_interval(groups, lambda idx: float(units[idx].mean()), SETTINGS)
    alone = mean_interval(values, SETTINGS)
    assert grouped.n == 30 and (grouped.low, grouped.high) == pytest.approx((alone.low, alone.high))
    narrow = mean_interval(units, SETTINGS)  # as if every unit were its own sample
    assert grouped.high - grouped.low > 1.8 * (narrow.high - narrow.low)


def test_skip_undefined_leaves_out_the_resamples_without_a_value():
    """A statistic undefined on some resamples (one class drawn) makes the interval undefined, unless those
    resamples are left out; undefined on every resample, it stays undefined."""
    labels = np.array([1.0] + [0.0] * 9)

    def share(idx: np.ndarray) -> float:
        return float(labels[idx].mean()) if labels[idx].any() else math.nan

    with pytest.warns(DegenerateDataWarning):  # scipy's own word for a NaN interval
        assert not interval(10, share, SETTINGS).defined
    kept = interval(10, share, SETTINGS, skip_undefined=True)
    assert kept.defined and 0.1 <= kept.low < kept.high and kept.effect == pytest.approx(0.1)
    whole = np.arange(10)
    never = interval(10, lambda idx: 0.0 if np.array_equal(idx, whole) else math.nan, SETTINGS, skip_undefined=True)
    assert never.effect == 0.0 and math.isnan(never.low) and math.isnan(never.high)


# What a hand-made interval is built from: a bootstrap (scipy's or a loop of draws with replacement) and the
# percentiles of its distribution. Only dynheads.analysis.evidence may call them; every table and verdict asks it.
RESAMPLING = {"bootstrap", "integers", "percentile", "nanpercentile", "quantile", "nanquantile"}
HELPER = "analysis/evidence.py"


def resampling_calls(source: str) -> list[str]:
    """``line: name`` of every call (``f(...)`` or ``x.f(...)``) or ``from ... import`` of a ``RESAMPLING`` name."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            if name in RESAMPLING:
                found.append(f"{node.lineno}: {name}")
        elif isinstance(node, ast.ImportFrom):
            found += [f"{node.lineno}: {alias.name}" for alias in node.names if alias.name in RESAMPLING]
    return found


def test_no_interval_is_computed_outside_the_evidence_helper():
    paths = sorted(PACKAGE.rglob("*.py"))
    assert (PACKAGE / HELPER) in paths and len(paths) > 40
    assert resampling_calls((PACKAGE / HELPER).read_text(encoding="utf-8"))  # the check sees the helper's own
    found = [
        f"{path.relative_to(PACKAGE)}:{call}"
        for path in paths
        if path != PACKAGE / HELPER
        for call in resampling_calls(path.read_text(encoding="utf-8"))
    ]
    assert not found, "use dynheads.analysis.evidence (interval, mean_interval, group_interval): " + ", ".join(found)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from scipy.stats import bootstrap", ["1: bootstrap"]),
        ("import scipy.stats as st\nst.bootstrap((x,), f)", ["2: bootstrap"]),
        ("lo, hi = np.percentile(v, [2.5, 97.5])", ["1: percentile"]),
        ("idx = np.random.default_rng(0).integers(0, n, n)", ["1: integers"]),
        ("q = frame['x'].quantile(0.9)", ["1: quantile"]),
        ("rng.choice(names)\nnp.mean(v)", []),
    ],
)
def test_the_check_sees_a_hand_made_bootstrap(source, expected):
    assert resampling_calls(source) == expected
