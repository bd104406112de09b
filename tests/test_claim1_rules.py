"""Claim 1's rules can come out both ways at every set size (issue 32, item 3).

Constructed dynamic sets on a model of 16 x 24 = 384 heads, 30 samples of 8 steps, at mean |D_t| = 5, 25 and 70:
random sets of the size (every rule supports the claim), the static list of the step's size at every step (every
rule decides against it) and one fixed set outside the static list (static containment supports, the two
dynamism rules do not). The raw statistics the sizes bound (entropy >= ln m, containment in the top-20 <= 20/m)
would decide the two last traces the same way as the first at m = 25 and 70; the shares above chance do not.
Since issue 59 the three shares are descriptive (``report.rules``: a fixed static profile passes them too) and
the verdict is decided by the head predictor's within-step ranking (tests/test_rules.py).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from dynheads.analysis.chance import chance_entropy, expected_jaccard, share_above_chance, static_profile_jaccard
from dynheads.analysis.dynamism import dynamism_stats, per_sample_dynamism
from dynheads.analysis.evidence import EvidenceSettings
from dynheads.report import claims

LAYERS, HEADS, SAMPLES, STEPS = 16, 24, 30, 8
TOTAL = LAYERS * HEADS
RANKING = [(layer, head) for layer in range(LAYERS) for head in range(HEADS)]  # static list, best first
EVIDENCE = EvidenceSettings(resamples=500)
RULES = ("static containment", "adjacent Jaccard", "entropy")


def _trace(kind: str, size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``random``: a random set of ``size`` heads at every step; ``static``: the static top-``size`` at every step;
    ``fixed``: the same ``size`` heads from the bottom of the static list at every step."""
    samples = []
    for _ in range(SAMPLES):
        steps = np.zeros((STEPS, TOTAL), dtype=bool)
        for t in range(STEPS):
            if kind == "random":
                steps[t, rng.choice(TOTAL, size, replace=False)] = True
            elif kind == "static":
                steps[t, :size] = True
            else:
                steps[t, TOTAL - size :] = True
        samples.append(steps.reshape(STEPS, LAYERS, HEADS))
    return samples


def _decisions(kind: str, size: int) -> tuple[list[str], claims.Verdict]:
    sets = _trace(kind, size, np.random.default_rng(size))
    stats = dynamism_stats(sets, RANKING)
    assert stats.mean_size == size
    data = {"stats": stats.to_dict(), "per_sample": per_sample_dynamism(sets, RANKING), "static_kind": "copy"}
    verdict = claims.dynamism_verdict(data, "NIAH", EVIDENCE)
    shares = claims.claim1_effects(data, EVIDENCE, None)
    return [shares[rule].decide(EVIDENCE.floor)[0] for rule in ("containment", "adjacent", "entropy")], verdict


@pytest.mark.parametrize("size", [5, 25, 70])
def test_every_rule_supports_the_claim_on_random_sets_of_any_size(size):
    decisions, verdict = _decisions("random", size)
    assert decisions == ["supported"] * 3, verdict.sentence()
    # random sets at every step are one uniform static profile, and the shares call them "supported": since
    # issue 59 they are descriptive (report.rules: every static profile passes them), and the verdict waits for
    # the head predictor's within-step ranking, which these sets do not have
    assert [e.decide(EVIDENCE.floor)[0] for e in verdict.descriptive] == decisions
    assert verdict.status == "inconclusive" and "no head predictor" in verdict.reason
    assert all(effect.interval.n == SAMPLES for effect in verdict.descriptive)


@pytest.mark.parametrize("size", [5, 25, 70])
def test_every_rule_decides_against_the_claim_when_the_static_list_is_used_at_every_step(size):
    decisions, verdict = _decisions("static", size)
    assert decisions == ["not supported"] * 3, verdict.sentence()
    stats = verdict.numbers
    # what the old rules read: entropy at its floor ln m is above ln 20 once m > 20, containment in the top-20 is
    # 20/m: both would have "supported" the claim on this trace at m = 25 and 70
    assert stats["entropy"] == pytest.approx(math.log(size))
    assert stats["containment_k20"] == pytest.approx(min(1.0, 20 / size))


@pytest.mark.parametrize("size", [5, 25, 70])
def test_a_fixed_set_outside_the_static_list_fails_only_the_dynamism_rules(size):
    decisions, verdict = _decisions("fixed", size)
    assert decisions == ["supported", "not supported", "not supported"], verdict.sentence()


def test_the_verdict_prints_every_statistic_beside_its_chance_level():
    _, verdict = _decisions("random", 25)
    for words in (
        "Jaccard w/ static top-20",
        "containment in the top-20",
        "size-matched Jaccard",
        "adjacent-step Jaccard",
        "step t of another sample",
        "entropy",
    ):
        assert f"{words} " in verdict.reason
    assert verdict.reason.count("chance") >= 5 and "ceiling" in verdict.reason
    numbers = verdict.numbers
    assert numbers["containment_k20_chance"] == pytest.approx(20 / TOTAL)
    assert numbers["matched_jaccard_chance"] == pytest.approx(expected_jaccard(25, 25, TOTAL))
    # random sets score their chance level on the raw statistics too
    assert numbers["adjacent_jaccard"] == pytest.approx(numbers["adjacent_jaccard_chance"], abs=0.01)
    assert numbers["cross_sample_jaccard"] == pytest.approx(numbers["adjacent_jaccard_chance"], abs=0.01)


def test_expected_jaccard_matches_a_simulation_and_its_limits():
    rng = np.random.default_rng(0)
    fixed = np.zeros(TOTAL, dtype=bool)
    fixed[:20] = True
    simulated = []
    for _ in range(4000):
        drawn = np.zeros(TOTAL, dtype=bool)
        drawn[rng.choice(TOTAL, 30, replace=False)] = True
        simulated.append((drawn & fixed).sum() / (drawn | fixed).sum())
    assert expected_jaccard(30, 20, TOTAL) == pytest.approx(np.mean(simulated), abs=0.002)
    assert expected_jaccard(TOTAL, 20, TOTAL) == pytest.approx(20 / TOTAL)  # every head drawn
    assert math.isnan(expected_jaccard(0, 0, TOTAL))


def test_chance_entropy_and_the_share_above_chance():
    # one head per step of 4 heads over many steps: near ln 4; a step of every head: exactly ln 4
    assert chance_entropy(np.ones(4000, dtype=int), 4) == pytest.approx(math.log(4), abs=0.01)
    assert chance_entropy(np.full(3, 4), 4) == pytest.approx(math.log(4))
    assert math.isnan(chance_entropy(np.zeros(3, dtype=int), 4))
    shares = share_above_chance(np.array([0.1, 0.55, 1.0]), np.full(3, 0.1), np.ones(3))
    assert shares == pytest.approx([0.0, 0.5, 1.0])
    assert math.isnan(share_above_chance(np.array(0.0), np.array(0.0), np.array(0.0)))


def test_the_static_profile_null_of_adjacent_turnover():
    """Issue 59: adjacent-step turnover beside what a rotation within a fixed pool gives (each step draws its own
    number of heads from the heads' frequencies): a profile on exactly k heads drawn k at a time never turns over;
    a uniform profile gives random sets' Jaccard; one empty set scores 0, as Table 1 counts it."""
    counts = np.zeros(TOTAL)
    counts[:6] = 1.0
    assert static_profile_jaccard(np.full(50, 6), np.full(50, 6), counts) == pytest.approx(1.0)
    uniform = static_profile_jaccard(np.full(400, 10), np.full(400, 10), np.ones(TOTAL))
    assert uniform == pytest.approx(expected_jaccard(10, 10, TOTAL), abs=0.01)
    assert static_profile_jaccard(np.array([6, 0]), np.array([0, 0]), counts) == 0.0
    assert math.isnan(static_profile_jaccard(np.zeros(3, int), np.zeros(3, int), counts))
    sets = _trace("static", 5, np.random.default_rng(0))
    stats = dynamism_stats(sets, RANKING)  # the static list at every step: no turnover, and the null says so
    assert stats.adjacent_jaccard == stats.static_profile_jaccard == pytest.approx(1.0)
    assert "under a static profile" in claims.chance_note(stats.to_dict())
