"""``static``, ``dynamism``, ``plot heads``, ``cca`` and ``probe train`` through the CLI and the Python API.

A tiny random model almost never copies the needle, so the statistics are checked on run directories built by
hand (``RunDir`` + hand-made ``Trace`` objects, 2 layers x 3 heads) where the answer is known; the tiny model
checks the tracing path of ``static``. Flat head indices (layer-major): (0,0)=0 (0,1)=1 (0,2)=2 (1,0)=3 ...
"""

from __future__ import annotations

import json
import math
import re
import sys

import numpy as np
import pandas as pd
import pytest

from dynheads.analysis.dynamism import dynamism_stats
from dynheads.analysis.head_predictor import load_head_predictor
from dynheads.analysis.headlists import load_head_list
from dynheads.cli.app import main
from dynheads.experiments.static import StaticConfig, write_static
from dynheads.io import write_json
from dynheads.runs import RunDir
from dynheads.traces import Trace
from dynheads.views.analyses import dynamism_report, plot_heads

SHAPE = (2, 3)
UUID = "3f2a9c1e-7b4d-4e8a-9c1f-2d3e4f5a6b7c"


def make_trace(copy: np.ndarray, hidden: np.ndarray | None = None, reasoning: np.ndarray | None = None) -> Trace:
    steps = copy.shape[0]
    zeros = np.zeros(copy.shape, np.float32)
    return Trace(
        tokens=np.arange(steps, dtype=np.int64),
        token_texts=[f"t{i}" for i in range(steps)],
        text="",
        argmax_pos=zeros.astype(np.int32),
        needle_mass=zeros,
        scores={"copy": copy, "reasoning": copy.astype(np.float32) * 0.5 if reasoning is None else reasoning},
        max_prob=zeros,
        hidden=np.zeros((steps, 4), np.float32) if hidden is None else hidden,
        prompt_length=10,
        stop_reason="eos",
    )


def sets(*steps: set[int]) -> np.ndarray:
    out = np.zeros((len(steps), *SHAPE), dtype=bool)
    for t, active in enumerate(steps):
        for index in active:
            out[t, index // SHAPE[1], index % SHAPE[1]] = True
    return out


def new_run(path) -> RunDir:
    run = RunDir(path)
    run.start("niah", {"seed": 0}, None)
    return run


@pytest.fixture
def known_run(tmp_path) -> RunDir:
    """s0 passes the success filter (4 answer tokens), s1 does not."""
    run = new_run(tmp_path / "known")
    for sample_id, steps, generated in (("s0", sets({0, 1}, {1, 2}, set()), f"It is {UUID}."), ("s1", sets({1}), "?")):
        record = {"sample_id": sample_id, "answer": UUID, "answer_token_count": 4, "generated": generated}
        run.save_sample(record, make_trace(steps))
    write_json(tmp_path / "static.json", ["0-1", "1-0"])  # a ranked list: S_1 = {1}, S_2 = {1, 3}
    return run


@pytest.fixture(scope="module")
def random_run(tmp_path_factory) -> RunDir:
    """9 samples of 12 steps with random hidden states, copy scores and reasoning scores."""
    rng = np.random.default_rng(0)
    run = new_run(tmp_path_factory.mktemp("random") / "run")
    for i in range(9):
        copy = rng.random((12, *SHAPE)) < 0.3
        trace = make_trace(
            copy, rng.normal(size=(12, 8)).astype(np.float32), rng.random((12, *SHAPE)).astype(np.float32)
        )
        run.save_sample({"sample_id": f"r{i}"}, trace)
    return run


def cli(capsys, *args: str) -> tuple[int, str, str]:
    """Run ``dynheads ARGS`` in this process (as the console script does); (exit code, stdout, stderr)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sys, "argv", ["dynheads", *map(str, args)])
        with pytest.raises(SystemExit) as exit_info:
            main()
    captured = capsys.readouterr()
    return exit_info.value.code, captured.out, captured.err


# ---- static ---------------------------------------------------------------------------------------------------
def test_samples_fill_whole_passes_of_the_grid_on_the_static_split():
    niah = StaticConfig(samples=20).niah_config()
    assert niah.runs == 2 and niah.split == "static"  # 20 samples on 3 x 5 cells -> 2 runs per cell
    assert StaticConfig(samples=15, lengths=(500,), depths=(0.0, 1.0)).niah_config().runs == 8


def test_static_files_from_a_hand_made_run(known_run):
    heads = write_static(known_run, StaticConfig())
    assert heads.num_tests == 2 and heads.pass_rate == 0.5  # s1's "?" fails the ROUGE-1 filter
    # s0: head 0 copies once, head 1 twice, head 2 once, over 4 answer tokens.
    assert load_head_list(known_run.path / "static_heads.json").test_scores[(0, 1)] == (0.5,)
    ranking = pd.read_csv(known_run.path / "static_ranking.csv")
    assert list(ranking["head"][:3]) == ["L0-H1", "L0-H0", "L0-H2"] and ranking["mean_score"][0] == 0.5
    assert list(ranking["rank"]) == list(range(1, 7))
    summary = json.loads((known_run.path / "static_summary.json").read_text())
    assert summary["pass_rate"] == 0.5 and summary["num_counted"] == 1 and "disjoint" in summary["note"]


def test_static_cli_on_the_tiny_model(tiny_model_dir, tmp_path, capsys):
    out = tmp_path / "static"
    args = (
        "static",
        "--model",
        tiny_model_dir,
        "--samples",
        "2",
        "--lengths",
        "200",
        "--depths",
        "0,1",
        "--max-new-tokens",
        "3",
        "--out",
        out,
    )
    code, _, err = cli(capsys, *args)
    # Three tokens cannot hold a UUID: no test passes, and the error says so instead of writing an empty file.
    assert code == 2 and "pass rate 0/2" in err and not (out / "static_heads.json").exists()
    assert sorted(p.name for p in (out / "samples").iterdir()) == [
        "static-len200-depth0-run0.json",
        "static-len200-depth1-run0.json",
    ]
    run = RunDir(out)
    for record in run.records():  # pretend the model answered: the real records then score and write
        write_json(run.record_path(record["sample_id"]), {**record, "generated": record["answer"]})
    code, stdout, _ = cli(capsys, *args)  # resumes: nothing left to trace
    assert code == 0 and "pass rate 2/2 (100%)" in stdout
    scored = re.search(r"top-20 \(only (\d+) heads score above 0\): (.*)", stdout)  # a 12-head model
    listed = load_head_list(out / "static_heads.json", 3, 4)
    assert listed.scores is not None and scored is not None
    above_0 = [
        f"L{layer}-H{head}" for (layer, head), score in zip(listed.heads, listed.scores, strict=True) if score > 0
    ]
    assert scored[2].split() == above_0[:20] and int(scored[1]) == len(above_0) < 20
    assert len(load_head_list(out / "static_heads.json", 3, 4).heads) == 12


# ---- dynamism -------------------------------------------------------------------------------------------------
def test_dynamism_numbers_and_files(known_run, tmp_path, capsys):
    code, stdout, _ = cli(
        capsys, "dynamism", known_run.path, "--static", tmp_path / "static.json", "--out", tmp_path / "report"
    )
    assert code == 0 and "## Table 1" in stdout and "## Table 5" in stdout and "llama3.1-8b (paper)" in stdout
    stats = json.loads((tmp_path / "report" / "dynamism.json").read_text())["stats"]
    # Sizes 2, 2, 0, 1; union {0, 1, 2}; adjacent pairs 1/3 and 0; head counts 1, 3, 1.
    assert stats["mean_size"] == 1.25 and stats["std_size"] == pytest.approx(math.sqrt(0.6875))
    assert (stats["unique_heads"], stats["total_heads"], stats["empty_steps"]) == (3, 6, 1)
    assert stats["adjacent_jaccard"] == pytest.approx(1 / 6) and stats["adjacent_pairs"] == 2
    assert stats["entropy"] == pytest.approx(-(0.4 * math.log(0.2) + 0.6 * math.log(0.6)))
    assert math.isnan(stats["jaccard_static_k20"])  # the list has 2 heads
    table = pd.read_csv(tmp_path / "report" / "dynamism.csv", index_col="model")
    assert len(table) == 6 and table.loc["known (ours)", "mean_size"] == 1.25


def test_dynamism_api_with_small_k_and_reasoning_scores(known_run, tmp_path):
    copy = dynamism_report(known_run.path, tmp_path / "static.json", ks=(1, 2))
    assert copy.jaccard_static[1] == 0.5 and copy.jaccard_static[2] == pytest.approx((2 / 3 + 1 / 2) / 4)
    # The reasoning scores of this run are 0.5 where the copy score is 1: above 0.1 they give the same sets.
    assert (
        dynamism_report(known_run.path, tmp_path / "static.json", score="reasoning", threshold=0.1, ks=(1, 2)) == copy
    )
    assert (
        dynamism_report(known_run.path, tmp_path / "static.json", score="reasoning", threshold=0.6, ks=(1,)).mean_size
        == 0
    )
    assert (known_run.path / "dynamism.md").is_file()


def test_dynamism_on_a_random_run_matches_the_statistics(random_run, tmp_path):
    write_json(tmp_path / "static.json", ["1-2", "0-0"])
    stats = dynamism_report(random_run.path, tmp_path / "static.json", ks=(2,), out_dir=tmp_path)
    assert stats == dynamism_stats([t.copy_scores for _, t in random_run.iter_traces()], [(1, 2), (0, 0)], ks=(2,))


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("bad_heads", "does not have: L5-H0"),
        ("empty_run", "has no traced samples yet"),
        ("not_a_run", "is not a dynheads run directory"),
        ("bad_score", "score must be one of copy, reasoning"),
    ],
)
def test_dynamism_errors_are_one_line(known_run, tmp_path, capsys, setup, message):
    run_dir, static, extra = known_run.path, tmp_path / "static.json", []
    if setup == "bad_heads":
        write_json(static, ["0-1", "5-0"])
    elif setup == "empty_run":
        run_dir = new_run(tmp_path / "empty").path
    elif setup == "not_a_run":
        run_dir = tmp_path
    else:
        extra = ["--score", "attention"]
    code, _, err = cli(capsys, "dynamism", run_dir, "--static", static, *extra)
    assert code == 2 and err.count("\n") == 1 and message in err, err


# ---- plot, cca, probe -----------------------------------------------------------------------------------------
def test_plot_heads(random_run, tmp_path, capsys):
    code, stdout, _ = cli(
        capsys, "plot", "heads", random_run.path, "--sample", "r1", "--sample", "r4", "--out", tmp_path
    )
    assert code == 0 and stdout.split() == [str(tmp_path / "heads-r1.png"), str(tmp_path / "heads-r4.png")]
    assert (tmp_path / "heads-r4.png").read_bytes()[:4] == b"\x89PNG"
    code, _, err = cli(capsys, "plot", "heads", random_run.path, "--sample", "nope")
    assert code == 2 and "no trace for sample 'nope'" in err


def test_plot_heads_api_defaults_to_every_sample(known_run):
    paths = plot_heads(known_run.path, score="reasoning", top=3)
    assert paths == [known_run.path / "plots" / "heads-s0.png", known_run.path / "plots" / "heads-s1.png"]
    assert all(path.is_file() for path in paths)


def test_cca(random_run, tmp_path, capsys):
    code, stdout, _ = cli(capsys, "cca", random_run.path, "--offsets", "0-1", "--out", tmp_path)
    assert code == 0 and "| 1 | shuffled |" in stdout
    table = pd.read_csv(tmp_path / "cca.csv")
    assert sorted(zip(table["offset"], table["method"], strict=True)) == sorted(
        (k, m) for k in (0, 1) for m in ("in_sample", "held_out", "shuffled")
    )
    assert (tmp_path / "cca.png").is_file() and (tmp_path / "cca.md").is_file()
    assert json.loads((tmp_path / "cca.json").read_text())["model"] == "run"


@pytest.mark.parametrize(("score", "expected"), [("copy", "Table 2"), ("reasoning", "Table 3")])
def test_probe_train(random_run, tmp_path, capsys, score, expected):
    code, stdout, _ = cli(
        capsys,
        "probe",
        "train",
        random_run.path,
        "--score",
        score,
        "--hidden-sizes",
        "8",
        "--epochs",
        "2",
        "--out",
        tmp_path,
    )
    assert code == 0 and f"llama3.1-8b (paper, {expected})" in stdout and "frequency baseline (ours)" in stdout
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["task"] == ("binary" if score == "copy" else "continuous") and metrics["epochs_run"] == 2
    assert set(metrics["probe"]) == set(metrics["baseline"]) and "llama2-13b" in metrics["paper"]
    probe = load_head_predictor(tmp_path)
    assert probe.predict(np.zeros((1, 8), np.float32)).shape == (1, 6)


def test_flags_reach_the_predictor_and_cca_configs_parsed(random_run, tmp_path, capsys, monkeypatch):
    """The options are generated from HeadPredictorConfig / CCAConfig: lists, switches and modes arrive parsed;
    flags not given keep the config file's value, else the default."""
    import dynheads.views.analyses as analyses
    import dynheads.views.probing as probing
    from dynheads.analysis.settings import CCAConfig, HeadPredictorConfig

    seen: dict = {}

    def fake_train(run_dir, config, score, out_dir, device, sets):
        seen["predictor"], seen["predictor_score"], seen["sets"] = config, score, sets
        out_dir.mkdir(exist_ok=True)
        (out_dir / "metrics.md").write_text("metrics\n")

    def fake_cca(run_dir, steps, config, score, out_dir):
        seen["cca"], seen["cca_score"], seen["steps"] = config, score, steps
        return pd.DataFrame()

    monkeypatch.setattr(probing, "train_probe_on_run", fake_train)
    monkeypatch.setattr(analyses, "cca_report", fake_cca)
    monkeypatch.setattr("dynheads.analysis.cca.cca_markdown", lambda table: "table\n")
    toml = tmp_path / "probe.toml"
    toml.write_text("epochs = 7\ndropout = 0.2\n")
    args = ["--split", "0.6,0.2,0.2", "--no-standardize", "--activation", "gelu", "--epochs", "3", "--config", toml]
    code, _, err = cli(capsys, "predictor", "train", random_run.path, "--score", "reasoning", *args, "--out", tmp_path)
    assert code == 0, err
    predictor = seen["predictor"]
    assert predictor.split == (0.6, 0.2, 0.2) and predictor.standardize is False and predictor.activation == "gelu"
    assert predictor.epochs == 3 and predictor.dropout == 0.2  # the flag beats the file; the file beats the default
    assert predictor.lr == HeadPredictorConfig().lr and seen["predictor_score"] == "reasoning"
    assert seen["sets"] is None  # no --threshold: the scores themselves are learned
    code, _, err = cli(capsys, "cca", random_run.path, "--offsets", "0,2", "--ridge", "0", "--resamples", "50")
    assert code == 0, err
    assert seen["cca"] == CCAConfig(ridge=0.0, resamples=50) and seen["cca_score"] == "copy" and seen["steps"] == (0, 2)


# ---- empty traces (EOS as the first token) ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def run_with_empty_trace(tmp_path_factory) -> RunDir:
    """6 samples of 10 random steps plus one that generated nothing (EOS first), written and read back."""
    rng = np.random.default_rng(1)
    run = new_run(tmp_path_factory.mktemp("empty") / "run")
    for i in range(6):
        trace = make_trace(
            rng.random((10, *SHAPE)) < 0.3,
            rng.normal(size=(10, 8)).astype(np.float32),
            rng.random((10, *SHAPE)).astype(np.float32),
        )
        run.save_sample({"sample_id": f"r{i}"}, trace)
    empty = make_trace(np.zeros((0, *SHAPE), bool), np.zeros((0, 8), np.float32))
    run.save_sample({"sample_id": "r9-empty"}, empty)
    assert run.load_trace("r9-empty").num_steps == 0
    return run


def test_empty_traces_are_skipped_and_counted_by_cca(run_with_empty_trace, tmp_path, capsys):
    code, stdout, stderr = cli(capsys, "cca", run_with_empty_trace.path, "--offsets", "0-1", "--out", tmp_path)
    assert code == 0, stderr
    saved = json.loads((tmp_path / "cca.json").read_text())
    assert saved["samples"] == 6 and saved["empty_samples_skipped"] == 1
    assert "1 sample(s) with no generated token skipped" in (tmp_path / "cca.md").read_text()


@pytest.mark.parametrize("score", ["copy", "reasoning"])
def test_empty_traces_are_skipped_and_counted_by_the_probe(run_with_empty_trace, tmp_path, capsys, score):
    code, _, stderr = cli(
        capsys,
        "probe",
        "train",
        run_with_empty_trace.path,
        "--score",
        score,
        "--hidden-sizes",
        "8",
        "--epochs",
        "2",
        "--out",
        tmp_path,
    )
    assert code == 0, stderr
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    assert metrics["samples"] == 6 and metrics["empty_samples_skipped"] == 1
    assert "1 sample(s) with no generated token skipped" in (tmp_path / "metrics.md").read_text()


def test_empty_traces_are_counted_by_dynamism(run_with_empty_trace, tmp_path):
    write_json(tmp_path / "static.json", ["0-1", "1-0"])
    stats = dynamism_report(run_with_empty_trace.path, tmp_path / "static.json", out_dir=tmp_path)
    assert stats.num_samples == 6 and stats.num_steps == 60
    saved = json.loads((tmp_path / "dynamism.json").read_text())
    assert saved["empty_samples_skipped"] == 1
    assert "1 sample(s) with no generated token skipped" in (tmp_path / "dynamism.md").read_text()


def test_analysis_functions_skip_empty_samples_directly():
    from dynheads.analysis.cca import cca_offsets
    from dynheads.analysis.head_predictor import train_head_predictor
    from dynheads.analysis.settings import CCAConfig, HeadPredictorConfig

    rng = np.random.default_rng(2)
    samples = [(rng.normal(size=(8, 5)), rng.random((8, 6))) for _ in range(5)]
    samples.append((np.zeros((0, 5)), np.zeros((0, 6))))
    samples.append((np.zeros((0, 0)), np.zeros((0, 6))))  # as an empty trace loads: hidden [0, 0]
    table = cca_offsets(samples, (0,), CCAConfig())
    assert len(table) == 3
    result = train_head_predictor(
        samples, HeadPredictorConfig(hidden_sizes=(4,), epochs=1), task="continuous", shape=SHAPE, progress=False
    )
    assert result.metrics["probe"]["mse"] >= 0
    stats = dynamism_stats([sets({0}, {1}), np.zeros((0, *SHAPE), bool)], [(0, 1)], ks=(1,))
    assert stats.num_samples == 1 and stats.num_steps == 2


def test_plot_heads_refuses_a_named_empty_trace_in_one_line(run_with_empty_trace, tmp_path, capsys):
    code, _, stderr = cli(capsys, "plot", "heads", run_with_empty_trace.path, "--sample", "r9-empty", "--out", tmp_path)
    assert code == 2 and "r9-empty generated no token" in stderr and "Traceback" not in stderr
    assert len(plot_heads(run_with_empty_trace.path, out_dir=tmp_path)) == 6  # the empty one is skipped


def test_cca_json_records_which_samples_each_split_held_out(tmp_path, capsys):
    """cca.json names the held-out samples of every seeded split and each sample's shuffled partner (it recorded
    only the config: which answers were fitted on could not be told from the files)."""
    rng = np.random.default_rng(2)
    run = new_run(tmp_path / "run")
    lengths = {"a": 7, "b-empty": 0, "c": 9, "d": 11, "e": 13, "f": 15, "g": 17}
    for sample_id, steps in lengths.items():
        hidden = rng.normal(size=(steps, 8)).astype(np.float32)
        run.save_sample({"sample_id": sample_id}, make_trace(rng.random((steps, *SHAPE)) < 0.3, hidden))
    code, _, stderr = cli(capsys, "cca", run.path, "--offsets", "0", "--splits", "3", "--out", tmp_path / "out")
    assert code == 0, stderr
    saved = json.loads((tmp_path / "out" / "cca.json").read_text())
    record = saved["held_out_splits"]
    assert record["samples"] == ["a", "c", "d", "e", "f", "g"] and sorted(record["splits"]) == ["0", "1", "2"]
    for split in record["splits"].values():
        assert set(split["test"]) < set(record["samples"])
        assert all(own != other for own, other in zip(record["samples"], split["shuffled_scores_of"], strict=True))
    held_out = next(row for row in saved["rows"] if row["method"] == "held_out")  # its pairs: the first split's
    assert held_out["eval_pairs"] == sum(lengths[sample_id] for sample_id in record["splits"]["0"]["test"])
