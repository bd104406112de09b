"""Printed proportions have exact intervals of non-zero width; Holm's adjustment; KV cells whose full cache is at
chance are not evidence (issue 59, items 6 and 7)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from dynheads.analysis.evidence import (
    EvidenceSettings,
    above_chance_p_value,
    fraction_interval,
    holm_differences,
    holm_rejections,
    proportion_interval,
)
from dynheads.analysis.hallucination import paired_win_rate
from dynheads.experiments.rerank import RerankConfig
from dynheads.views.kv_tables import AT_CHANCE, full_cache_evidence, write_policy_tables
from dynheads.views.rerank_tables import rerank_holm

SETTINGS = EvidenceSettings()
PRINTED = re.compile(r"(-?\d+\.\d+) \[(-?\d+\.\d+), (-?\d+\.\d+)\]")  # "1.000 [0.96, 1.00]"


def printed_intervals(text: str) -> list[tuple[float, float, float]]:
    return [tuple(float(v) for v in match) for match in PRINTED.findall(text)]


# ---- exact proportions -------------------------------------------------------------------------------------------
def test_the_exact_interval_of_a_proportion():
    all_right = proportion_interval(100, 100, SETTINGS)
    assert all_right.effect == 1.0 and all_right.low == pytest.approx(0.9638, abs=1e-4) and all_right.high == 1.0
    assert proportion_interval(0, 100, SETTINGS).high == pytest.approx(1 - 0.9638, abs=1e-4)
    one_right, one_wrong = proportion_interval(1, 1, SETTINGS), proportion_interval(0, 1, SETTINGS)
    assert (one_right.low, one_right.high) == pytest.approx((0.025, 1.0))
    assert (one_wrong.low, one_wrong.high) == pytest.approx((0.0, 0.975))
    assert not proportion_interval(0, 0, SETTINGS).defined
    with pytest.raises(ValueError):
        proportion_interval(3, 2, SETTINGS)


def test_a_fraction_is_exact_for_0_1_values_and_never_of_zero_width():
    assert fraction_interval([1.0] * 100, SETTINGS) == proportion_interval(100, 100, SETTINGS)
    assert fraction_interval([1.0, 0.0, np.nan], SETTINGS) == proportion_interval(1, 2, SETTINGS)  # NaN left out
    for values in ([0.5] * 40, [0.5], [0.25, 0.75] * 10, [1.0, 0.5]):  # not 0/1: bootstrap, bounded to [0, 1]
        found = fraction_interval(values, SETTINGS)
        assert 0.0 <= found.low < found.high <= 1.0
    with pytest.raises(ValueError):
        fraction_interval([1.5], SETTINGS)


def test_halueval_win_rates_all_won_or_all_lost_have_width():
    for n in (2, 12, 47):
        labels = np.tile([1, 0], n)
        groups = np.repeat(np.arange(n), 2)
        for hallucinated_scores_higher in (True, False):
            scores = np.tile([1.0, 0.0] if hallucinated_scores_higher else [0.0, 1.0], n)
            found = paired_win_rate(labels, scores, groups, SETTINGS)
            assert found.n == n and found.low < found.high
            assert found.effect == (1.0 if hallucinated_scores_higher else 0.0)


# ---- KV tables ---------------------------------------------------------------------------------------------------
def kv_records(policies: dict[str, list[float]]) -> list[dict]:
    """KV records: per (policy, budget) the first metric of each sample (one sample per entry)."""
    records = []
    for key, scores in policies.items():
        policy, budget = key.split("@") if "@" in key else (key, None)
        for index, score in enumerate(scores):
            records.append(
                {
                    "grid_sample_id": f"s{index}",
                    "policy": policy,
                    "budget": None if budget is None else float(budget),
                    "metrics": {"accuracy": score, "rouge_l": score, "string_match": score, "em": score, "f1": score},
                    "mean_kv_heads": 4.0,
                    "shortfall": 0.0,
                    "kv_fraction": {"full": 1.0, "none": 0.05}.get(policy, 0.3),
                    "kv_bytes": 1e6,
                    "offloaded_bytes": 0.0,
                    "moved_bytes_per_step": 0.0,
                    "moved_new_bytes_per_step": 0.0,
                    "context_tokens": 500,
                    "depth": 0.5,
                    "generated": "x",
                }
            )
    return records


def kv_manifest(task: str = "niah", data: str | None = None) -> dict:
    return {
        "seed": 0,
        "model": {"name": "m"},
        "config": {"task": task, "data": data, "sink": 4, "recent": 64},
        "gqa_rule": "one KV head per query head",
        "heads_per_budget": {},
        "probe_threshold": None,
    }


@pytest.mark.parametrize("n", [1, 100])
def test_kv_accuracy_at_n_1_and_100_is_exact_and_has_width(tmp_path, n):
    records = kv_records({"full": [1.0] * n, "none": [0.0] * n, "static@0.5": [1.0] * n})
    table = write_policy_tables(tmp_path, records, kv_manifest())
    assert (table["accuracy_low"] < table["accuracy_high"]).all()
    full = table.set_index("policy").loc["full"]
    assert full["accuracy_low"] == pytest.approx(proportion_interval(n, n, SETTINGS).low)
    printed = printed_intervals((tmp_path / "summary.md").read_text())
    assert len(printed) == 3 and all(low < high for _, low, high in printed)
    assert "nan" not in (tmp_path / "summary.md").read_text()


def test_a_kv_cell_whose_full_cache_is_at_chance_is_not_evidence(tmp_path):
    vt = kv_manifest("variable_tracking", "variable_tracking:hops=1,chains=3")
    # the 2k variable-tracking cell: full 15 of 30 against chance 1/3 (one-sided exact p = 0.043, not below 0.025)
    records = kv_records({"full": [1.0] * 15 + [0.0] * 15, "none": [0.0] * 30, "static@0.25": [1.0] * 16 + [0.0] * 14})
    table = write_policy_tables(tmp_path / "vt", records, vt)
    summary = (tmp_path / "vt" / "summary.md").read_text()
    assert "Full cache at chance: not evidence" in summary and "p = 0.043" in summary
    assert not table["full_cache_evidence"].any() and table["pareto_front"].any()
    assert "] *" not in summary  # no row is marked on the front
    # 25 of 30 is far above 1/3: the table is evidence and marks its front
    records = kv_records({"full": [1.0] * 25 + [0.0] * 5, "none": [0.0] * 30, "static@0.25": [1.0] * 30})
    table = write_policy_tables(tmp_path / "vt25", records, vt)
    assert table["full_cache_evidence"].all() and "] *" in (tmp_path / "vt25" / "summary.md").read_text()
    # NIAH's chance is 0: a full cache that never finds the needle is at chance; a task without a chance says so
    assert not full_cache_evidence(np.zeros(30), 0.0, SETTINGS).evidence
    assert full_cache_evidence(np.r_[np.ones(3), np.zeros(27)], 0.0, SETTINGS).evidence
    unknown = full_cache_evidence(np.ones(30), None, SETTINGS)
    assert not unknown.evidence and "chance is not known" in unknown.reason
    assert AT_CHANCE == "full cache at chance: not evidence"


def test_the_one_sided_exact_test_against_chance():
    assert above_chance_p_value(15, 30, 1 / 3) == pytest.approx(0.0435, abs=1e-3)
    assert above_chance_p_value(13, 30, 1 / 3) == pytest.approx(0.166, abs=1e-3)
    # below (1 - 0.95) / 2 exactly when the exact two-sided 95 % interval lies above chance
    for successes in range(31):
        low = proportion_interval(successes, 30, SETTINGS).low
        assert (above_chance_p_value(successes, 30, 1 / 3) < 0.025) == (low > 1 / 3)


# ---- Holm --------------------------------------------------------------------------------------------------------
def test_holm_on_the_textbook_example():
    # sorted: 0.005 <= 0.05/4, 0.01 <= 0.05/3, 0.03 > 0.05/2: stop; 0.04 is not rejected although <= 0.05/1
    assert holm_rejections([0.01, 0.04, 0.03, 0.005], 0.05) == [True, False, False, True]
    assert holm_rejections([0.2, 0.3], 0.05) == [False, False]
    assert holm_rejections([0.01, 0.02], 0.05) == [True, True]


def test_holm_on_differences_steps_down_and_widens_the_intervals():
    rng = np.random.default_rng(0)
    family = {
        "large": rng.normal(0.5, 1.0, 200),
        "none": rng.normal(0.0, 1.0, 200),
        "small": rng.normal(0.16, 1.0, 200),
    }
    decided = holm_differences(family, SETTINGS)
    assert decided["large"].rejected and decided["large"].confidence == pytest.approx(1 - 0.05 / 3)
    assert not decided["none"].rejected and decided["none"].adjusted.low < 0 < decided["none"].adjusted.high
    unadjusted = holm_differences({"small": family["small"]}, SETTINGS)["small"]
    assert unadjusted.confidence == pytest.approx(0.95)
    adjusted = decided["small"].adjusted
    assert adjusted.high - adjusted.low > unadjusted.adjusted.high - unadjusted.adjusted.low


def test_rerank_tables_adjust_their_family():
    rng = np.random.default_rng(1)
    better = np.clip(rng.normal(0.3, 0.2, 100), -1, 1)
    marginal = np.r_[np.full(51, 1.0), np.full(49, -1.0)]  # mean +0.02: its interval holds 0
    family = {("mix", m): better for m in ("recall@2", "mrr")} | {("rrf", "recall@2"): marginal}
    decided = rerank_holm(family, RerankConfig(bootstrap=500), "holm-test")
    assert decided["mix", "recall@2"].rejected and decided["mix", "mrr"].rejected
    assert not decided["rrf", "recall@2"].rejected
    assert decided["rrf", "recall@2"].text().endswith("n.s.") and decided["mix", "mrr"].text().endswith("≠ 0")
