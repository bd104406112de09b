"""Intervals and three-way decisions on data with a known answer."""

from __future__ import annotations

import math

import numpy as np
import pytest

from dynheads.analysis.evidence import (
    UNDEFINED,
    Effect,
    EvidenceSettings,
    Interval,
    combine,
    interval,
    mean_interval,
    paired_difference,
    pooled_interval,
)

SETTINGS = EvidenceSettings()


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
    assert good.line() == "a 0.500 [0.400, 0.600] (n=40), rule > 0.1"


def test_the_seed_makes_intervals_reproducible():
    values = np.random.default_rng(4).normal(size=30)
    assert mean_interval(values, EvidenceSettings(seed=7)) == mean_interval(values, EvidenceSettings(seed=7))
    assert mean_interval(values, EvidenceSettings(seed=7)) != mean_interval(values, EvidenceSettings(seed=8))


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
