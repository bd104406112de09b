"""Disjoint question streams (issue 11, item 1), static reasoning heads (item 4), skipped HotpotQA cells (item 7)."""

from __future__ import annotations

import json
import subprocess
import sys
from itertools import combinations

import numpy as np
import pandas as pd
import pytest

from dynheads.analysis.headlists import load_head_list, scored_heads
from dynheads.analysis.settings import HeadPredictorConfig
from dynheads.errors import DynheadsError
from dynheads.experiments.ablation import AblationConfig, run_ablation
from dynheads.experiments.hotpotqa import HotpotConfig, hotpot_grid, run_hotpotqa
from dynheads.experiments.rag import RagConfig, run_rag
from dynheads.experiments.reproduce import PRESETS, hotpot_streams
from dynheads.experiments.static import StaticReasoningConfig, run_static_reasoning
from dynheads.io import read_json
from dynheads.runs import RunDir
from dynheads.tasks import hotpotqa as hq
from dynheads.tasks.questions import QuestionStream, disjoint_streams, refuse_overlap
from dynheads.views.probing import train_probe_on_run


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dynheads", *args], capture_output=True, text=True, timeout=600)


# ---- streams ----------------------------------------------------------------------------------------------------
def test_streams_are_laid_end_to_end_and_refuse_a_short_source():
    streams = disjoint_streams([("static", 3), ("analysis", 4), ("rag", 2)], first=1)
    assert [(s.first, s.stop) for s in streams.values()] == [(1, 4), (4, 8), (8, 10)]
    records = hq.synthetic_hotpotqa(10, 0)
    assert [r.id for r in streams["rag"].take(records, "src")] == ["synthetic-0-00008", "synthetic-0-00009"]
    with pytest.raises(DynheadsError, match="holds 9 questions, but stream 'rag' needs questions 8..9"):
        streams["rag"].take(records[:9], "src")
    with pytest.raises(DynheadsError, match="named twice"):
        disjoint_streams([("a", 1), ("a", 1)])
    with pytest.raises(DynheadsError, match="at least one question"):
        QuestionStream("x", 0, 0)


def test_overlap_error_names_the_first_ids_and_the_count():
    refuse_overlap(["a", "b"], "probe", ["c"], "rag")  # disjoint: nothing happens
    with pytest.raises(DynheadsError) as error:
        refuse_overlap([f"q{i}" for i in range(10)], "the probe", [f"q{i}" for i in range(3, 20)], "this run")
    message = str(error.value)
    assert "\n" not in message and "7 of the questions" in message and "q3, q4, q5, q6, q7 and 2 more" in message


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_reproduce_streams_are_disjoint_by_construction(preset):
    streams = hotpot_streams(PRESETS[preset])
    assert list(streams) == ["static", "analysis", "ablation", "progressive", "rag"]
    for a, b in combinations(streams.values(), 2):
        assert a.stop <= b.first or b.stop <= a.first, (a, b)


def test_the_synthetic_source_is_the_same_whatever_its_length():
    """Stream ranges index one source: generating more questions never changes the earlier ones."""
    assert hq.synthetic_hotpotqa(3, 7) == hq.synthetic_hotpotqa(6, 7)[:3]


# ---- probe records its questions; rag refuses an overlapping probe -----------------------------------------------
@pytest.fixture(scope="module")
def probe_dir(tiny_lm, tiny_model_dir, tmp_path_factory):
    root = tmp_path_factory.mktemp("probe-run")
    config = HotpotConfig(model=str(tiny_model_dir), questions=6, lengths=(300,), depths=(0.5,), max_new_tokens=3)
    run_hotpotqa(config, root / "run", lm=tiny_lm, progress=False)
    train_probe_on_run(
        root / "run",
        HeadPredictorConfig(hidden_sizes=(8,), epochs=1),
        score="reasoning",
        out_dir=root / "probe",
        progress=False,
    )
    return root


def test_probe_folder_records_its_split_question_ids(probe_dir):
    data = read_json(probe_dir / "probe" / "questions.json")
    manifest = RunDir(probe_dir / "run").manifest()
    ids = manifest["questions"]["ids"]
    assert ids == [f"synthetic-0-{i:05d}" for i in range(6)]
    assert manifest["questions"]["split"] == "analysis" and manifest["questions"]["first"] == 0
    assert data["split_exact"] is True
    parts = [set(data[name]) for name in ("train", "validation", "test")]
    assert set().union(*parts) == set(ids) and sum(map(len, parts)) == 6
    assert len(parts[0]) == 4 and len(parts[1]) == 1 and len(parts[2]) == 1
    assert data["run_questions"]["ids"] == ids


def test_rag_refuses_a_probe_trained_on_its_questions(probe_dir, tiny_model_dir, tmp_path):
    fitted = read_json(probe_dir / "probe" / "questions.json")
    leaked = sorted(set(fitted["train"]) | set(fitted["validation"]))
    args = [
        "rag",
        "--model",
        str(tiny_model_dir),
        "--probe",
        str(probe_dir / "probe"),
        "--strategies",
        "dynamic",
        "--k",
        "2",
        "--lengths",
        "300",
        "--max-new-tokens",
        "2",
    ]
    result = run_cli(*args, "--questions", "6", "--out", str(tmp_path / "leak"))
    assert result.returncode == 2, result.stderr
    line = result.stderr.strip().splitlines()[-1]  # after the model-loading bar
    assert line.startswith("error: the probe in") and "Traceback" not in result.stderr
    assert f"fitted on {len(leaked)} of the questions" in line and leaked[0] in line
    assert not (tmp_path / "leak").exists()  # refused before any work

    clean = run_cli(*args, "--questions", "1", "--first", "6", "--out", str(tmp_path / "clean"))
    assert clean.returncode == 0, clean.stderr
    manifest = RunDir(tmp_path / "clean").manifest()
    assert manifest["questions"]["ids"] == ["synthetic-0-00006"] and manifest["probe_questions_checked"]


def test_rag_refuses_a_probe_that_records_no_questions(probe_dir, tiny_lm, tmp_path):
    import shutil

    shutil.copytree(probe_dir / "probe", tmp_path / "probe")
    (tmp_path / "probe" / "questions.json").unlink()
    config = RagConfig(
        probe=str(tmp_path / "probe"), strategies=("dynamic",), ks=(2,), questions=1, first=6, lengths=(300,)
    )
    with pytest.raises(DynheadsError, match="records no training questions"):
        run_rag(config, tmp_path / "rag", lm=tiny_lm, progress=False)


def test_rag_refuses_more_heads_than_the_model_has_before_it_writes_anything(tiny_lm, tmp_path):
    heads = tiny_lm.num_layers * tiny_lm.num_heads
    config = RagConfig(strategies=("fixed-random", "none"), ks=(heads + 1,), questions=1, first=6, lengths=(300,))
    with pytest.raises(DynheadsError, match=f"k={heads + 1} heads asked, but the model has {heads} heads"):
        run_rag(config, tmp_path / "rag", lm=tiny_lm, progress=False)
    assert not (tmp_path / "rag").exists()  # a started run would have kept the k and refused the corrected one


# ---- static reasoning heads, never padded with zero-score heads --------------------------------------------------
def test_static_reasoning_heads_are_the_mean_eq2_over_steps_then_questions(tiny_lm, tiny_model_dir, tmp_path):
    config = StaticReasoningConfig(
        model=str(tiny_model_dir), questions=3, first=10, lengths=(300,), depths=(0.5,), max_new_tokens=3
    )
    heads = run_static_reasoning(config, tmp_path / "static", lm=tiny_lm, progress=False)
    run = RunDir(tmp_path / "static")
    traces = [trace for _, trace in run.iter_traces()]
    expected = np.mean([t.reasoning_scores.astype(np.float64).mean(axis=0) for t in traces], axis=0)
    np.testing.assert_allclose(heads.mean_scores, expected, rtol=1e-12)
    listed = load_head_list(tmp_path / "static" / "static_heads.json", tiny_lm.num_layers, tiny_lm.num_heads)
    assert listed.heads[0] == tuple(np.unravel_index(np.argmax(expected), expected.shape))
    summary = read_json(tmp_path / "static" / "static_summary.json")
    assert summary["split"] == "static"
    assert summary["questions"]["ids"] == [f"synthetic-0-{i:05d}" for i in (10, 11, 12)]
    assert run.manifest()["questions"]["split"] == "static"

    # an evaluation on the same questions is refused; one on other questions is not
    overlapping = RagConfig(
        static=str(tmp_path / "static" / "static_heads.json"),
        strategies=("static",),
        ks=(2,),
        questions=2,
        first=11,
        lengths=(300,),
        max_new_tokens=2,
    )
    with pytest.raises(DynheadsError, match=r"static head list .* fitted on 2 of the questions"):
        run_rag(overlapping, tmp_path / "rag", lm=tiny_lm, progress=False)
    ablation = AblationConfig(
        task="hotpotqa",
        strategies=("static",),
        static=overlapping.static,
        questions=1,
        first=12,
        lengths=(300,),
        depths=(0.5,),
        max_new_tokens=2,
    )
    with pytest.raises(DynheadsError, match="fitted on 1 of the questions"):
        run_ablation(ablation, tmp_path / "ablation", lm=tiny_lm, progress=False)


def _wu_file(path, scores: dict[str, float]) -> str:
    path.write_text(json.dumps({key: [value] for key, value in scores.items()}))
    return str(path)


def test_zero_score_heads_are_never_used_as_static_heads(tiny_lm, tmp_path):
    scores = {f"{layer}-{head}": 0.0 for layer in range(3) for head in range(4)}
    scores["2-3"] = 0.4
    path = _wu_file(tmp_path / "static.json", scores)
    ranked = load_head_list(path)
    assert ranked.heads[:3] == ((2, 3), (0, 0), (0, 1))  # the file ranks zero heads in index order: the old filler
    assert scored_heads(ranked) == ((2, 3),)

    from dynheads.resources import Evaluated, static_heads

    assert static_heads(path, (tiny_lm.num_layers, tiny_lm.num_heads), Evaluated("a run")).ranking == ((2, 3),)
    config = RagConfig(
        static=path,
        strategies=("static",),
        ks=(3,),
        questions=1,
        first=20,
        lengths=(300,),
        max_new_tokens=4,
        draft_tokens=2,
        threshold=0.0,
    )
    run = run_rag(config, tmp_path / "rag", lm=tiny_lm, progress=False)
    (record,) = run.records()
    assert record["k"] == 3 and record["heads_used"] == 1
    assert all(heads == [[2, 3]] for heads in record["heads"])
    assert run.manifest()["static_scored_heads"] == 1
    assert (
        "only 1 heads" in (run.path / "rag.md").read_text()
        and "never zero-score filler" in (run.path / "rag.md").read_text()
    )

    _wu_file(tmp_path / "zero.json", {key: 0.0 for key in scores})
    with pytest.raises(DynheadsError, match="zero score"):
        run_rag(
            RagConfig(
                static=str(tmp_path / "zero.json"),
                strategies=("static",),
                ks=(2,),
                questions=1,
                first=20,
                lengths=(300,),
            ),
            tmp_path / "rag0",
            lm=tiny_lm,
            progress=False,
        )


# ---- real-layout HotpotQA: a question too long for a small cell is skipped, counted and shown ---------------------
def _official_file(path) -> str:
    """An official dev-distractor-layout file: seven ordinary questions and one whose gold paragraph is long."""
    records = [r.to_dict("official") for r in hq.synthetic_hotpotqa(7, 3)]
    long_text = [f" The old mill of Varden was rebuilt in year {1700 + i} by the guild of masons." for i in range(30)]
    long_record = {
        "_id": "5a8b57f25542995d1e6f1371",
        "question": "Which guild rebuilt the old mill of Varden?",
        "answer": "the guild of masons",
        "supporting_facts": [["Varden mill", 0], ["Masons guild", 0]],
        "context": [
            ["Varden mill", ["The old mill of Varden stands by the river."] + long_text],
            ["Masons guild", ["The guild of masons is based in Varden."]],
            *records[0]["context"][:3],
        ],
        "type": "bridge",
        "level": "hard",
    }
    path.write_text(json.dumps([long_record, *records]), encoding="utf-8")
    return str(path)


def test_too_long_questions_are_skipped_counted_and_blank_in_every_command(tiny_lm, tiny_model_dir, tmp_path):
    data = _official_file(tmp_path / "hotpot_dev_distractor_v1.json")
    grid = hotpot_grid(HotpotConfig(data=data, questions=4, lengths=(200, 700), depths=(0.5,)), tiny_lm.tokenizer)
    assert grid.skipped == [
        {"record_id": "5a8b57f25542995d1e6f1371", "length": 200, "depth": 0.5, "reason": hq.GoldTooLong.reason}
    ]
    assert len(grid.samples) == 3 and grid.skip_counts()["by_cell"] == {"200/0.5": 1}

    common = ["--model", str(tiny_model_dir), "--data", data, "--lengths", "200,700", "--max-new-tokens", "2"]
    traced = run_cli("hotpotqa", *common, "--questions", "2", "--depths", "0.5", "--out", str(tmp_path / "trace"))
    assert traced.returncode == 0, traced.stderr
    assert "1 (question, cell) pairs skipped (1 gold paragraphs longer than the context)" in traced.stdout
    assert RunDir(tmp_path / "trace").manifest()["skipped"]["count"] == 1

    rag = run_cli(
        "rag", *common, "--questions", "2", "--depths", "0.5", "--strategies", "none", "--out", str(tmp_path / "rag")
    )
    assert rag.returncode == 0, rag.stderr
    assert (
        "1 (question, cell) pairs skipped" in rag.stdout
        and "1 (question, cell) pairs skipped" in (tmp_path / "rag" / "rag.md").read_text()
    )

    config = AblationConfig(
        model=str(tiny_model_dir),
        task="hotpotqa",
        data=data,
        strategies=("dynamic", "random"),
        questions=2,
        lengths=(200, 700),
        depths=(0.5,),
        max_new_tokens=2,
    )
    run_ablation(config, tmp_path / "ablation", lm=tiny_lm, progress=False)
    cells = pd.read_csv(tmp_path / "ablation" / "cells.csv")
    blank = cells[cells["length"] == 200]
    assert set(blank["strategy"]) == {"none", "dynamic", "random"}
    assert (blank["samples"] == 0).all() and (blank["skipped"] == 1).all() and blank["f1"].isna().all()
    assert (cells[cells["length"] == 700]["samples"] == 1).all()
    assert "Skipped (question, cell) pairs: 1" in (tmp_path / "ablation" / "summary.md").read_text()
    assert (tmp_path / "ablation" / "plots" / "ablation-f1.png").is_file()


def test_a_single_sample_that_does_not_fit_is_still_refused(tiny_lm, tmp_path):
    """Only grid runs skip: building one sample that cannot fit stays a clear error (a DynheadsError)."""
    record = hq.load_hotpotqa(_official_file(tmp_path / "dev.json"))[0]
    with pytest.raises(DynheadsError, match="too small for the gold paragraphs"):
        hq.make_sample(tiny_lm.tokenizer, record, context_tokens=200, depth=0.5, seed=0)
