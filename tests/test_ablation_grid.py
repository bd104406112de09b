"""The ablation grid and progressive ablation: records, resume, matched counts, files, plots, one-line errors.

A tiny random model rarely copies from the needle, so its dynamic sets would be empty and every count 0. The
``fake_dynamic_sets`` fixture replaces Eq. 1 inside the decoder by a deterministic rule that picks 0-3 heads from
the predicted token: these tests check the experiment's plumbing; tests/test_ablation.py checks the decoder.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from dynheads.ablation import cascade as ablation
from dynheads.errors import DynheadsError
from dynheads.experiments.ablation import AblationConfig, ProgressiveConfig, run_ablation, run_progressive
from dynheads.plots.ablation import heatmap_figure, plot_heatmaps, plot_progressive
from dynheads.report import claims
from dynheads.tables import read_summaries
from dynheads.views.ablation_tables import masking_numbers

SAMPLES = ["analysis-len200-depth0-run0", "analysis-len200-depth1-run0"]
STRATEGIES = ["none", "dynamic", "static", "random"]


@pytest.fixture
def fake_dynamic_sets(monkeypatch):
    heads = [(2, 1), (0, 3), (1, 0)]
    monkeypatch.setattr(ablation, "_dynamic_heads", lambda session, step, predicted, settings: heads[: predicted % 4])


def ranked_file(tmp_path, layers: int, heads: int):
    """A ranked head list naming every head of the model, last layer first."""
    path = tmp_path / "static.json"
    path.write_text(json.dumps([f"{layer}-{head}" for layer in reversed(range(layers)) for head in range(heads)]))
    return str(path)


def grid_config(model_dir, static, **overrides) -> AblationConfig:
    values = dict(
        model=str(model_dir), lengths=(200,), depths=(0.0, 1.0), runs=1, max_new_tokens=3, seed=3, static=static
    )
    values.update(doses=(), mode="zero")  # the matched grid, zero-masked
    return AblationConfig(**{**values, **overrides})


def progressive_config(model_dir, tmp_path, **overrides) -> ProgressiveConfig:
    values = dict(ks=(0, 1, 2), lengths=(200,), depths=(0.5,), runs=2, max_new_tokens=3, top_static=5)
    return ProgressiveConfig(model=str(model_dir), static=ranked_file(tmp_path, 3, 4), **{**values, **overrides})


def test_grid_records_matched_counts_cells_and_resume(tiny_model_dir, tiny_lm, tmp_path, fake_dynamic_sets):
    config = grid_config(tiny_model_dir, ranked_file(tmp_path, 3, 4), matching="mean")
    run = run_ablation(config, tmp_path / "grid", lm=tiny_lm, progress=False)
    records = {r["sample_id"]: r for r in run.records()}
    assert set(records) == {f"{sample}-{strategy}" for sample in SAMPLES for strategy in STRATEGIES}
    for sample in SAMPLES:
        dynamic = records[f"{sample}-dynamic"]
        assert dynamic["grid_sample_id"] == sample and dynamic["context_tokens"] == 200
        assert set(dynamic["metrics"]) >= {"accuracy", "rouge_l"}
        assert dynamic["masked_counts"] == dynamic["dynamic_counts"] and len(dynamic["masked_counts"]) == 3
        assert dynamic["mean_dynamic"] == pytest.approx(np.mean(dynamic["dynamic_counts"]))
        count = round(np.mean(dynamic["dynamic_counts"]))
        assert dynamic["matched_count"] == count
        for strategy in ("static", "random"):
            assert records[f"{sample}-{strategy}"]["matched_count"] == count
            assert records[f"{sample}-{strategy}"]["masked_counts"] == [count] * 3
        assert records[f"{sample}-none"]["masked_counts"] == [0, 0, 0]
    assert any(records[f"{sample}-dynamic"]["matched_count"] for sample in SAMPLES)  # the check above is not 0 == 0

    cells = pd.read_csv(tmp_path / "grid" / "cells.csv")
    assert len(cells) == len(STRATEGIES) * 2 and (cells["samples"] == 1).all()
    assert set(cells["strategy"]) == set(STRATEGIES) and set(cells["depth"]) == {0.0, 1.0}
    assert "| dynamic |" in (tmp_path / "grid" / "summary.md").read_text()
    for metric in ("accuracy", "rouge_l"):
        assert (tmp_path / "grid" / "plots" / f"ablation-{metric}.png").read_bytes()[:4] == b"\x89PNG"
    manifest = json.loads((tmp_path / "grid" / "manifest.json").read_text())
    assert manifest["kind"] == "ablation" and manifest["strategies_run"] == STRATEGIES

    # Crash simulation: the static record never got written. Only it is recomputed, identically, with the
    # count read back from the saved dynamic record.
    run.record_path(f"{SAMPLES[1]}-static").unlink()
    redone = []
    run_ablation(config, tmp_path / "grid", lm=tiny_lm, progress=False, on_record=redone.append)
    assert [r["sample_id"] for r in redone] == [f"{SAMPLES[1]}-static"]
    assert redone[0] == records[f"{SAMPLES[1]}-static"]
    assert not list((tmp_path / "grid").rglob("*.tmp"))


def test_bad_settings_are_refused_before_any_work(tiny_model_dir, tiny_lm, tmp_path):
    missing = tmp_path / "static.json"
    missing.write_text('["5-0", "0-1"]')  # the tiny model has 3 layers
    with pytest.raises(DynheadsError, match="does not have: L5-H0"):
        run_ablation(grid_config(tiny_model_dir, str(missing)), tmp_path / "a", lm=tiny_lm, progress=False)
    cases = [
        (dict(strategies=("static",)), "needs a static head list"),
        (dict(strategies=("fixed",)), "fixed strategy and --heads go together"),
        (dict(strategies=("fixed",), heads=("3-0",)), "does not have: L3-H0"),
        (dict(mode="half"), "unknown masking mode 'half'"),
    ]
    for overrides, message in cases:
        with pytest.raises(DynheadsError, match=message):
            run_ablation(grid_config(tiny_model_dir, None, **overrides), tmp_path / "b", lm=tiny_lm, progress=False)
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()


def test_fixed_strategy_masks_its_heads_at_every_step(tiny_model_dir, tiny_lm, tmp_path):
    config = grid_config(tiny_model_dir, None, depths=(0.5,), strategies=("fixed",), heads=("2-3", "0-1"))
    records = {r["strategy"]: r for r in run_ablation(config, tmp_path / "fixed", lm=tiny_lm, progress=False).records()}
    assert set(records) == {"none", "fixed"}
    assert set(records["fixed"]["masked_counts"]) == {2}


def test_progressive_summary_has_one_row_per_k(tiny_model_dir, tiny_lm, tmp_path, fake_dynamic_sets):
    config = progressive_config(tiny_model_dir, tmp_path, ks=(2, 0, 1), runs=1)
    run = run_progressive(config, tmp_path / "prog", lm=tiny_lm, progress=False)
    assert len(run.records()) == 3
    table = pd.read_csv(tmp_path / "prog" / "progressive.csv")
    assert list(table["k"]) == [0, 1, 2] and (table["samples"] == 1).all()
    assert set(table.columns) >= {"static_overlap", "compensated", "accuracy", "rouge_l"}
    for record in run.records():
        assert [min(n, record["k"]) for n in record["dynamic_counts"]] == record["masked_counts"]
        assert record["max_compensated"] == max(record["compensated_counts"], default=0)
        assert record["max_static_overlap"] == max(record["static_overlap"], default=0)
    assert len(json.loads((tmp_path / "prog" / "manifest.json").read_text())["static_top"]) == 5
    assert (tmp_path / "prog" / "plots" / "progressive.png").is_file()


def test_heat_maps_share_one_colour_scale_and_fade_by_count(tmp_path):
    index, columns = pd.Index([0.0, 0.5, 1.0], name="depth"), pd.Index([500, 1000], name="length")
    panels = {
        "dynamic": pd.DataFrame([[0.0, 0.1], [0.2, 0.0], [0.0, 0.3]], index, columns),
        "static": pd.DataFrame([[1.0, 0.9], [0.8, 1.0], [1.0, 0.7]], index, columns),
    }
    figure = heatmap_figure(panels, label="accuracy")
    images = [image for ax in figure.axes for image in ax.get_images()]
    assert len(images) == 2 and all(image.get_clim() == (0.0, 1.0) for image in images)
    assert len(figure.axes[0].texts) == 6  # every cell annotated

    counts = {name: pd.DataFrame([[2, 1], [0, 2], [2, 2]], index, columns) for name in panels}
    figure = heatmap_figure(panels, label="F1", counts=counts)
    image = figure.axes[0].get_images()[0]
    assert np.ma.getmaskarray(image.get_array())[1, 0] and image.get_alpha()[0, 1] == 0.5
    assert len(figure.axes[0].texts) == 5  # the empty cell stays blank

    assert plot_heatmaps(panels, tmp_path / "h.png", label="accuracy").read_bytes()[:4] == b"\x89PNG"
    table = pd.DataFrame({"k": [0, 5], "static_overlap": [0.0, 2.5], "accuracy": [1.0, 0.4], "rouge_l": [1.0, 0.6]})
    assert plot_progressive(table, tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_bad_strategy_gets_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "dynheads", "ablate", "--strategies", "dynamic,bogus", "--out", str(tmp_path / "bad")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and "unknown ablation strategy 'bogus'" in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_hotpotqa_grid_uses_eq2_sets_and_em_f1(tiny_model_dir, tmp_path):
    from dynheads.experiments.ablation import AblationConfig, run_ablation
    from dynheads.models import load_model

    config = AblationConfig(
        model=str(tiny_model_dir),
        task="hotpotqa",
        questions=2,
        lengths=(300,),
        depths=(0.5,),
        runs=1,
        max_new_tokens=3,
        strategies=("dynamic", "random"),
        threshold=0.05,
    )
    run = run_ablation(config, tmp_path / "hq", lm=load_model(tiny_model_dir), progress=False)
    records = run.records()
    assert len(records) == 2 * 3  # none, dynamic, random per question
    assert all(set(r["metrics"]) >= {"em", "f1"} for r in records)
    cells = (tmp_path / "hq" / "cells.csv").read_text()
    assert cells.splitlines()[0].startswith("strategy,length,depth,em,f1,samples")
    assert (tmp_path / "hq" / "plots" / "ablation-f1.png").is_file()
    # Eq. 2 with a low threshold makes some heads dynamic even on a random model.
    assert any(sum(r["dynamic_counts"]) > 0 for r in records if r["strategy"] == "dynamic")


def test_grid_default_matches_each_controls_own_dynamic_count(tiny_model_dir, tiny_lm, tmp_path, fake_dynamic_sets):
    """Default (per-step) matching: each static / random record masks, at every step, as many heads as its own
    clean pass found dynamic; cells.csv counts the heads masked and the samples that masked none."""
    config = grid_config(tiny_model_dir, ranked_file(tmp_path, 3, 4), max_new_tokens=5)
    assert config.matching == "per_step"
    run = run_ablation(config, tmp_path / "grid", lm=tiny_lm, progress=False)
    records = {r["sample_id"]: r for r in run.records()}
    for sample in SAMPLES:
        for strategy in ("dynamic", "static", "random"):
            record = records[f"{sample}-{strategy}"]
            assert record["masked_counts"] == record["dynamic_counts"] and record["matching"] == "per_step"
    assert any(len(set(records[f"{s}-static"]["masked_counts"])) > 1 for s in SAMPLES)  # varies per step
    manifest = json.loads((tmp_path / "grid" / "manifest.json").read_text())
    assert manifest["config"]["matching"] == "per_step"
    cells = pd.read_csv(tmp_path / "grid" / "cells.csv")
    assert set(cells["matching"]) == {"per_step"}
    for row in cells.itertuples():
        record = records[f"analysis-len200-depth{row.depth:g}-run0-{row.strategy}"]
        assert row.mean_masked == pytest.approx(np.mean(record["masked_counts"]))
        assert row.zero_masked == int(sum(record["masked_counts"]) == 0)
    published = read_summaries(tmp_path / "grid")["summary.md"].numbers  # what the report's verdict reads
    from_cells = masking_numbers(cells)
    assert published["masking"]["masked"] == pytest.approx(from_cells["masked"])
    assert {key: value for key, value in published["masking"].items() if key != "masked"} == {
        key: value for key, value in from_cells.items() if key != "masked"
    }
    for metric in ("accuracy", "rouge_l"):  # per sample, in one sample order, for every strategy
        assert published["per_sample"][metric] == {
            strategy: [records[f"{sample}-{strategy}"]["metrics"][metric] for sample in sorted(SAMPLES)]
            for strategy in ("dynamic", "none", "random", "static")
        }
    masking = claims.AblationMasking(**published["masking"])
    verdict = claims.irreplaceability_verdict(
        _per_sample({"none": 1.0, "dynamic": 0.0, "static": 0.9, "random": 0.9}), "accuracy", "NIAH", masking
    )
    assert verdict.status == "supported" and "compared: per_step matching; dynamic" in verdict.reason
    assert "samples masked none" in verdict.reason and "zero-masked ones counted" in verdict.reason


def test_mean_matching_with_zero_count_controls_is_inconclusive():
    """Controls that masked no head on samples where dynamic masked some are not 'unharmed controls'."""
    cells = pd.DataFrame(
        {
            "matching": "mean",
            "strategy": ["none", "dynamic", "static", "random"],
            "length": 500,
            "depth": 0.5,
            "accuracy": [0.8, 0.0, 0.7, 0.8],
            "samples": 10,
            "mean_masked": [0.0, 0.9, 0.6, 0.6],
            "zero_masked": [10, 0, 4, 4],
        }
    )
    masking = claims.AblationMasking(**masking_numbers(cells))
    assert masking.masked["static"] == pytest.approx(0.6) and masking.zero_masked["random"] == 4
    verdict = claims.irreplaceability_verdict(
        _per_sample({"none": 0.8, "dynamic": 0.0, "static": 0.7, "random": 0.8}), "accuracy", "NIAH", masking
    )
    assert verdict.status == "inconclusive" and "static on 4, random on 4, dynamic on 0" in verdict.reason
    assert "mean matching" in verdict.reason
    matched = claims.AblationMasking(**masking_numbers(cells.assign(zero_masked=[10, 1, 1, 1], matching="per_step")))
    assert (
        claims.irreplaceability_verdict(
            _per_sample({"none": 0.8, "dynamic": 0.0, "static": 0.7, "random": 0.8}), "accuracy", "NIAH", matched
        ).status
        == "supported"
    )


def _per_sample(means: dict[str, float], samples: int = 40) -> dict[str, np.ndarray]:
    """Per-sample 0/1 accuracies with exactly these means (the first round(mean * samples) samples succeed)."""
    return {name: (np.arange(samples) < round(mean * samples)).astype(float) for name, mean in means.items()}


def test_unknown_matching_is_refused(tiny_model_dir, tiny_lm, tmp_path):
    with pytest.raises(DynheadsError, match="unknown matching 'median'"):
        run_ablation(grid_config(tiny_model_dir, None, matching="median"), tmp_path / "m", lm=tiny_lm, progress=False)
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("matching", ["per_step", "mean"])
def test_batched_grid_writes_the_records_of_batch_one(tiny_model_dir, tiny_lm, tmp_path, fake_dynamic_sets, matching):
    """--batch-size decodes (sample, strategy) records together; the records are those of the reference path."""
    config = grid_config(tiny_model_dir, ranked_file(tmp_path, 3, 4), matching=matching, depths=(0.0, 0.5, 1.0))
    one = run_ablation(config, tmp_path / "one", lm=tiny_lm, progress=False)
    three = run_ablation(config, tmp_path / "three", lm=tiny_lm, progress=False, batch_size=3)
    assert len(one.records()) == 3 * len(STRATEGIES) and one.records() == three.records()
    assert any(sum(r["masked_counts"]) for r in one.records())
    progressive = progressive_config(tiny_model_dir, tmp_path)
    assert (
        run_progressive(progressive, tmp_path / "p1", lm=tiny_lm, progress=False).records()
        == run_progressive(progressive, tmp_path / "p4", lm=tiny_lm, progress=False, batch_size=4).records()
    )


@pytest.fixture
def counted_prefills(monkeypatch):
    """The prompts prefilled, in order (``ablation.prefilled_session`` wrapped)."""
    prefilled, real = [], ablation.prefilled_session
    monkeypatch.setattr(
        ablation, "prefilled_session", lambda lm, s, *a: prefilled.append(s.sample_id) or real(lm, s, *a)
    )
    return prefilled


def prefill_per_row(monkeypatch):
    """Every row prefills its own prompt: the runners as they were before the prefill was shared."""
    monkeypatch.setattr(
        ablation,
        "shared_prefills",
        lambda lm, samples, setting, n: [ablation.prefilled_session(lm, s, setting, n) for s in samples],
    )


@pytest.mark.parametrize("matching", ["per_step", "mean"])
def test_a_samples_strategies_share_one_prefill_and_write_the_records_of_separate_runs(
    tiny_model_dir, tiny_lm, tmp_path, fake_dynamic_sets, counted_prefills, monkeypatch, matching
):
    """Issue 36: the grid prefills each sample once for all its strategies (twice under mean matching: the
    controls wait for the dynamic run's count); the records equal those of every row prefilled alone and those of
    runs of one strategy each."""
    static = ranked_file(tmp_path, 3, 4)
    config = grid_config(tiny_model_dir, static, matching=matching)
    shared = run_ablation(config, tmp_path / "shared", lm=tiny_lm, progress=False).records()
    assert sorted(counted_prefills) == sorted(SAMPLES * (2 if matching == "mean" else 1))
    assert len(shared) == len(SAMPLES) * len(STRATEGIES) and any(sum(r["masked_counts"]) for r in shared)
    separate = {}
    for strategy in ("dynamic", "static", "random"):
        alone = grid_config(tiny_model_dir, static, matching=matching, strategies=(strategy,))
        separate |= {
            r["sample_id"]: r for r in run_ablation(alone, tmp_path / strategy, lm=tiny_lm, progress=False).records()
        }
    assert shared == [separate[r["sample_id"]] for r in shared]
    prefill_per_row(monkeypatch)
    counted_prefills.clear()
    assert run_ablation(config, tmp_path / "per-row", lm=tiny_lm, progress=False).records() == shared
    assert len(counted_prefills) == len(shared)


def test_progressive_ks_share_one_prefill_per_sample(tiny_model_dir, tiny_lm, tmp_path, counted_prefills, monkeypatch):
    progressive = progressive_config(tiny_model_dir, tmp_path)
    shared = run_progressive(progressive, tmp_path / "shared", lm=tiny_lm, progress=False).records()
    assert len(counted_prefills) == 2 and len(shared) == 2 * 3
    prefill_per_row(monkeypatch)
    assert run_progressive(progressive, tmp_path / "per-row", lm=tiny_lm, progress=False).records() == shared
