"""Rules against known truth (issue 59): every deciding rule is powered, keeps its false alarms low and does not call
the paper's own rows "not supported"; the rules that fail are descriptive in the verdicts.

The simulations here are small (a few studies per scenario) and pin what a few studies can show; the rules table at
the standard preset's counts with 40 studies per scenario is docs/results/data/rules-standard.csv (its page:
docs/results/2026-12-rules-known-truth.md), and the declaration in ``report.claims`` must match it.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from dynheads.analysis.evidence import Interval
from dynheads.paper import PAPER_DYNAMISM, PAPER_TABLE4, PAPER_TABLE6
from dynheads.report import claims, rule_studies
from dynheads.report.rule_paper import claim1_shares, paper_checks, paper_reading, paper_rows, table_rows
from dynheads.report.rules import (
    FALSE_ALARM_MAX,
    POWER_MIN,
    check_rules,
    declared_deciding,
    exact_bounds,
    rules_table,
    scenario_names,
    standard_counts,
    write_rules,
)
from dynheads.report.simulated import WorldSpec, fitted_level, simulate_study
from tests.cli_main import run_main

RULES_TABLE = Path(__file__).parents[1] / "docs" / "results" / "data" / "rules-standard.csv"


def test_the_paper_rows_file_holds_the_papers_numbers_with_their_tables():
    rows = paper_rows()
    assert rows["source"].str.match(r"Table \d \(").all()
    for model, row in table_rows("table1").items():
        for column, value in row.items():
            assert value == pytest.approx(PAPER_DYNAMISM[model][column]), (model, column)
    for model, row in table_rows("table5").items():
        assert row["jaccard_static_k50"] == pytest.approx(PAPER_DYNAMISM[model]["jaccard_static_k50"])
    for model, row in table_rows("table4").items():
        assert (row["dynamic_f1"], row["static_f1"]) == (
            PAPER_TABLE4[model]["dynamic"][1],
            PAPER_TABLE4[model]["static"][1],
        )
    assert table_rows("table6")["llama3.1-8b k=20"]["dynamic_f1"] == PAPER_TABLE6[20]["dynamic"][1]


def test_compares_paper_column_says_unreadable_only_where_no_deciding_rule_reads_a_paper_row():
    checks = paper_checks()
    for claim, rules in declared_deciding().items():
        assert not any((claim, rule) in checks for rule in rules), claim  # "not readable" is true of every claim
        assert paper_reading(claim).startswith("not readable")
    rag = checks[(claims.RAG, "rag")]
    assert paper_reading(claims.RAG) == f"{rag.supported} of {rag.rows} rows above 0 (Tables 4 and 6, point estimates)"


def test_the_adjacent_step_rule_fails_the_papers_own_table1_and_the_others_do_not():
    shares = claim1_shares().set_index("model")
    # raw 0.506 and 0.498: at or near the rule under any ceiling
    assert shares.loc["phi4-mini", "adjacent"] >= 0.5 and shares.loc["llama2-13b", "adjacent"] >= 0.5
    checks = paper_checks()
    assert checks[(claims.CLAIM1, "adjacent")].not_supported >= 2
    assert checks[(claims.CLAIM1, "containment")].not_supported == 0
    assert checks[(claims.CLAIM1, "entropy")].not_supported == 0
    # the paper's Llama-3.1-8B row implies about two thirds of D_t in the static top-20 (notes/algorithms.md)
    assert shares.loc["llama3.1-8b", "containment"] == pytest.approx(0.65, abs=0.02)
    rag = checks[(claims.RAG, "rag")]
    assert (rag.rows, rag.supported, rag.not_supported) == (7, 6, 0)


def _claim1(spec: WorldSpec, seed: int) -> dict[str, str]:
    torch.set_num_threads(1)
    run = rule_studies.claim1_study(spec)  # the scenario's own study, as check_rules runs it
    return {rule: status for rule, (status, _) in run(standard_counts(), np.random.default_rng(seed)).items()}


@pytest.mark.parametrize("seed", [0, 1])
def test_a_static_profile_passes_every_share_but_not_the_within_step_ranking(seed):
    """Heads drawn at every step from one fixed profile (a rotation within a fixed pool): the three shares call it
    dynamic; the head predictor cannot rank a step's heads better than the profile, so the deciding rule does not."""
    decided = _claim1(WorldSpec(alpha=0.7), seed)
    assert decided["containment"] == decided["adjacent"] == decided["entropy"] == "supported"
    assert decided["ranking"] != "supported"


def test_step_and_sample_specific_heads_pass_the_within_step_ranking():
    assert _claim1(WorldSpec(modes=12), 0)["ranking"] == "supported"


def _claim1_on_shares(spec: WorldSpec, seed: int) -> dict[str, str]:
    torch.set_num_threads(1)
    run = rule_studies.claim1_study(spec, rule_studies.QA_STEPS)
    return {rule: status for rule, (status, _) in run(standard_counts(), np.random.default_rng(seed)).items()}


def test_on_eq2_shares_the_set_trained_ranking_tells_dynamic_from_static_and_the_share_regressor_cannot():
    """HotpotQA's shape (100 answers of 4 steps, Eq. 2 shares, D_t above a fitted level): a predictor of D_t ranks
    a step's heads better than their frequencies where a context lifts its own heads, and not where the profile is
    fixed; the retired regressor of the shares themselves calls the dynamic world "not supported"."""
    ranking = "ranking" + rule_studies.QA_SETS
    dynamic = _claim1_on_shares(rule_studies.SHARES_DYNAMIC, 0)
    assert dynamic[ranking] == "supported"
    assert dynamic[rule_studies.QA_SHARES_RANKING] == "not supported"
    assert _claim1_on_shares(rule_studies.SHARES_STATIC, 0)[ranking] != "supported"


def test_claim3_on_eq2_shares_the_set_classifier_finds_a_weak_lift_the_share_regressor_calls_not_supported():
    """Claim 3 at HotpotQA's shape: where the hidden state encodes the contexts that lift their heads by 1.5 logits,
    the classifier of D_t beats the frequency and step-index profiles and the regressor of the shares (the study's
    hotpotqa-probe) calls the true claim "not supported"; where the hidden state knows only the step's position,
    the classifier does not call it supported."""
    counts, predictor = standard_counts(), "predictor" + rule_studies.QA_SETS
    weak = rule_studies.claim3_study(rule_studies.SHARES_PLANNING_WEAK, rule_studies.QA_STEPS)
    decided = {rule: status for rule, (status, _) in weak(counts, np.random.default_rng(0)).items()}
    assert decided[predictor] == "supported"
    assert decided["predictor" + rule_studies.QA_SHARES] == "not supported"
    position = rule_studies.claim3_study(rule_studies.SHARES_POSITION_ONLY, rule_studies.QA_STEPS)
    assert position(counts, np.random.default_rng(0))[predictor][0] != "supported"


def test_shares_become_sets_at_the_level_fitted_on_the_fitting_stream():
    spec = WorldSpec(targets="shares", mean_size=10.0, modes=12)
    study = simulate_study(spec, 20, np.random.default_rng(0), steps=8, fit_samples=20)
    assert study.level is not None and 0 < study.level < 1
    hidden, shares = study.samples[0]
    assert shares.dtype == np.float32 and shares.shape == (8, 270) and ((shares > 0) & (shares < 1)).all()
    sizes = np.concatenate([sets.reshape(len(sets), -1).sum(axis=1) for sets in study.dynamic_sets()])
    assert 7 < sizes.mean() < 13  # the fitted level gives the evaluated stream about mean_size heads per step too
    assert fitted_level([np.arange(100, dtype=np.float32).reshape(1, 100)], 10.0) == 89.0  # 10 heads above it


def test_simulated_studies_fit_their_static_list_apart_from_the_evaluated_samples():
    study = simulate_study(WorldSpec(), 5, np.random.default_rng(0), steps=6, fit_samples=3)
    assert len(study.samples) == 5 and study.shape == (30, 9)
    hidden, sets = study.samples[0]
    assert hidden.shape == (6, 32) and sets.shape == (6, 270) and sets.dtype == bool
    assert len(study.static_ranking) == len(set(study.static_ranking)) > 0


def test_claim2_and_rag_rules_at_the_standard_counts():
    checks = {(c.claim, c.rule): c for c in check_rules(60, claims_to_check=[claims.CLAIM2, claims.RAG])}
    for arm in claims.IRREPLACEABILITY_CONTROLS:
        rule = checks[(claims.CLAIM2, f"dynamic - {arm}")]
        assert rule.n == 40 and rule.power >= POWER_MIN and rule.false_alarm <= FALSE_ALARM_MAX and rule.decides
    rag = checks[(claims.RAG, "rag")]
    assert rag.n == 100 and rag.power < 0.5 and not rag.decides  # the paper's effects are below what n = 100 finds


def test_the_write_contrast_rule_at_the_write_studys_count():
    """Beyond the paper: W_t minus as many Eq. 1 heads, at the write study's 34 samples, finds a true 0.5-nat
    difference and rarely calls one that is not there, heavy-tailed harms included."""
    (rule,) = check_rules(60, claims_to_check=[claims.WRITE])
    assert (rule.claim, rule.rule, rule.n) == (claims.WRITE, claims.WRITE_DECIDING[0], rule_studies.WRITE_SAMPLES)
    assert rule.power >= POWER_MIN and rule.false_alarm <= FALSE_ALARM_MAX and rule.decides
    assert "heavy-tailed" in rule.note


def test_the_write_contrast_reads_its_interval_against_claim2s_margin_and_the_floor():
    floor = claims.EvidenceSettings().floor
    assert claims.write_contrast(Interval(0.74, 0.67, 0.80, 34)).decide(floor)[0] == "supported"
    assert claims.write_contrast(Interval(0.12, 0.05, 0.20, 34)).decide(floor)[0] == "inconclusive"  # margin 0.1
    assert claims.write_contrast(Interval(2.0, 1.8, 2.2, 29)).decide(floor)[0] == "inconclusive"  # below 30
    assert claims.write_contrast(Interval(-0.5, -0.7, -0.3, 34)).decide(floor)[0] == "not supported"


def test_the_declared_deciding_rules_are_those_the_rules_table_lets_decide():
    table = pd.read_csv(RULES_TABLE)
    deciding = {
        claim: tuple(group.loc[group["decides"], "rule"]) for claim, group in table.groupby("claim", sort=False)
    }
    for claim, rules in declared_deciding().items():
        assert set(rules) == set(deciding.get(claim, ())), claim
        for rule in rules:
            row = table[(table["claim"] == claim) & (table["rule"] == rule)].iloc[0]
            assert row["power"] >= POWER_MIN and row["false_alarm"] <= FALSE_ALARM_MAX
            assert row["paper_not_supported"] == 0
    claim1 = table[table["claim"] == claims.CLAIM1].set_index("rule")
    assert not claim1.loc[["containment", "adjacent", "entropy"], "decides"].any()


def test_dynheads_rules_writes_rules_csv_and_prints_the_table(tmp_path, capsys, monkeypatch):
    result = run_main(capsys, monkeypatch, "rules", "--out", tmp_path, "--studies", "3", "--claim", "rag")
    assert result.code == 0, result.stderr
    table = pd.read_csv(tmp_path / "rules.csv")
    assert {"claim", "rule", "n", "power", "false_alarm", "paper_rows", "paper_supported", "decides"} <= set(table)
    assert "| Dynamic RAG (dynamic beats static) | rag | 100 |" in result.stdout
    assert (tmp_path / "rules.md").read_text().startswith("# Rules against known truth")
    bad = run_main(capsys, monkeypatch, "rules", "--out", tmp_path, "--claim", "7")
    assert bad.code == 2 and "unknown claim '7'" in bad.stderr and "1, 2, 3, rag, write" in bad.stderr
    two = run_main(capsys, monkeypatch, "rules", "--out", tmp_path / "two", "--studies", "3", "--claim", "2")
    assert two.code == 0, two.stderr
    assert set(pd.read_csv(tmp_path / "two" / "rules.csv")["claim"]) == {claims.CLAIM2}


def test_write_rules_marks_a_rule_descriptive_in_the_markdown(tmp_path):
    checks = check_rules(3, claims_to_check=[claims.RAG])
    write_rules(tmp_path, checks, studies=3, seed=0)
    assert "no (descriptive)" in (tmp_path / "rules.md").read_text()


def test_exact_bounds_are_clopper_pearsons():
    # 0 of n: the upper end solves (1 - p)^n = 0.025; n of n: the lower end solves p^n = 0.025
    assert exact_bounds(0, 40) == pytest.approx((0.0, 1 - 0.025 ** (1 / 40)))
    assert exact_bounds(40, 40) == pytest.approx((0.025 ** (1 / 40), 1.0))
    low, high = exact_bounds(9, 200)
    assert low < 9 / 200 < high and high == pytest.approx(0.0836, abs=1e-3)


def test_the_rules_table_carries_the_exact_bounds_of_its_counts():
    table = pd.read_csv(RULES_TABLE)
    for row in table.itertuples():
        if not np.isnan(row.power):
            assert row.power_low == pytest.approx(exact_bounds(round(row.power * row.studies), row.studies)[0])
        if not np.isnan(row.false_alarm):
            high = exact_bounds(round(row.false_alarm * row.studies), row.studies)[1]
            assert row.false_alarm_high == pytest.approx(high)
    # 40 studies cannot show a false alarm below 0.05: no count of 40 has its upper end there
    assert (table.loc[table["studies"] == 40, "false_alarm_high"] > FALSE_ALARM_MAX).all()


def test_a_scenario_run_alone_draws_the_studies_it_draws_in_the_full_run():
    alone = check_rules(5, claims_to_check=[claims.RAG], scenarios=["no difference"])
    full = {c.rule: c for c in check_rules(5, claims_to_check=[claims.RAG])}
    assert [c.rule for c in alone] == ["rag"] and np.isnan(alone[0].power)  # no true scenario ran
    assert alone[0].false_alarm == full["rag"].false_alarm
    assert alone[0].false_alarm_high == full["rag"].false_alarm_high
    assert rules_table(alone).rows[0][-1] == "not judged: its true and false scenarios did not both run"
    assert rules_table(list(full.values())).rows[0][-1] in ("yes", "no (descriptive)")


def test_dynheads_rules_refuses_an_unknown_scenario_naming_the_known_ones(tmp_path, capsys, monkeypatch):
    result = run_main(capsys, monkeypatch, "rules", "--out", tmp_path, "--scenario", "no such world")
    assert result.code != 0 and "no scenario 'no such world'" in result.stderr
    assert scenario_names()[0] in result.stderr and "Traceback" not in result.stderr


def _margin_script():
    path = Path(__file__).parents[1] / "scripts" / "set_classifier_margin.py"
    spec = importlib.util.spec_from_file_location("set_classifier_margin", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_set_classifier_margin_data_is_what_its_script_draws_and_the_margin_keeps_its_false_alarms(tmp_path):
    """``claims.SET_PROBE_MARGIN`` rests on docs/results/data/set-classifier-margin-*.csv: the script's first studies
    of a scenario are the committed rows (the data is what the script draws; that it draws the rules' studies was
    checked by count, 9 of 200 no-signal studies at 0 as ``dynheads rules``), and read at the margin the committed
    draws give what the page says: seed 1 (chose) at most 2.5 % false alarms, seed 0 (tests) 0 and 2."""
    torch.set_num_threads(1)
    script = _margin_script()
    assert all(name in scenario_names() for name, _ in script.WORLDS.values())  # the script's worlds are the rules'
    data = Path(__file__).parents[1] / "docs" / "results" / "data"
    script.draw(["no signal"], 0, 2, tmp_path / "drawn.csv")
    drawn = pd.read_csv(tmp_path / "drawn.csv")
    committed = pd.read_csv(data / "set-classifier-margin-seed0-test.csv")
    first = committed[committed["scenario"] == "no signal"].head(2)
    for column in ("effect", "low", "high"):
        assert drawn[column].to_numpy() == pytest.approx(first[column].to_numpy(), abs=1e-9), column
    margin = claims.SET_PROBE_MARGIN

    def supported(frame: pd.DataFrame, scenario: str, at: float) -> int:
        rows = frame[frame["scenario"] == scenario]
        return sum(script.decision(row, at) == "supported" for row in rows.itertuples())

    # the smallest multiple of 0.0025 at which each false scenario stays at or below 2.5 % on seed 1
    calibration = pd.read_csv(data / "set-classifier-margin-seed1-calibration.csv")
    false, limit = ("no signal", "position only"), 0.025 * 200
    assert all(supported(calibration, scenario, margin) <= limit for scenario in false)
    assert any(supported(calibration, scenario, margin - 0.0025) > limit for scenario in false)
    assert (supported(committed, "no signal", margin), supported(committed, "position only", margin)) == (0, 2)
    assert supported(committed, "lift 1.5", margin) == 192 and supported(committed, "lift 2.5", margin) == 200
