"""The reproduce report: a fake reproduce folder from small hand-made artifacts (written with the real writers where
cheap), the sections and verdicts of report.md, the per-step data of report.html, and the verdict rules."""

from __future__ import annotations

import base64
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dynheads import stages
from dynheads.analysis.cca import write_cca
from dynheads.analysis.dynamism import dynamism_stats, per_sample_dynamism
from dynheads.analysis.evidence import EvidenceSettings
from dynheads.analysis.headlists import save_head_scores
from dynheads.errors import DynheadsError
from dynheads.io import write_json, write_text
from dynheads.paper import PAPER_PROBE_BINARY
from dynheads.plots.ablation import plot_ablation_cells, plot_progressive
from dynheads.plots.cca import plot_cca
from dynheads.rag.results import rag_table
from dynheads.report import claims, write_report
from dynheads.report.render import markdown_html
from dynheads.report.stepview import spans, step_view
from dynheads.runs import RunDir
from dynheads.tables import Summary, Table, write_summary
from dynheads.traces import Trace
from dynheads.views.ablation_tables import per_sample_metric
from dynheads.views.analyses import dynamism_report, plot_heads
from dynheads.views.probing import metrics_table
from dynheads.views.rag_tables import per_question_f1, rag_summary_table

LAYERS, HEADS, DIM, PROMPT = 8, 8, 16, 300
NEEDLE = list(range(150, 170))
MODEL = {
    "name": "tiny-test-model",
    "revision": "abc123",
    "architecture": "LlamaForCausalLM",
    "num_layers": LAYERS,
    "num_heads": HEADS,
    "num_kv_heads": 2,
    "hidden_size": DIM,
}
SECTION_HEADINGS = (
    "## Run",
    "## Verdicts",
    "## Static retrieval heads",
    "## NIAH setup (Section 3.1)",
    "## Claim 1, dynamism, on NIAH",
    "## Claim 2, irreplaceability, on NIAH",
    "## Claim 3, correlation, on NIAH",
    "## HotpotQA setup (Section 5)",
    "## Claim 1, dynamism, on HotpotQA",
    "## Claim 2, irreplaceability, on HotpotQA",
    "## Claim 3, correlation, on HotpotQA",
    "## Dynamic RAG (Section 6, Tables 4 and 6)",
    "## Per-step view",
)


def _trace(rng: np.random.Generator, steps: int, needle: list[int]) -> Trace:
    copy = rng.random((steps, LAYERS, HEADS)) < 0.3
    argmax = rng.integers(0, PROMPT, (steps, LAYERS, HEADS)).astype(np.int32)
    argmax[copy] = rng.choice(needle, int(copy.sum()))
    return Trace(
        tokens=rng.integers(0, 100, steps),
        token_texts=[f" t{i}" for i in range(steps)],
        text="generated",
        argmax_pos=argmax,
        needle_mass=rng.random((steps, LAYERS, HEADS)).astype(np.float32),
        scores={"copy": copy, "reasoning": rng.random((steps, LAYERS, HEADS)).astype(np.float32) ** 3},
        max_prob=rng.random((steps, LAYERS, HEADS)).astype(np.float32),
        hidden=rng.normal(size=(steps, DIM)).astype(np.float32),
        prompt_length=PROMPT,
        stop_reason="eos",
    )


def _traced_run(
    path: Path,
    kind: str,
    rng: np.random.Generator,
    samples: int,
    needle: list[int],
    metrics: dict[str, float],
    steps: int = 12,
) -> RunDir:
    run = RunDir(path)
    run.start(kind, {"lengths": [500, 1000], "seed": 0, "max_new_tokens": steps}, None)
    for i in range(samples):
        record = {
            "sample_id": f"s{i:02d}",
            "context_tokens": 500 * (1 + i % 2),
            "depth": 0.5,
            "answer": "uuid-1234",
            "generated": "uuid-1234",
            "needle_positions": needle,
            "metrics": metrics,
            "steps": steps,
        }
        run.save_sample(record, _trace(rng, steps, needle))
    run.write_results()
    return run


def _png(path: Path) -> None:
    from matplotlib.figure import Figure

    figure = Figure(figsize=(2, 1))
    figure.add_subplot().plot([0, 1], [1, 0])
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=50)


def make_reproduce_dir(root: Path) -> Path:
    """NIAH stages all present; HotpotQA traced but not analysed; RAG present."""
    rng = np.random.default_rng(0)
    # floor 5: the verdicts of this 6-sample study are decided (test_the_default_floor_... checks the default)
    write_json(
        root / "manifest.json",
        {
            "kind": "reproduce",
            "preset": "quick",
            "config": {"samples": 6, "floor": 5},
            "model": MODEL,
            "versions": {"torch": "2.x", "dynheads": "0.1.0"},
            "python": "3.11.7",
            "seed": 0,
            "wall_seconds": 12.5,
        },
    )
    niah = _traced_run(root / "niah", "niah", rng, 6, NEEDLE, {"accuracy": 1.0, "rouge_l": 0.9, "rouge1_recall": 1.0})
    hotpot = _traced_run(
        root / "hotpotqa",
        "hotpotqa",
        rng,
        3,
        list(range(40, 60)) + list(range(200, 215)),
        {"em": 0.0, "f1": 0.5, "recall": math.nan},
    )
    broken = hotpot.load_trace("s01")
    broken.reasoning_scores[0, 0, 0] = np.nan  # an empty Eq. 2 denominator: must not break the embedded JSON
    broken.save(hotpot.trace_path("s01"))

    static = root / "static" / "static_heads.json"
    ranking = [(layer, head) for layer in range(LAYERS) for head in range(HEADS)]
    save_head_scores(static, {head: [1.0 - i / 64, 0.9 - i / 64] for i, head in enumerate(ranking)})
    write_json(
        root / "static" / "static_summary.json",
        {"pass_rate": 0.8, "num_counted": 8, "num_tests": 10, "top20": [f"L{lh[0]}-H{lh[1]}" for lh in ranking[:20]]},
    )
    dynamism_report(niah.path, static, ks=(20, 50), out_dir=root / "dynamism")
    plot_heads(niah.path, ["s00"], out_dir=root / "dynamism")

    cells = pd.DataFrame(
        [
            {"strategy": s, "length": length, "depth": 0.5, "accuracy": acc, "rouge_l": acc, "samples": 2}
            for s, acc in (("none", 1.0), ("dynamic", 0.1), ("static", 0.8), ("random", 0.9))
            for length in (500, 1000)
        ]
    )
    (root / "ablation").mkdir()
    cells.to_csv(root / "ablation" / "cells.csv", index=False)
    grid = RunDir(root / "ablation")  # the per-sample records Claim 2's interval resamples
    grid.start("ablation", {"task": "niah"}, None)
    for i in range(6):
        # differences that vary between samples: a constant difference at n = 6 has a wide exact interval
        arms = (("none", 1.0), ("dynamic", 0.0), ("static", float(i > 0)), ("random", float(i != 2)))
        for strategy, accuracy in arms:
            grid.save_sample(
                {
                    "sample_id": f"s{i}-{strategy}",
                    "grid_sample_id": f"s{i}",
                    "strategy": strategy,
                    "metrics": {"accuracy": accuracy, "rouge_l": accuracy},
                }
            )
    write_summary(
        root / "ablation",
        "summary.md",
        Summary(  # Claim 2 reads the per-sample values it publishes
            [Table(["strategy", "accuracy"], [["dynamic", 0.1], ["static", 0.8]])],
            {"per_sample": {metric: per_sample_metric(grid.records(), metric) for metric in ("accuracy", "rouge_l")}},
            title="Per-step ablation",
        ),
    )
    plot_ablation_cells(cells, root / "ablation" / "plots", title="test")
    progressive = pd.DataFrame(
        {"k": [0, 5], "samples": [2, 2], "static_overlap": [0.0, 3.0], "accuracy": [1.0, 0.2], "rouge_l": [1.0, 0.4]}
    )
    (root / "progressive").mkdir()
    progressive.to_csv(root / "progressive" / "progressive.csv", index=False)
    write_summary(
        root / "progressive", "summary.md", Summary([Table(["k", "accuracy"], [[0, 1]])], title="Progressive")
    )
    plot_progressive(progressive, root / "progressive" / "plots" / "progressive.png")

    table = pd.DataFrame(
        [
            {
                "offset": k,
                "method": m,
                "top1": v - 0.1 * k,
                "top10_mean": 0.3,
                "top50_mean": 0.2,
                "n_components": 5,
                "hidden_dims": 5,
                "score_dims": 5,
                "fit_pairs": 40,
                "eval_pairs": 20,
                **({"gap": 0.4, "gap_low": 0.25, "gap_high": 0.55, "test_samples": 6} if m == "held_out" else {}),
            }
            for k in range(3)
            for m, v in (("in_sample", 0.95), ("held_out", 0.7), ("shuffled", 0.3))
        ]
    )
    write_cca(table, root / "cca", model=MODEL["name"])
    plot_cca(table, root / "cca" / "cca.png")
    probe = {
        "probe": {"f1": 0.6, "precision": 0.6, "recall": 0.6, "auprc": 0.7, "positive_rate": 0.3},
        "baseline": {"f1": 0.4, "precision": 0.4, "recall": 0.4, "auprc": 0.35, "positive_rate": 0.3},
        "gap": {"metric": "auprc", "effect": 0.35, "low": 0.2, "high": 0.5, "n": 6},
        "position_gap": {"metric": "auprc", "effect": 0.3, "low": 0.15, "high": 0.45, "n": 6},
        "step_gap": {"metric": "within-step ranking", "effect": 0.2, "low": 0.1, "high": 0.3, "n": 6},
    }
    write_json(root / "probe" / "metrics.json", {"task": "binary", "score": "copy", **probe, "paper": {}})
    write_summary(
        root / "probe",
        "metrics.md",
        Summary([metrics_table({"ours": probe["probe"], **PAPER_PROBE_BINARY}, "binary")], {"task": "binary", **probe}),
    )
    _png(root / "probe" / "history.png")

    rag = RunDir(root / "rag")
    rag.start("rag", {"ks": [5]}, None)
    for q in range(6):
        for strategy, k, f1 in (("dynamic", 5, 0.6 + 0.01 * q), ("static", 5, 0.4), ("none", None, 0.2)):
            rag.save_sample(
                {
                    "sample_id": f"q{q}-{strategy}",
                    "question_id": f"q{q}",
                    "strategy": strategy,
                    "k": k,
                    "metrics": {"em": f1 / 2, "f1": f1},
                    "retrieval_recall": 0.5,
                    "retrievals": 1,
                    "visible_tokens": [40],
                    "context_tokens": 500,
                }
            )
    rag.write_results()
    write_summary(
        rag.path, "rag.md", Summary([rag_summary_table(rag_table(rag))], {"f1_pairs": per_question_f1(rag.records())})
    )
    return root


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> tuple[Path, str, str]:
    root = make_reproduce_dir(tmp_path_factory.mktemp("reproduce"))
    md_path, html_path = write_report(root)
    return root, md_path.read_text(encoding="utf-8"), html_path.read_text(encoding="utf-8")


def test_every_section_and_verdict_is_in_the_markdown(report):
    _, md, _ = report
    for heading in SECTION_HEADINGS:
        assert f"\n{heading}" in md, heading
    assert "**Verdict:** Claim 1 (dynamism), NIAH: supported." in md
    assert "within-step ranking of D_t - the static frequency profile's (held-out samples) 0.200 [0.100, 0.300]" in md
    assert "Descriptive, deciding nothing (dynheads rules): containment" in md
    assert re.search(
        r"containment in the static retrieval top-max\(20, \|D_t\|\), share above chance -?0\.\d+ \[-?0\.\d+, "
        r"-?0\.\d+\] \(n=6\), rule < 0\.8",
        md,
    )
    assert "**Verdict:** Claim 2 (irreplaceability), NIAH: supported." in md
    assert "static - dynamic accuracy 0.833 [" in md and "random - dynamic accuracy 0.833 [" in md
    assert "**Verdict:** Claim 3 (correlation), NIAH: supported." in md
    assert "held-out - shuffled CCA top-1 at k=1 0.400 [0.250, 0.550] (n=6), rule > 0" in md
    assert "head predictor - the better of the frequency and step-index profiles AUPRC 0.300 [0.150, 0.450] (n=6)" in md
    assert "head predictor - frequency profile AUPRC (no position control) 0.350 [0.200, 0.500] (n=6), rule > 0" in md
    assert "**Verdict:** Dynamic RAG (dynamic beats static), HotpotQA: supported." in md
    assert re.search(r"Dynamic - Static F1 at k=5 0\.225 \[0\.2\d\d, 0\.2\d\d\] \(n=6\), rule > 0", md)
    # its stages not run yet: nothing decided (issue 60 item 10)
    assert "Claim 1 (dynamism), HotpotQA: not run (stages hotpotqa-dynamism, hotpotqa-set-probe not run yet)" in md
    assert "*`hotpotqa-dynamism/`: stage not run.*" in md and "*`hotpotqa-cca/`: stage not run.*" in md


def test_markdown_shows_manifest_settings_tables_figures_and_paper_values(report):
    root, md, _ = report
    assert "| model name | tiny-test-model |" in md and "| wall_seconds | 12.5 |" in md and "torch 2.x" in md
    assert "From `dynamism/dynamism.md`:" in md and "llama3.1-8b (paper)" in md  # the stage's Table 1 with paper rows
    assert "Paper: Table 1 (five models): Jaccard w/ static top-20 0.1845-0.4611" in md
    assert "Paper: Figure 4 (llama3.1-8b, in-sample top-1): k=0 0.966, k=1 0.931, k=2 0.915." in md
    assert "Paper, Table 4 (HotpotQA EM / F1, k = 5):" in md and "| k=20 | 0.292 / 0.3967 |" in md
    assert "`niah/manifest.json`: `lengths=[500, 1000]`" in md
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert {
        "dynamism/heads-s00.png",
        "ablation/plots/ablation-accuracy.png",
        "progressive/plots/progressive.png",
        "cca/cca.png",
        "probe/history.png",
    } <= set(images)
    assert all((root / image).is_file() for image in images)


def test_html_embeds_every_figure_and_the_step_data(report):
    _, md, page = report
    sources = re.findall(r'<img src="data:image/png;base64,([^"]+)"', page)
    assert len(sources) == md.count("![")
    assert all(base64.b64decode(source).startswith(b"\x89PNG") for source in sources)
    assert "http://" not in page and "https://" not in page
    data = json.loads(re.search(r'id="stepview-data">(.*?)</script>', page, re.S).group(1))
    assert [run["label"] for run in data["runs"]] == ["NIAH", "HotpotQA"]
    assert len(data["runs"][0]["samples"]) == 6 and data["runs"][0]["samples"][0]["spans"] == [[150, 170]]
    assert data["runs"][1]["samples"][0]["spans"] == [[40, 60], [200, 215]]
    assert '<p class="verdict supported">' in page and "<!--" not in page.split("</head>")[1]


def test_an_empty_folder_gives_a_report_that_says_so(tmp_path):
    md_path, html_path = write_report(tmp_path)
    md = md_path.read_text()
    for heading in SECTION_HEADINGS:
        assert f"\n{heading}" in md
    assert md.count("stage not run") == 16  # manifest + 14 stage folders, hotpotqa-set-probe in Claims 1 and 3
    assert md.count(": not run (") == 7 and ": inconclusive (" not in md  # nothing ran: nothing decided
    assert "**16 of 16 stages not run yet: run the same command to continue**" in md
    assert '"runs":[]' in html_path.read_text()


def test_a_folder_that_is_no_study_is_refused_in_one_line(tmp_path):
    """``write_report`` from Python checks what ``dynheads report`` checks: no report of 16 stages "not run" is
    written into a traced run's folder or a mistyped path (which it used to create)."""
    run = tmp_path / "niah-run"
    run.mkdir()
    (run / "manifest.json").write_text(json.dumps({"kind": "niah", "config": {}}))
    (tmp_path / "list.json").mkdir()
    (tmp_path / "list.json" / "manifest.json").write_text("[1, 2]")
    cases = {
        tmp_path / "typo": "no study folder .*typo: give the --out folder of 'dynheads reproduce'",
        run: "niah-run is not a study folder written by 'dynheads reproduce' \\(a 'niah' run\\)",
        tmp_path / "list.json": "is not a study folder .*its manifest.json is not a run manifest",
    }
    for folder, says in cases.items():
        with pytest.raises(DynheadsError, match=says) as error:
            write_report(folder)
        assert "\n" not in str(error.value)
    assert not (tmp_path / "typo").exists() and not (run / "report.md").exists()


def test_an_unreadable_stage_is_reported_not_raised(tmp_path):
    (tmp_path / "ablation").mkdir()
    write_text(tmp_path / "ablation" / "cells.csv", "strategy,length\ndynamic,500\n")  # no metric column
    write_text(tmp_path / "dynamism" / "dynamism.json", "{not json")
    (tmp_path / "probe").mkdir()  # Claim 1's other stage: ran, so that its verdict is read from the unreadable one
    md = write_report(tmp_path)[0].read_text()
    assert "Claim 2 (irreplaceability), NIAH: inconclusive (no ablation results)" in md
    assert "Claim 1 (dynamism), NIAH: inconclusive (" in md


# ---- verdict rules ----------------------------------------------------------------------------------------------
EVIDENCE = EvidenceSettings()  # floor 30, 2000 resamples, seed 0


def _dynamism_data(sets: list[np.ndarray], ranking: list[tuple[int, int]]) -> dict:
    """What the dynamism stage publishes for these dynamic sets (the verdict's input)."""
    return {
        "stats": dynamism_stats(sets, ranking).to_dict(),
        "per_sample": per_sample_dynamism(sets, ranking),
        "static_kind": "copy",
    }


def _random_sets(rng, samples: int, pool: list[tuple[int, int]], per_step: int, steps: int = 10) -> list[np.ndarray]:
    sets = []
    for _ in range(samples):
        sample = np.zeros((steps, LAYERS, HEADS), bool)
        for t in range(steps):
            for i in rng.choice(len(pool), per_step, replace=False):
                sample[(t, *pool[i])] = True
        sets.append(sample)
    return sets


ALL_HEADS = [(layer, head) for layer in range(LAYERS) for head in range(HEADS)]
# the head predictor's within-step ranking against the static profile (Claim 1's deciding rule since issue 59)
BETTER_RANKING = {"step_gap": {"effect": 0.2, "low": 0.1, "high": 0.3, "n": 30}}
NO_BETTER_RANKING = {"step_gap": {"effect": -0.02, "low": -0.04, "high": -0.01, "n": 30}}


def test_claim1_is_not_supported_when_dynamic_sets_stay_inside_the_static_top20():
    """Sets that rotate inside the static top-20: the top-20 Jaccard is low (0.2 = its ceiling) and entropy is
    ln 20 or more, yet the sets never leave the static list: the containment effect decides against the claim."""
    sets = _random_sets(np.random.default_rng(0), 40, ALL_HEADS[:20], per_step=4)
    data = _dynamism_data(sets, ALL_HEADS)
    assert data["stats"]["jaccard_static_k20"] == pytest.approx(0.2)  # what the old rule read as "little overlap"
    verdict = claims.dynamism_verdict(data, "NIAH", EVIDENCE, NO_BETTER_RANKING)
    assert verdict.status == "not supported"
    containment = verdict.descriptive[0]  # descriptive since issue 59: it reads "not supported" here too
    assert containment.decide(EVIDENCE.floor)[0] == "not supported"
    assert containment.interval.effect == 1.0 and containment.interval.n == 40
    assert "top-max(20, |D_t|), share above chance 1.000 [1.000, 1.000] (n=40), rule < 0.8" in verdict.sentence()


def test_claim1_is_supported_when_dynamic_sets_change_and_leave_the_static_list():
    sets = _random_sets(np.random.default_rng(1), 40, ALL_HEADS[20:], per_step=4)
    data = _dynamism_data(sets, ALL_HEADS)
    verdict = claims.dynamism_verdict(data, "NIAH", EVIDENCE, BETTER_RANKING)
    assert verdict.status == "supported", verdict.sentence()
    assert [e.interval.n for e in verdict.effects] == [30]
    assert [e.interval.n for e in verdict.descriptive] == [40, 40, 40]
    shares = verdict.descriptive
    assert shares[0].interval.high < 0.8 and shares[1].interval.high < 0.5
    assert shares[2].interval.low > claims.ENTROPY_SHARE_MIN
    without = claims.dynamism_verdict(data, "NIAH", EVIDENCE)  # the shares alone decide nothing
    assert without.status == "inconclusive" and "no head predictor on this task" in without.reason
    assert data["stats"]["entropy"] > math.log(20)  # the old rule's baseline, beside its chance level
    assert "entropy" in verdict.reason and "random sets" in verdict.reason


def test_claim1_below_the_floor_or_without_per_sample_data_is_inconclusive():
    sets = _random_sets(np.random.default_rng(1), 6, ALL_HEADS[20:], per_step=4)
    six = {"step_gap": {**BETTER_RANKING["step_gap"], "n": 6}}
    small = claims.dynamism_verdict(_dynamism_data(sets, ALL_HEADS), "NIAH", EVIDENCE, six)
    assert small.status == "inconclusive" and "n=6 is below the floor of 30 samples" in small.reason
    assert claims.DECIDE_COMMAND in small.reason
    old = claims.dynamism_verdict({"stats": {"jaccard_static_k20": 0.3}}, "NIAH", EVIDENCE)
    assert old.status == "inconclusive" and "no per-sample shares above chance" in old.reason
    assert claims.dynamism_verdict(None, "NIAH").reason == "no dynamism statistics"


def _arms(rng, n: int, means: dict[str, float]) -> dict[str, np.ndarray]:
    return {name: (rng.random(n) < mean).astype(float) for name, mean in means.items()}


def test_claim2_decides_by_the_interval_of_paired_differences():
    rng = np.random.default_rng(0)
    large = claims.irreplaceability_verdict(
        _arms(rng, 40, {"none": 1.0, "dynamic": 0.05, "static": 0.9, "random": 0.95}),
        "accuracy",
        "NIAH",
        evidence=EVIDENCE,
    )
    assert large.status == "supported" and all(e.interval.low > 0.1 for e in large.effects)
    same = {"none": np.ones(40), "dynamic": np.zeros(40), "static": np.zeros(40), "random": np.ones(40)}
    tie = claims.irreplaceability_verdict(same, "accuracy", "NIAH", evidence=EVIDENCE)
    # 40 ties: the exact interval (the share of unseen samples that could differ) lies wholly below the margin
    assert tie.status == "not supported" and "static - dynamic accuracy 0.000 [-0.088, 0.088] (n=40)" in tie.sentence()
    first30 = {k: v[:30] for k, v in same.items()}
    ties30 = claims.irreplaceability_verdict(first30, "accuracy", "NIAH", evidence=EVIDENCE)
    assert ties30.status == "inconclusive"  # 0/30: the exact bound 0.116 contains the margin (issue 32)
    few = claims.irreplaceability_verdict({k: v[:6] for k, v in same.items()}, "accuracy", "NIAH", evidence=EVIDENCE)
    assert few.status == "inconclusive" and "n=6 is below the floor of 30 samples" in few.reason


def test_claim2_inconclusive_cases():
    dynamic = np.array([0.0] * 9 + [1.0] * 6 + [0.0] * 15)
    control = np.array([1.0] * 9 + [0.0] * 6 + [0.0] * 15)  # differences average exactly the margin, with spread
    noisy = {"none": np.ones(30), "dynamic": dynamic, "static": control, "random": control}
    verdict = claims.irreplaceability_verdict(noisy, "accuracy", "NIAH", evidence=EVIDENCE)
    assert verdict.status == "inconclusive" and "contains 0.1" in verdict.reason
    low = claims.irreplaceability_verdict({**noisy, "none": np.full(30, 0.05)}, "accuracy", "NIAH")
    assert low.status == "inconclusive" and "un-ablated" in low.reason
    assert (
        claims.irreplaceability_verdict({"none": np.ones(3), "dynamic": np.zeros(3)}, "em", "x").status
        == "inconclusive"
    )
    assert claims.irreplaceability_verdict(None, "em", "x").reason == "no ablation results"


def test_the_claims_module_states_claim3s_rule_as_the_code_decides_it():
    """The module's Claim 3 bullet said "above 0.1" and "minus the frequency baseline" after the margin became 0
    and the deciding comparison the better of the frequency and step-index profiles."""
    bullet = claims.__doc__.split("- Claim 3 (correlation):")[1].split("\n- ")[0]
    assert f"at offset {claims.CCA_OFFSET} above {claims.CCA_MARGIN:g} " in bullet
    assert "frequency and step-index profiles" in bullet and f"above {claims.PROBE_MARGIN:g};" in bullet
    assert f"above {claims.SET_PROBE_MARGIN:g} AUPRC" in bullet


def test_claim3_rules():
    good_cca = {"top1": 0.6, "shuffled_top1": 0.3, "gap": 0.3, "gap_low": 0.2, "gap_high": 0.4, "test_samples": 30}
    good_probe = {
        "probe": {"auprc": 0.8},
        "baseline": {"auprc": 0.3},
        "gap": {"effect": 0.5, "low": 0.4, "high": 0.6, "n": 30},
        "position_gap": {"effect": 0.4, "low": 0.3, "high": 0.5, "n": 30},
    }
    assert claims.correlation_verdict(good_cca, good_probe, "auprc", "NIAH").status == "supported"
    small_gap = {**good_cca, "gap": 0.05, "gap_low": 0.01, "gap_high": 0.08}  # margin 0 since issue 59 (report.rules)
    assert claims.correlation_verdict(small_gap, good_probe, "auprc", "NIAH").status == "supported"
    within_gap = {**good_cca, "gap": 0.05, "gap_low": -0.01, "gap_high": 0.08}
    assert claims.correlation_verdict(within_gap, good_probe, "auprc", "NIAH").status == "inconclusive"
    # a predictor that beats the frequency profile only by knowing the step's position: not supported
    positional = {**good_probe, "position_gap": {"effect": -0.05, "low": -0.08, "high": -0.01, "n": 30}}
    verdict = claims.correlation_verdict(good_cca, positional, "auprc", "NIAH")
    assert verdict.status == "not supported" and "(no position control) 0.500" in verdict.sentence()
    broken = {**good_cca, "top1": 0.256, "shuffled_top1": 0.695, "gap": -0.44, "gap_low": -0.6, "gap_high": -0.3}
    verdict = claims.correlation_verdict(broken, good_probe, "auprc", "NIAH")
    assert verdict.status == "inconclusive" and "shuffled-pairing control (0.695) lies above" in verdict.reason
    failed_offset = {"note": "offset 1, held_out: CCA needs at least 3 fit pairs, got 0", "top1": math.nan}
    verdict = claims.correlation_verdict(failed_offset, good_probe, "auprc", "NIAH")
    assert verdict.status == "inconclusive" and "CCA needs at least 3 fit pairs" in verdict.reason
    undefined_r2 = {
        "probe": {"r2": math.nan},
        "baseline": {"r2": math.nan},
        "gap": {"effect": math.nan, "low": math.nan, "high": math.nan, "n": 30},
        "position_gap": {"effect": math.nan, "low": math.nan, "high": math.nan, "n": 30},
    }
    verdict = claims.correlation_verdict(good_cca, undefined_r2, "r2", "Multi-hop")
    assert verdict.status == "inconclusive" and "R² is undefined" in verdict.reason
    partial = claims.correlation_verdict(good_cca, None, "r2", "HotpotQA")
    assert partial.status == "inconclusive" and "no head predictor metrics" in partial.sentence()
    # on Eq. 2 tasks the predictor of D_t decides alone: the CCA, with no power there, is printed beside
    qa = claims.CLAIM3_QA_DECIDING
    for cca in (broken, within_gap):
        verdict = claims.correlation_verdict(cca, good_probe, "auprc", "HotpotQA", deciding=qa)
        assert verdict.status == "supported" and len(verdict.effects) == 1
        assert verdict.effects[0].name.startswith("head predictor - the better of")
        assert any(effect.name.startswith("held-out - shuffled CCA") for effect in verdict.descriptive)
    verdict = claims.correlation_verdict(good_cca, positional, "auprc", "HotpotQA", deciding=qa)
    assert verdict.status == "not supported"
    # the classifier of Eq. 2 sets reads against its own margin: a gap wholly above 0 but not above it decides nothing
    thin = {**good_probe, "position_gap": {"effect": 0.004, "low": 0.001, "high": 0.007, "n": 30}}
    assert 0.001 < claims.SET_PROBE_MARGIN < 0.007
    assert claims.correlation_verdict(good_cca, thin, "auprc", "NIAH").status == "supported"
    margin = claims.SET_PROBE_MARGIN
    verdict = claims.correlation_verdict(good_cca, thin, "auprc", "HotpotQA", deciding=qa, predictor_margin=margin)
    assert verdict.status == "inconclusive" and verdict.effects[0].margin == margin


def test_claim3_shows_mse_beside_the_variance_weighted_r2():
    good_cca = {"top1": 0.6, "shuffled_top1": 0.3, "gap": 0.3, "gap_low": 0.2, "gap_high": 0.4, "test_samples": 30}
    regressor = {
        "probe": {"r2": 0.4, "mse": 0.0012},
        "baseline": {"r2": -0.01, "mse": 0.002},
        "gap": {"effect": 0.41, "low": 0.3, "high": 0.5, "n": 30},
        "position_gap": {"effect": 0.35, "low": 0.25, "high": 0.45, "n": 30},
        "mse_gap": {"effect": 0.0008, "low": 0.0005, "high": 0.0011, "n": 30},
    }
    verdict = claims.correlation_verdict(good_cca, regressor, "r2", "Multi-hop")
    assert verdict.status == "supported"
    assert "MSE probe 0.0012, baseline 0.002, baseline - probe 0.0008 [0.0005, 0.0011] (n=30)" in verdict.reason
    assert verdict.numbers["probe_mse"] == 0.0012 and verdict.numbers["baseline_mse"] == 0.002


def _qa_records(em: list[float], candidates: int | None = 3) -> list[dict]:
    meta = {"candidates": [f"v{i}" for i in range(candidates)]} if candidates else {}
    return [{"answer": "v0", "meta": meta, "metrics": {"em": value, "f1": value}} for value in em]


def test_a_task_at_or_below_chance_is_unsolved():
    at_chance = claims.unsolved_reason(_qa_records([1.0, 0.0, 0.0]), "f1", "Key-value lookup")
    assert at_chance == (
        "the model does not solve Key-value lookup: its un-ablated em is 0.333 (n=3), at or below chance 0.333; "
        "no claim is decided on the heads of a model that fails the task"
    )
    assert claims.unsolved_reason(_qa_records([1.0, 1.0, 0.0]), "f1", "Key-value lookup") == ""
    zero = claims.unsolved_reason(_qa_records([0.0] * 4, candidates=None), "f1", "HotpotQA")
    assert "its un-ablated f1 is 0.000 (n=4), at or below chance 0.000" in zero
    assert claims.unsolved_reason(_qa_records([0.2] * 4, candidates=None), "f1", "HotpotQA") == ""
    assert claims.unsolved_reason([], "f1", "HotpotQA") == ""  # not run: the stages say so


def test_a_task_the_model_does_not_solve_marks_every_verdict_of_that_task(tmp_path):
    root = make_reproduce_dir(tmp_path)
    niah = RunDir(root / "niah")
    for record in niah.records():
        write_json(niah.record_path(record["sample_id"]), {**record, "metrics": {**record["metrics"], "accuracy": 0.0}})
    md = write_report(root)[0].read_text()
    reason = "the model does not solve NIAH: its un-ablated accuracy is 0.000 (n=6), at or below chance 0.000"
    for claim in ("Claim 1 (dynamism)", "Claim 2 (irreplaceability)", "Claim 3 (correlation)"):
        assert f"**Verdict:** {claim}, NIAH: inconclusive ({reason}" in md, claim
    assert "**Verdict:** Dynamic RAG (dynamic beats static), HotpotQA: supported." in md  # its task is solved
    # Its cards say why they show no numbers instead of a table of dashes; a solved task's card keeps its table.
    cards = md[md.index("## Verdicts") : md.index("Rules (docs/report.md)")].split("\n### ")
    niah_card = next(card for card in cards if card.startswith("Claim 1 (dynamism), NIAH: inconclusive"))
    assert f"*no numbers: {reason}" in niah_card and "| ours |" not in niah_card
    rag_card = next(card for card in cards if card.startswith("Dynamic RAG (dynamic beats static), HotpotQA"))
    assert "| ours |" in rag_card and "no numbers" not in rag_card


def test_rag_rule_identical_arms_are_inconclusive_and_a_large_effect_is_supported():
    rng = np.random.default_rng(0)
    same = rng.random(40)
    noise = rng.random(40)
    identical = claims.rag_verdict({5: (same, noise)}, evidence=EVIDENCE)  # two draws of one distribution
    assert identical.status == "inconclusive"
    effect = identical.effects[0].interval
    assert effect.low < 0 < effect.high and "contains 0" in identical.reason
    tie = claims.rag_verdict({5: (same, same.copy())}, evidence=EVIDENCE)
    assert tie.status == "inconclusive"  # a tie decides nothing: its exact interval spans 0
    assert tie.effects[0].interval.low < 0 < tie.effects[0].interval.high
    constant = claims.rag_verdict({5: (same[:6] + 0.2, same[:6])}, evidence=EVIDENCE)
    assert constant.status == "inconclusive"  # +0.2 on each of 6 questions: the unseen share may differ, 0 inside
    assert constant.effects[0].interval.high <= 1.0
    large = claims.rag_verdict({5: (same + 0.3, same)}, evidence=EVIDENCE)
    assert large.status == "supported"
    worse = claims.rag_verdict({5: (same - 0.3, same), 10: (same + 0.3, same)}, evidence=EVIDENCE)
    assert worse.status == "not supported"
    assert claims.rag_verdict({}).status == "inconclusive"


def test_a_partial_study_says_its_cards_are_not_run_and_how_many_stages_are_missing(tmp_path):
    """A study stopped after its first stage (only niah/, logged in stages.json) of a preset whose QA task is the
    key-value lookup: every card "not run" (nothing decided), the top says how many stages are missing and how to
    continue, and no card names HotpotQA (issue 60 item 10)."""
    from dynheads.experiments.reproduce import PRESETS
    from dynheads.tasks.registry import task_of

    qa_source = PRESETS["quick"]["qa_source"]
    lookup = task_of("hotpotqa", qa_source).label
    assert "HotpotQA" not in lookup
    write_json(
        tmp_path / "manifest.json",
        {"kind": "reproduce", "preset": "quick", "model": MODEL, "preset_settings": {"qa_source": qa_source}},
    )
    _traced_run(tmp_path / "niah", "niah", np.random.default_rng(0), 6, NEEDLE, {"accuracy": 1.0})
    write_json(tmp_path / "stages.json", {"niah": {"seconds": 3.0}})
    md_path, html_path = write_report(tmp_path)
    md, page = md_path.read_text(), html_path.read_text()
    verdicts = md[md.index("## Verdicts") : md.index("\n## ", md.index("## Verdicts") + 1)]
    assert verdicts.startswith("## Verdicts\n\n**15 of 16 stages not run yet: run the same command to continue**")
    cards = re.findall(r"^### (.*): (.*)$", verdicts, re.M)
    assert len(cards) == 7 and {status for _, status in cards} == {"not run"}
    assert [card for card, _ in cards if "HotpotQA" in card] == []
    assert sum(lookup in card for card, _ in cards) == 4  # Claims 1-3 and RAG on the preset's QA task
    assert ": inconclusive" not in md
    assert "**Verdict:** Claim 2 (irreplaceability), NIAH: not run (stage ablation not run yet)." in md
    assert "**Verdict:** Claim 1 (dynamism), NIAH: not run (stages dynamism, probe not run yet)." in md
    assert page.count('<span class="badge">not run</span>') == 7 and ">inconclusive<" not in page
    assert "15 of 16 stages not run yet" in page and "HotpotQA run" not in page


def test_a_stage_folder_deleted_after_it_finished_is_named_and_its_card_is_not_run(tmp_path):
    """A copy of a finished study without its ablation/ folder (stages.json still logs the stage as finished):
    the top names the missing folder and how to get it back, the card is "not run" (not "inconclusive") with the
    reason in its verdict, and the stages table says the folder is missing."""
    root = make_reproduce_dir(tmp_path / "study")
    write_json(root / "stages.json", {name: {"seconds": 1.0} for name in stages.STAGES.names()})
    for name in stages.STAGES.names():  # every stage's folder (the fixture's QA analyses: empty), then one lost
        (root / name).mkdir(exist_ok=True)
    shutil.rmtree(root / stages.ABLATION)
    md = write_report(root)[0].read_text()
    verdicts = md[md.index("## Verdicts") : md.index("\n## ", md.index("## Verdicts") + 1)]
    assert verdicts.startswith("## Verdicts\n\n**Stage folders missing: `ablation/`** (stages.json logs it as")
    card = verdicts[verdicts.index("### Claim 2 (irreplaceability), NIAH") :]
    card = card[: card.index("\n### ")]
    assert card.startswith("### Claim 2 (irreplaceability), NIAH: not run")
    assert "NIAH: not run (stage folder ablation/ missing: stages.json logs it as finished)." in md
    assert "| ablation | 1 | its folder is missing |" in md
    assert "stages not run yet" not in md  # reproduce would not run it again: "run the same command" would be wrong


def test_a_finished_study_has_no_missing_stages_line(tmp_path):
    root = make_reproduce_dir(tmp_path / "study")
    write_json(root / "stages.json", {name: {"seconds": 1.0} for name in stages.STAGES.names()})
    for name in stages.STAGES.names():  # a finished study has every stage's folder (the fixture's QA analyses: empty)
        (root / name).mkdir(exist_ok=True)
    md = write_report(root)[0].read_text()
    assert "stages not run yet" not in md and ": not run" not in md


def test_a_failed_stage_makes_its_verdict_inconclusive(tmp_path):
    root = make_reproduce_dir(tmp_path / "study")
    write_json(root / "stages.json", {"cca": {"seconds": 1.0, "error": "CCA needs at least 3 fit pairs, got 0"}})
    md = write_report(root)[0].read_text()
    assert "Claim 3 (correlation), NIAH: inconclusive (stage cca failed: CCA needs at least 3 fit pairs, got 0)" in md


def test_the_default_floor_makes_a_six_sample_study_inconclusive(tmp_path):
    root = make_reproduce_dir(tmp_path / "study")
    md = write_report(root, EvidenceSettings())[0].read_text()
    assert "Claim 2 (irreplaceability), NIAH: inconclusive (" in md and "n=6 is below the floor of 30" in md
    assert claims.DECIDE_COMMAND in md


# ---- per-step data and markdown conversion ------------------------------------------------------------------------
def test_step_view_caps_and_orders_heads(report):
    root, _, _ = report
    view = step_view(root / "niah", "NIAH", "copy", max_samples=4, max_steps=5, max_heads=3)
    assert view["total_samples"] == 6 and [s["id"] for s in view["samples"]] == ["s00", "s02", "s03", "s05"]
    trace = RunDir(root / "niah").load_trace("s00")
    for t, step in enumerate(view["samples"][0]["steps"]):
        assert step["n"] == int(trace.copy_scores[t].sum()) and len(step["h"]) == min(3, step["n"])
        scores = [h[3] for h in step["h"]]
        assert scores == sorted(scores, reverse=True)
        assert all(
            trace.copy_scores[t, layer, head] and pos == trace.argmax_pos[t, layer, head]
            for layer, head, pos, _ in step["h"]
        )
    reasoning = step_view(root / "hotpotqa", "HotpotQA", "reasoning", threshold=0.5, max_heads=100)
    trace = RunDir(root / "hotpotqa").load_trace("s00")
    assert [s["n"] for s in reasoning["samples"][0]["steps"]] == list((trace.reasoning_scores > 0.5).sum((1, 2)))


def test_spans_and_markdown_html():
    assert spans([5, 3, 4, 9, 10, 4]) == [[3, 6], [9, 11]] and spans([]) == []
    page = markdown_html(
        "# Title <x>\n\nSome **bold** and `code` *here*.\n\n| a | b \\| c |\n|---|---|\n| 1 | 2 |\n\n- item"
    )
    assert "<h1>Title &lt;x&gt;</h1>" in page and "<strong>bold</strong>" in page and "<em>here</em>" in page
    assert "<th>b | c</th>" in page and "<td>2</td>" in page and "<ul><li>item</li></ul>" in page


def test_the_verdict_rules_line_has_its_numbers_filled_in():
    # The rules line once printed "k={CCA_OFFSET} at least {CCA_MARGIN}" (a string that was not an f-string).
    from dynheads.report import claims

    assert "{" not in claims.RULES and "}" not in claims.RULES
    assert f"CCA top-1 at k={claims.CCA_OFFSET} > {claims.CCA_MARGIN}" in claims.RULES


def test_report_command_rewrites_the_report_and_refuses_other_folders(tmp_path):
    root = make_reproduce_dir(tmp_path / "study")
    done = subprocess.run(
        [sys.executable, "-m", "dynheads", "report", str(root)], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (root / "report.md").read_text(encoding="utf-8").startswith("#") and (root / "report.html").is_file()
    other = subprocess.run(
        [sys.executable, "-m", "dynheads", "report", str(tmp_path)], capture_output=True, text=True, timeout=300
    )
    assert other.returncode == 2 and "not a study folder" in other.stderr and "Traceback" not in other.stderr


def test_paths_inside_the_study_read_relative_to_it_also_after_the_study_is_moved(tmp_path):
    written = make_reproduce_dir(tmp_path / "written")
    manifest = json.loads((written / "manifest.json").read_text(encoding="utf-8"))
    write_json(written / "manifest.json", {**manifest, "folder": str(written.resolve())})
    md = write_report(written)[0].read_text(encoding="utf-8")
    assert str(written) in json.dumps(json.loads((written / "dynamism" / "summary.json").read_text(encoding="utf-8")))
    assert "#### Dynamism of niah" in md and "static list (copy): static/static_heads.json" in md
    assert str(written) + "/" not in md
    assert f"| folder | {written.resolve()} |" in md  # where it was written, in the run's section

    moved = Path(shutil.move(written, tmp_path / "moved"))
    md_path, html_path = write_report(moved)
    md, page = md_path.read_text(encoding="utf-8"), html_path.read_text(encoding="utf-8")
    assert "#### Dynamism of niah" in md and "static list (copy): static/static_heads.json" in md
    for text in (md, page):
        assert str(written) + "/" not in text and str(moved) + "/" not in text


def test_claim3_on_hotpotqa_is_decided_by_the_predictor_of_the_eq2_sets_not_the_share_regressor(tmp_path):
    """Claim 3 on an Eq. 2 task reads the CCA and the classifier of D_t (``hotpotqa-set-probe``, AUPRC), as on NIAH;
    the regressor of the shares (``hotpotqa-probe``, R², the paper's Table 3) is shown beside and decides nothing."""
    root = make_reproduce_dir(tmp_path / "study")
    shutil.copytree(root / "cca", root / "hotpotqa-cca")
    shutil.copytree(root / "probe", root / "hotpotqa-set-probe")
    regressor = {
        "probe": {"r2": -0.2, "mse": 0.1},
        "baseline": {"r2": 0.0, "mse": 0.08},
        "gap": {"metric": "r2", "effect": -0.25, "low": -0.4, "high": -0.1, "n": 6},
        "position_gap": {"metric": "r2", "effect": -0.3, "low": -0.45, "high": -0.15, "n": 6},
    }
    write_json(root / "hotpotqa-probe" / "metrics.json", {"task": "continuous", "score": "reasoning", **regressor})
    md = write_report(root)[0].read_text(encoding="utf-8")
    start = md.index("## Claim 3, correlation, on HotpotQA")
    claim3 = md[start : md.index("## Dynamic RAG", start)]
    gap = "head predictor - the better of the frequency and step-index profiles AUPRC 0.300 [0.150, 0.450] (n=6)"
    assert f"{gap}, rule > {claims.SET_PROBE_MARGIN:g}" in claim3  # the classifier of Eq. 2 sets: its own margin
    assert "R2 -0.300" not in claim3 and "R² -0.300" not in claim3
    assert "### Stage `hotpotqa-set-probe/`" in claim3 and "### Stage `hotpotqa-probe/`" in claim3
    assert "Table 3" in claim3
