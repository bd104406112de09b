"""``dynheads kv-export`` reads the model's config (layers, query heads, KV heads), never its weights, and writes
what it wrote when it loaded the whole model; its line says how many KV heads ``--full-heads`` kept whole."""

from __future__ import annotations

import json

import pytest
import transformers
from cli_main import run_main
from zoo import NoTokenizer, tiny_model

from dynheads import models
from dynheads.analysis.headlists import load_head_list, scored_heads
from dynheads.analysis.kvheads import kv_head_matrix, query_head_scores, write_duo_attention
from dynheads.cli.kv_commands import kept_heads_line
from dynheads.kv.retention import num_kv_heads

# Wu et al. scores on a tiny Llama (3 layers x 4 query heads, 2 KV heads): 4 of its 6 KV heads score
HEAD_SCORES = {"0-1": [0.9, 0.7], "0-3": [0.2], "1-0": [0.5], "2-2": [0.4, 0.6], "2-3": [0.1]}


@pytest.fixture
def no_weights(monkeypatch):
    """Any read of a model's weights fails the test."""

    def refuse(*args, **kwargs):
        raise AssertionError("kv-export loaded the model's weights")

    monkeypatch.setattr(models, "_load_pretrained", refuse)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)


@pytest.fixture
def tiny_folder(tmp_path):
    """A tiny Llama saved as a model folder (weights and config), and its head list."""
    model = tiny_model("llama")
    model.save_pretrained(tmp_path / "tiny")
    (tmp_path / "heads.json").write_text(json.dumps(HEAD_SCORES), encoding="utf-8")
    return model


def export_before(model, static, out, full_heads=None):
    """What kv-export wrote when it loaded the whole model: the matrix on the loaded model's sizes."""
    lm = models.LoadedModel(model=model, tokenizer=NoTokenizer(), name="tiny", revision="random")
    heads = load_head_list(static, lm.num_layers, lm.num_heads)
    matrix = kv_head_matrix(query_head_scores(heads, lm.num_layers, lm.num_heads), num_kv_heads(lm), "max")
    kwargs = dict(sink=128, recent=256, aggregation="max", source=str(static), num_heads=lm.num_heads)
    write_duo_attention(out, matrix, **kwargs, full_heads=full_heads, voters=scored_heads(heads))


@pytest.mark.parametrize("full_heads", [None, 2])
def test_kv_export_writes_the_loaded_models_files_without_reading_weights(
    tiny_folder, no_weights, tmp_path, capsys, monkeypatch, full_heads
):
    static = tmp_path / "heads.json"
    extra = [] if full_heads is None else ["--full-heads", str(full_heads)]
    result = run_main(
        capsys,
        monkeypatch,
        "kv-export",
        "--model",
        tmp_path / "tiny",
        "--static",
        static,
        "--out",
        tmp_path / "new",
        *extra,
    )
    assert result.code == 0, result.stderr
    export_before(tiny_folder, static, tmp_path / "before", full_heads)
    for name in ("full_attention_heads.tsv", "config.json"):
        assert (tmp_path / "new" / name).read_text() == (tmp_path / "before" / name).read_text()
    assert "(3 x 2, " in result.stdout


@pytest.mark.parametrize("full_heads", [None, 1])
def test_an_exports_voters_are_the_heads_of_the_list_it_was_exported_from(
    tiny_folder, no_weights, tmp_path, capsys, monkeypatch, full_heads
):
    """The query heads that vote (``load_voters``) from a kv-export folder are the list's own, best first: not the
    query heads of its best KV heads in head order, which reorders ties, adds zero-score query heads of a kept KV
    head and cuts a KV head's group at ``count``."""
    from dynheads.kv.presses import load_voters

    static, out = tmp_path / "heads.json", tmp_path / "export"
    extra = [] if full_heads is None else ["--full-heads", str(full_heads)]
    result = run_main(
        capsys, monkeypatch, "kv-export", "--model", tmp_path / "tiny", "--static", static, "--out", out, *extra
    )
    assert result.code == 0, result.stderr
    listed = load_voters(static)
    assert listed == ((0, 1), (1, 0), (2, 2), (0, 3), (2, 3))  # by mean score, ties by layer; no zero-score head
    for count in (1, 3, 8):
        assert load_voters(out, count) == listed[:count]
    config = json.loads((out / "config.json").read_text())
    del config["voters"]  # an export written before voters were recorded: its KV heads' query heads
    (out / "config.json").write_text(json.dumps(config))
    assert load_voters(out, 3) != listed[:3]


def test_kv_export_says_how_many_kv_heads_are_kept_whole(tiny_folder, no_weights, tmp_path, capsys, monkeypatch):
    common = ["kv-export", "--model", tmp_path / "tiny", "--static", tmp_path / "heads.json"]
    kept = run_main(capsys, monkeypatch, *common, "--out", tmp_path / "two", "--full-heads", "2").stdout
    assert "2 KV heads kept whole (4 KV heads with a positive score)" in kept
    short = run_main(capsys, monkeypatch, *common, "--out", tmp_path / "nine", "--full-heads", "9").stdout
    assert "4 KV heads kept whole (4 KV heads with a positive score, 5 short of 9)" in short
    scores = run_main(capsys, monkeypatch, *common, "--out", tmp_path / "scores").stdout
    assert "(3 x 2, 4 KV heads with a positive score)" in scores


def test_the_kept_heads_line_reads_the_exports_config():
    assert kept_heads_line({"scored_kv_heads": 24}) == "24 KV heads with a positive score"
    thresholded = {"scored_kv_heads": 24, "full_kv_heads": 9, "requested_full_kv_heads": 9, "shortfall": 0}
    assert kept_heads_line(thresholded) == "9 KV heads kept whole (24 KV heads with a positive score)"


@pytest.mark.embedded
def test_kv_export_of_the_embedded_gguf_reads_no_weights(no_weights, tmp_path, capsys, monkeypatch):
    """The embedded SmolLM2 GGUF: 30 layers of 9 query and 3 KV heads, from its header or its cached copy's config."""
    static = tmp_path / "heads.json"
    static.write_text(json.dumps({"0-1": [0.9], "29-8": [0.5], "12-4": [0.3]}), encoding="utf-8")
    result = run_main(
        capsys, monkeypatch, "kv-export", "--static", static, "--out", tmp_path / "out", "--full-heads", "2"
    )
    assert result.code == 0, result.stderr
    assert "(30 x 3, 2 KV heads kept whole (3 KV heads with a positive score))" in result.stdout
    assert json.loads((tmp_path / "out" / "config.json").read_text())["num_query_heads"] == 9
