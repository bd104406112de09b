"""Run directories through the CLI: manifest, resume after a crash, determinism, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import pandas as pd
import pytest

from dynheads.experiments.niah import NiahConfig, run_niah
from dynheads.traces import Trace


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "dynheads", *args], capture_output=True, text=True, timeout=600)


def small_config(model_dir, **overrides) -> NiahConfig:
    values = dict(model=str(model_dir), lengths=(200,), depths=(0.0, 1.0), runs=1, max_new_tokens=6, seed=5)
    return NiahConfig(**{**values, **overrides})


def test_run_directory_contents(tiny_model_dir, tiny_lm, tmp_path):
    run = run_niah(small_config(tiny_model_dir), tmp_path / "run", lm=tiny_lm, progress=False)
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["kind"] == "niah"
    assert manifest["config"]["lengths"] == [200] and manifest["seed"] == 5
    assert manifest["model"]["num_layers"] == 3 and manifest["versions"]["transformers"]
    assert {"kvpress", "bm25s"} <= set(manifest["versions"])  # optional, recorded (as "not installed" where absent)
    assert "magic word" in manifest["prompt"]["needle"] and manifest["prompt_template"] == "chat"
    assert manifest["chat_template_kwargs"] == {"enable_thinking": False, "date_string": "26 Jul 2024"}
    records = run.records()
    assert [r["sample_id"] for r in records] == ["analysis-len200-depth0-run0", "analysis-len200-depth1-run0"]
    assert set(records[0]["metrics"]) == {"accuracy", "rouge_l", "rouge1_recall"}
    # The trace format is plain Parquet that pandas reads; one row per generated token.
    frame = pd.read_parquet(tmp_path / "run" / "traces" / "analysis-len200-depth0-run0.parquet")
    assert len(frame) == records[0]["steps"] and len(frame["copy_score"][0]) == 3 * 4
    assert len(pd.read_csv(tmp_path / "run" / "results.csv")) == 2


def test_resume_skips_finished_samples_and_matches_a_clean_run(tiny_model_dir, tiny_lm, tmp_path):
    config = small_config(tiny_model_dir)
    clean = run_niah(config, tmp_path / "clean", lm=tiny_lm, progress=False)
    # Simulate a crash after the first sample: the second sample's record never got written.
    crashed = run_niah(config, tmp_path / "crashed", lm=tiny_lm, progress=False)
    crashed.record_path("analysis-len200-depth1-run0").unlink()
    traced = []
    run_niah(config, tmp_path / "crashed", lm=tiny_lm, progress=False, on_record=traced.append)
    assert [r["sample_id"] for r in traced] == ["analysis-len200-depth1-run0"]
    assert clean.records() == crashed.records()
    for record in clean.records():
        a, b = clean.load_trace(record["sample_id"]), crashed.load_trace(record["sample_id"])
        assert (a.copy_scores == b.copy_scores).all() and (a.hidden == b.hidden).all()
    assert not list((tmp_path / "crashed").rglob("*.tmp"))  # no half-written files


def test_a_different_config_in_the_same_folder_is_refused(tiny_model_dir, tiny_lm, tmp_path):
    from dynheads.errors import DynheadsError

    run_niah(small_config(tiny_model_dir), tmp_path / "run", lm=tiny_lm, progress=False)
    with pytest.raises(DynheadsError, match="different run"):
        run_niah(small_config(tiny_model_dir, seed=6), tmp_path / "run", lm=tiny_lm, progress=False)


def test_a_resume_with_another_model_under_the_same_model_setting_is_refused(tiny_model_dir, tiny_lm, tmp_path):
    """The config holds the --model value, not the model: a hub cache updated to another commit or a GGUF file
    replaced resumed silently before, mixing two models' records under one manifest."""
    import dataclasses

    from dynheads.errors import DynheadsError
    from dynheads.io import read_json, write_json

    config, out = small_config(tiny_model_dir, lengths=(60,)), tmp_path / "run"
    pinned = dataclasses.replace(tiny_lm, revision="sha256:aaaa")
    run = run_niah(config, out, lm=pinned, progress=False)
    run.record_path("analysis-len60-depth1-run0").unlink()
    with pytest.raises(DynheadsError, match=r"another model \(revision sha256:aaaa there, sha256:bbbb now"):
        run_niah(config, out, lm=dataclasses.replace(tiny_lm, revision="sha256:bbbb"), progress=False)
    manifest = read_json(run.manifest_path)
    write_json(run.manifest_path, {**manifest, "model": {**manifest["model"], "revision": "local", "num_heads": 8}})
    with pytest.raises(DynheadsError, match=r"another model \(num_heads 8 there, 4 now"):
        run_niah(config, out, lm=pinned, progress=False)
    write_json(run.manifest_path, manifest)
    assert len(run_niah(config, out, lm=pinned, progress=False).records()) == 2  # the same model resumes
    write_json(run.manifest_path, {**manifest, "model": {**manifest["model"], "revision": "local"}})
    assert len(run_niah(config, out, lm=pinned, progress=False).records()) == 2  # a folder's "local" pins nothing


def test_trace_round_trip(tiny_model_dir, tiny_lm, tmp_path):
    run = run_niah(small_config(tiny_model_dir), tmp_path / "run", lm=tiny_lm, progress=False)
    trace = run.load_trace("analysis-len200-depth0-run0")
    trace.save(tmp_path / "copy.parquet")
    again = Trace.load(tmp_path / "copy.parquet")
    for name in ("tokens", "argmax_pos", "copy_scores", "needle_mass", "reasoning_scores", "max_prob", "hidden"):
        assert (getattr(trace, name) == getattr(again, name)).all(), name
    assert again.text == trace.text and again.token_texts == trace.token_texts


def test_cli_end_to_end(tiny_model_dir, tmp_path):
    out = tmp_path / "cli"
    result = run_cli(
        "niah",
        "--model",
        str(tiny_model_dir),
        "--lengths",
        "200",
        "--depths",
        "0.5",
        "--runs",
        "2",
        "--max-new-tokens",
        "4",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    assert "2 samples" in result.stdout
    assert len(list((out / "traces").glob("*.parquet"))) == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "/no/such/model"], "model path not found"),
        (["--model", "no-such-org/no-such-model"], "cannot load model"),
        (["--depths", "1.5"], "depth must be between 0 and 1"),
        (["--lengths", "9000"], "exceeds the model's context window"),
        (["--haystack", "/no/such/folder"], "haystack folder not found"),
        (["--haystack", __file__], "the haystack is a folder of .txt files, and"),
        (["--lengths", "abc"], "comma-separated list"),
        (["--dtype", "float9"], "unknown dtype 'float9'"),
    ],
)
def test_bad_input_gets_one_line(tiny_model_dir, tmp_path, args, message):
    base = ["niah", "--out", str(tmp_path / "bad"), "--max-new-tokens", "2", "--runs", "1", "--lengths", "200"]
    if "--model" not in args:
        base += ["--model", str(tiny_model_dir)]
    result = run_cli(*base, *args)
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert "Traceback" not in result.stderr


def test_hotpotqa_run_traces_reasoning_scores(tiny_model_dir, tmp_path):
    out = tmp_path / "hotpot"
    result = run_cli(
        "hotpotqa",
        "--model",
        str(tiny_model_dir),
        "--questions",
        "2",
        "--lengths",
        "300",
        "--depths",
        "0.5",
        "--max-new-tokens",
        "3",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    from dynheads.runs import RunDir

    run = RunDir(out)
    assert run.manifest()["kind"] == "hotpotqa" and "synthetic" in run.manifest()["prompt"]["data"]
    for record, trace in run.iter_traces():
        assert set(record["metrics"]) >= {"em", "f1"}
        assert record["needle_positions"] and trace.reasoning_scores.shape[1:] == (3, 4)
        assert ((trace.reasoning_scores >= 0) & (trace.reasoning_scores <= 1 + 1e-6)).all()


def _documented(table_heading: str) -> list[str]:
    """The backticked names in the first column of the table under ``table_heading`` in docs/formats.md."""
    import re
    from pathlib import Path

    text = (Path(__file__).resolve().parents[1] / "docs" / "formats.md").read_text(encoding="utf-8")
    section = text.split(table_heading, 1)[1].split("\n## ", 1)[0]
    rows = [line.split("|")[1] for line in section.splitlines() if line.startswith("| ") and "---" not in line]
    return [name for cell in rows[1:] for name in re.findall(r"`([^`]+)`", cell)]


def test_a_traced_runs_files_hold_what_formats_md_documents(tiny_model_dir, tiny_lm, tmp_path):
    """Every record key and trace column of a NIAH run is in docs/formats.md's tables, and every documented
    record key is written (the NIAH extras stand for "task extras"); the trace's types are the documented ones."""
    import pyarrow.parquet as pq

    run = run_niah(small_config(tiny_model_dir, write_score=True), tmp_path / "run", lm=tiny_lm, progress=False)
    record = run.records()[0]
    documented = set(_documented("## Sample records (traced runs)"))
    assert set(record) == documented | {"answer_token_count", "context_span"}  # the NIAH task's extras
    schema = pq.read_schema(run.trace_path(record["sample_id"]))
    columns = set(_documented("## Trace files (Parquet)"))
    assert set(schema.names) - columns == set()  # write_score is documented by name; no undocumented column
    assert str(schema.field("step").type) == "int32" and str(schema.field("token_id").type) == "int64"
    assert str(schema.field("copy_score").type.value_type) == "bool"
    assert {str(schema.field(n).type.value_type) for n in ("argmax_pos", "reasoning_score", "write_score")} == {
        "int32",
        "float",
    }
    trace = Trace.load(run.trace_path(record["sample_id"]))
    assert record["prompt_tokens"] == trace.prompt_length and record["steps"] == trace.num_steps
    assert record["generated"] == trace.text and record["stop_reason"] == trace.stop_reason
