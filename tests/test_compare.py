"""``dynheads compare``: constructed studies (test_report's hand-made study folders, no model run) of models of
different sizes, put side by side; studies whose verdict settings differ are refused in one line."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from test_report import MODEL, make_reproduce_dir

from dynheads.errors import DynheadsError
from dynheads.io import read_json, write_json
from dynheads.paper import PAPER_DYNAMISM
from dynheads.report.compare import collect
from dynheads.report.compare_page import matrix, size_panels, write_compare
from dynheads.runs import RunDir
from dynheads.tables import read_summaries, write_summary
from dynheads.views.analyses import dynamism_report

SMALL, LARGE = "small-model", "large-model"


def _study(root: Path, name: str, parameters: int | None, floor: int = 5, like: Path | None = None) -> Path:
    """A constructed study of model ``name`` (a copy of the study ``like``, when given: faster than building one)."""
    if like is None:
        make_reproduce_dir(root)
    else:
        shutil.copytree(like, root)
    manifest = read_json(root / "manifest.json")
    model = {**MODEL, "name": name, **({"parameters": parameters} if parameters is not None else {})}
    write_json(root / "manifest.json", {**manifest, "model": model, "config": {**manifest["config"], "floor": floor}})
    return root


def _masking_changes_nothing(root: Path) -> None:
    """Rewrite the study's ablation evidence so that masking the dynamic heads costs nothing and a control costs one
    sample: Claim 2 is not supported (the differences vary, so the bootstrap interval decides: identical
    differences at n = 6 would get an exact interval too wide to decide)."""
    summary = read_summaries(root / "ablation")["summary.md"]
    arms = summary.numbers["per_sample"]["accuracy"]
    same = {strategy: [1.0] * len(values) for strategy, values in arms.items()}
    same["static"][-1] = same["random"][-2] = 0.0
    summary.numbers["per_sample"] = {"accuracy": same, "rouge_l": same}
    write_summary(root / "ablation", "summary.md", summary)


@pytest.fixture(scope="module")
def studies(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("compare")
    small = _study(base / "small", SMALL, 135_000_000)
    large = _study(base / "large", LARGE, 1_500_000_000, like=small)
    _masking_changes_nothing(large)
    return small, large


@pytest.fixture(scope="module")
def written(studies, tmp_path_factory) -> tuple[Path, str, str]:
    out = tmp_path_factory.mktemp("out")
    md_path, html_path = write_compare([studies[1], studies[0]], out)
    return out, md_path.read_text(encoding="utf-8"), html_path.read_text(encoding="utf-8")


def row_of(table, claim: str) -> list:
    return next(row for row in table.rows if row[0] == claim)


def test_models_are_ordered_by_size_and_their_verdicts_differ_where_their_studies_do(studies):
    small, large = collect([studies[1], studies[0]])
    assert (small.name, small.parameters, large.name, large.parameters) == (SMALL, 135e6, LARGE, 1.5e9)
    claim2 = [(m.verdict("Claim 2 (irreplaceability)", "NIAH") or pytest.fail("no verdict")) for m in (small, large)]
    assert [v.status for v in claim2] == ["supported", "not supported"]
    assert claim2[1].effects[0].interval.effect == pytest.approx(-1 / 6) and claim2[1].effects[0].interval.n == 6
    assert claim2[1].effects[0].interval.high <= 0.0
    table = matrix([small, large])
    assert table.columns == ["claim", "task", SMALL, LARGE, "the paper's rows, same rule"]
    assert row_of(table, "Claim 1 (dynamism)")[-1] == "not readable: no frequency baseline in the paper (Table 2)"
    row = next(r for r in table.rows if r[:2] == ["Claim 2 (irreplaceability)", "NIAH"])
    assert row[2].startswith("supported: static - dynamic accuracy ") and "(n=6), rule > 0.1" in row[2]
    assert row[3].startswith("not supported: static - dynamic accuracy -0.167 [") and "(n=6)" in row[3]
    assert [r[0] for r in table.rows][:2] == ["Claim 1 (dynamism)"] * 2  # claims in the paper's order
    panel = next(p for p in size_panels([small, large]) if p.title.startswith("Claim 2, NIAH: static - dynamic"))
    assert panel.margin == 0.1
    assert [(p.model, p.parameters, p.n) for p in panel.points] == [(SMALL, 135e6, 6), (LARGE, 1.5e9, 6)]
    assert panel.points[1].effect == pytest.approx(-1 / 6) and panel.points[1].high <= 0.0 < panel.margin


def test_compare_md_has_the_matrix_table1_figure_and_task_accuracy(written, studies):
    out, md, _ = written
    sections = [line for line in md.splitlines() if line.startswith("## ")]
    assert sections == [
        "## Verdicts by model",
        "## Table 1 beside the paper",
        "## Statistics against model size",
        "## Task accuracy",
        "## Sources",
    ]
    stats = read_summaries(studies[0] / "dynamism")["dynamism.md"].numbers["stats"]
    share = stats["mean_size"] / 64  # 8 layers x 8 heads
    row = next(line for line in md.splitlines() if line.startswith(f"| {SMALL} | 135M | NIAH |"))
    assert f"| 64 | {stats['mean_size']:.2f} ± {stats['std_size']:.2f} | {share:.3f} |" in row
    for name, paper in PAPER_DYNAMISM.items():
        share = paper["mean_size"] / paper["total_heads"]
        expected = f"| {paper['mean_size']:.2f} ± {paper['std_size']:.2f} | {share:.3f} |"
        assert expected in next(line for line in md.splitlines() if line.startswith(f"| {name} (paper) |"))
    # 6 of 6: the exact (Clopper-Pearson) interval, never a zero-width [1.000, 1.000]
    assert "| NIAH | accuracy | 1.000 [0.541, 1.000] (n=6) | 1.000 [0.541, 1.000] (n=6) |" in md
    assert "| HotpotQA | EM | 0.000 [0.000, 0.708] (n=3) |" in md
    assert (out / "compare-by-size.png").read_bytes()[:4] == b"\x89PNG"
    assert "![Statistics against model size](compare-by-size.png)" in md


def test_the_html_shows_the_matrix_first_and_embeds_the_figure(written):
    _, _, page = written
    first_section = page.index("<section")
    assert page.index('<section id="verdicts">') == first_section
    assert page.index('<table class="matrix">') < page.index('<section id="table1">')
    assert '<td class="not-supported"><strong>not supported</strong>' in page
    assert "data:image/png;base64," in page


def test_a_saved_comparison_stands_in_for_its_folders(written, studies, tmp_path):
    """compare.json holds what was collected of each model: compared again from it alone, the page is the same but
    for its sources; with a new study it adds a model; beside a folder of a model it holds, that model twice."""
    out, md, _ = written
    saved = out / "compare.json"
    again, _ = write_compare([saved], tmp_path / "again")
    text = again.read_text(encoding="utf-8")
    assert text.split("## Sources")[0] == md.split("## Sources")[0]
    assert f"{SMALL}: `{studies[0]}` (study, preset `quick`), as saved in `{saved}`" in text
    third = _study(tmp_path / "third", "third-model", 360_000_000, like=studies[0])
    assert [m.name for m in collect([saved, third])] == [SMALL, "third-model", LARGE]
    with pytest.raises(DynheadsError, match=f"two studies of {SMALL}: .* \\(in .*compare.json\\) and "):
        collect([saved, studies[0]])
    with pytest.raises(DynheadsError, match=f"{SMALL} is in .* and in .*: give it once"):
        collect([saved, saved])
    damaged = tmp_path / "damaged.json"
    damaged.write_text('{"kind": "compare", "format": 1, "models": [{"name": "x"}]}', encoding="utf-8")
    with pytest.raises(DynheadsError, match="damaged.json is damaged \\(KeyError"):
        collect([damaged])
    (tmp_path / "report.json").write_text('{"kind": "report"}', encoding="utf-8")
    with pytest.raises(DynheadsError, match="is not a compare.json that dynheads compare wrote"):
        collect([tmp_path / "report.json"])


def _single_run(study: Path, run: Path, name: str) -> Path:
    """The study's NIAH run copied as a single run of model ``name``, with its dynamism published into it."""
    shutil.copytree(study / "niah", run)
    manifest = read_json(run / "manifest.json")
    write_json(run / "manifest.json", {**manifest, "model": {**MODEL, "name": name, "parameters": 500_000_000}})
    dynamism_report(run, study / "static" / "static_heads.json", out_dir=run)
    return run


def test_a_single_run_adds_its_task_accuracy_and_claim1(studies, tmp_path):
    run = _single_run(studies[0], tmp_path / "run", "third")
    strict = _study(tmp_path / "strict", "strict-model", 1_000_000_000, floor=30, like=studies[0])  # a run's: 30
    third, _ = collect([strict, run])
    assert third.name == "third" and "NIAH" in third.dynamism
    claim1 = third.verdict("Claim 1 (dynamism)", "NIAH")
    # a traced run has no head predictor, whose within-step ranking decides Claim 1 since issue 59; the shares
    # (descriptive) are read on its 6 samples
    assert claim1 is not None and claim1.status == "inconclusive" and "no head predictor" in claim1.reason
    assert [effect.interval.n for effect in claim1.descriptive] == [6, 6, 6]
    assert [(a.task, a.metric, a.interval.n) for a in third.accuracy][0] == ("NIAH", "accuracy", 6)
    assert np.isclose(third.accuracy[0].interval.effect, 1.0)


def test_a_run_beside_its_models_study_adds_accuracy_not_a_second_verdict(studies, tmp_path):
    run = _single_run(studies[0], tmp_path / "run", SMALL)
    (small,) = collect([run, studies[0]])  # the run first: the study's verdict still decides, under its floor 5
    claim1 = [v for v in small.verdicts if (v.claim, v.task) == ("Claim 1 (dynamism)", "NIAH")]
    assert len(claim1) == 1 and claim1[0].status == "supported"
    assert [a.source for a in small.accuracy if a.metric == "accuracy"] == [studies[0] / "niah", run]


def test_studies_decided_under_different_settings_are_refused_in_one_line(studies, tmp_path):
    other = _study(tmp_path / "strict", "strict-model", 360_000_000, floor=30, like=studies[0])
    with pytest.raises(DynheadsError, match=r"differ in the sample floor \(small-model: 5; strict-model: 30\)"):
        collect([studies[0], other])
    done = subprocess.run(
        [sys.executable, "-m", "dynheads", "compare", str(studies[0]), str(other), "--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("error: the studies differ in the sample floor")


def test_two_studies_of_one_model_and_a_folder_without_manifest_are_refused(studies, tmp_path):
    with pytest.raises(DynheadsError, match="two studies of small-model"):
        collect([studies[0], studies[0]])
    with pytest.raises(DynheadsError, match="neither a study nor a run folder"):
        collect([tmp_path])


def test_two_studies_of_one_model_side_by_side_with_by_study(studies, tmp_path):
    """Two studies of one model (two seeds, two presets) are refused with the way to compare them anyway; with
    --by-study each study folder gets its own column, named after its folder."""
    seed1 = shutil.copytree(studies[0], tmp_path / "seed1")
    with pytest.raises(DynheadsError, match="two studies of small-model: .* or pass --by-study for one column per"):
        collect([studies[0], seed1])
    models = collect([studies[0], seed1], by_study=True)
    assert sorted(m.name for m in models) == ["small-model [seed1]", "small-model [small]"]
    assert all(m.verdicts and m.study is not None for m in models)
    done = subprocess.run(
        [sys.executable, "-m", "dynheads", "compare", str(studies[0]), str(seed1), "--by-study"]
        + ["--out", str(tmp_path / "o")],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert "| small-model [seed1] | small-model [small] |" in (tmp_path / "o" / "compare.md").read_text()


def test_studies_of_different_presets_refused_for_a_setting_name_the_presets(studies, tmp_path):
    other = _study(tmp_path / "smoke", "smoke-model", 360_000_000, floor=30, like=studies[0])
    write_json(other / "manifest.json", {**read_json(other / "manifest.json"), "preset": "smoke"})
    with pytest.raises(DynheadsError, match=r"they ran different presets: small-model: quick; smoke-model: smoke"):
        collect([studies[0], other])


def test_a_study_with_a_verdict_stage_begun_but_not_summarised_is_refused_as_unfinished(studies, tmp_path):
    """A study still running (or stopped) inside a verdict's stage: its manifest holds the doses the stage resolved,
    not the fit its summary publishes, so it would be refused for other settings, or compared on a stage's half."""
    running = _study(tmp_path / "running", "running-model", 360_000_000, like=studies[0])
    (running / "ablation" / "summary.json").unlink()
    with pytest.raises(DynheadsError, match=r"running is not finished: its stage ablation started and published no"):
        collect([studies[0], running])
    write_json(running / "stages.json", {"ablation": {"seconds": 1.0, "error": "no static heads"}})
    assert collect([studies[0], running])  # a failed stage is finished: its verdict says why (the report's rule)


def test_a_study_without_a_parameter_count_is_left_off_the_figure(studies, tmp_path):
    old = _study(tmp_path / "old", "old-model", None, like=studies[0])
    md_path, _ = write_compare([studies[0], old], tmp_path / "out")
    md = md_path.read_text(encoding="utf-8")
    assert "Not on the figure (parameter count not recorded by an older dynheads): old-model." in md
    assert "| old-model | not recorded | NIAH |" in md


def test_settings_fitted_per_model_are_compared_by_their_rule(studies, tmp_path):
    """A calibrated Eq. 2 threshold resolves to another relative:K per model: the studies agree when the rules do,
    and are refused when a rule differs. Old studies' relative doses (fixed k from a mean |D_t|) are named as the
    old design and compared by their multiples; a study with fractions of each step's |D_t| differs from them."""
    small = _study(tmp_path / "small", SMALL, 135_000_000, like=studies[0])
    large = _study(tmp_path / "large", LARGE, 1_500_000_000, like=studies[0])

    def fitted(root: Path, applied: str, rule: str, doses: list[int], multiples: list[float]) -> None:
        shutil.rmtree(root / "hotpotqa-ablation", ignore_errors=True)
        qa = RunDir(root / "hotpotqa-ablation")
        qa.start("ablation", {"task": "hotpotqa", "threshold": applied, "doses": doses}, None)
        shutil.copy(root / "ablation" / "summary.json", qa.path)  # a finished stage publishes its summary
        write_json(qa.path / "threshold_fit.json", {"rule": rule, "applied": applied})
        write_json(qa.path / "dose_fit.json", {"multiples": multiples, "doses": doses})
        write_json(root / "ablation" / "dose_fit.json", {"multiples": multiples, "doses": doses})

    fitted(small, "relative:20.7", "calibrated:10", [1, 2, 4], [0.25, 0.5, 1.0])
    fitted(large, "relative:4.07", "calibrated:10", [6, 12, 24], [0.25, 0.5, 1.0])
    models = collect([small, large])
    assert [m.settings["QA ablation Eq. 2 threshold"] for m in models] == ["calibrated:10"] * 2
    old_design = "old design: k = 0.25, 0.5, 1 x mean |D_t| heads at every step"
    assert {m.settings["NIAH ablation doses"] for m in models} == {old_design}
    fitted(large, "relative:4.07", "calibrated:12", [6, 12, 24], [0.25, 0.5, 1.0])
    with pytest.raises(DynheadsError, match=r"differ in the QA ablation Eq. 2 threshold \(small-model: calibrated:10"):
        collect([small, large])
    fitted(large, "relative:4.07", "calibrated:10", [12, 24], [0.5, 1.0])
    with pytest.raises(DynheadsError, match=r"differ in the NIAH ablation doses"):
        collect([small, large])
    fitted(large, "relative:4.07", "calibrated:10", [6, 12, 24], [0.25, 0.5, 1.0])
    (large / "ablation" / "dose_fit.json").unlink()  # the new design: fractions in the stage's config
    manifest = read_json(large / "ablation" / "manifest.json")
    manifest["config"] |= {"fractions": [0.25, 0.5, 0.75, 1.0], "compensation": [1.5, 2.0], "doses": []}
    write_json(large / "ablation" / "manifest.json", manifest)
    with pytest.raises(DynheadsError, match=r"differ in the NIAH ablation doses .*0.25, 0.5, 0.75, 1 x each step's"):
        collect([small, large])


def test_a_study_stopped_inside_a_traced_stage_is_refused_not_compared_on_part_of_its_grid(studies, tmp_path):
    """The NIAH grid's accuracy is read from its finished records: a study stopped before its last sample would be
    compared on part of its grid (a traced stage writes results.csv once every sample is finished)."""
    running = _study(tmp_path / "running", "running-model", 360_000_000, like=studies[0])
    assert collect([studies[0], running])
    (running / "niah" / "results.csv").unlink()
    with pytest.raises(DynheadsError, match=r"running is not finished: its stage niah started and published no"):
        collect([studies[0], running])
    write_json(running / "stages.json", {"niah": {"seconds": 1.0}})
    assert collect([studies[0], running])  # logged as done: its records are the grid
