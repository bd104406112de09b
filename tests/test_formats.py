"""Format versions of trace files and run manifests: old files still load, newer ones are refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from zoo import NoTokenizer, tiny_model

import dynheads
from dynheads.errors import DynheadsError
from dynheads.io import read_json, write_json
from dynheads.models import LoadedModel
from dynheads.runs import MANIFEST_FORMAT_VERSION, RunDir
from dynheads.traces import TRACE_FORMAT_VERSION, Trace

V1_TRACE = Path(__file__).parent / "fixtures" / "trace-v1.parquet"  # written by tests/fixtures/make_v1_trace.py


class PlainSample:
    def __init__(self, input_ids, needle_positions):
        self.input_ids, self.needle_positions = input_ids, needle_positions


def _fixture_trace_now() -> Trace:
    """The generation the fixture was written from, traced by today's code."""
    lm = LoadedModel(model=tiny_model("llama"), tokenizer=NoTokenizer(), name="llama", revision="random")
    torch.manual_seed(0)
    prompt = torch.randint(3, 128, (24,)).tolist()
    return dynheads.trace(lm, PlainSample(prompt, [10, 11, 12]), max_new_tokens=4, stop_at_eos=False)


def test_version_1_trace_still_loads_with_the_same_contents():
    assert "format_version" not in json.loads(pq.read_schema(V1_TRACE).metadata[b"dynheads"])
    old = Trace.load(V1_TRACE)
    assert old.context_mass is None and old.token_entropy is None and old.token_max_prob is None
    assert old.chance is None
    now = _fixture_trace_now()
    assert old.text == now.text and old.token_texts == now.token_texts and old.stop_reason == now.stop_reason
    assert old.prompt_length == now.prompt_length == 24
    for name in ("tokens", "argmax_pos", "copy_scores", "needle_mass", "reasoning_scores", "max_prob", "hidden"):
        np.testing.assert_allclose(getattr(old, name), getattr(now, name), atol=1e-5, err_msg=name)


def test_trace_is_written_with_its_format_version(tmp_path):
    Trace.load(V1_TRACE).save(tmp_path / "t.parquet")
    meta = json.loads(pq.read_schema(tmp_path / "t.parquet").metadata[b"dynheads"])
    assert meta["format_version"] == TRACE_FORMAT_VERSION == 2
    assert Trace.load(tmp_path / "t.parquet").text == Trace.load(V1_TRACE).text


def test_newer_trace_version_is_refused_in_one_line(tmp_path):
    table = pq.read_table(V1_TRACE)
    meta = json.loads(table.schema.metadata[b"dynheads"]) | {"format_version": TRACE_FORMAT_VERSION + 1}
    pq.write_table(table.replace_schema_metadata({"dynheads": json.dumps(meta)}), tmp_path / "new.parquet")
    with pytest.raises(DynheadsError, match="version 3 trace file") as error:
        Trace.load(tmp_path / "new.parquet")
    assert "\n" not in str(error.value)


def test_a_manifest_records_the_commit_of_the_source_that_ran(tmp_path):
    import subprocess

    source = Path(dynheads.__file__).parent
    head = subprocess.run(["git", "-C", str(source), "rev-parse", "HEAD"], capture_output=True, text=True)
    recorded = RunDir(tmp_path / "run").start("niah", {"seed": 0}, None)["versions"]["dynheads-commit"]
    if head.returncode:  # an installed wheel: no commit to name
        assert recorded == "not a git checkout"
    else:  # a checkout (CI's fresh clone, a developer's tree with edits: "-dirty")
        assert recorded in (head.stdout.strip(), head.stdout.strip() + "-dirty")


def test_manifest_versions(tmp_path):
    run = RunDir(tmp_path / "run")
    manifest = run.start("niah", {"seed": 0}, None)
    assert manifest["format_version"] == MANIFEST_FORMAT_VERSION == 2
    assert run.start("niah", {"seed": 0}, None) == manifest  # resuming accepts it

    old = {key: value for key, value in read_json(run.manifest_path).items() if key != "format_version"}
    write_json(run.manifest_path, old)  # a manifest written before versions existed: version 1
    assert run.manifest() == old and run.start("niah", {"seed": 0}, None) == old

    write_json(run.manifest_path, old | {"format_version": MANIFEST_FORMAT_VERSION + 1})
    with pytest.raises(DynheadsError, match="version 3 run manifest") as error:
        run.manifest()
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("family", ["llama", "gemma2"])  # gemma2 ties its input and output embeddings
def test_the_manifest_records_the_parameter_count_with_tied_weights_once(family):
    model = tiny_model(family)
    lm = LoadedModel(model=model, tokenizer=NoTokenizer(), name=family, revision="random")
    every = sum(parameter.numel() for _, parameter in model.named_parameters(remove_duplicate=False))
    tied = model.get_input_embeddings().weight.numel() if model.config.tie_word_embeddings else 0
    assert lm.describe()["parameters"] == every - tied
    assert (tied > 0) == (family == "gemma2")


def test_a_file_that_is_no_trace_is_refused_in_one_line(tmp_path):
    (tmp_path / "text.parquet").write_text("hello")
    pq.write_table(pq.read_table(V1_TRACE).replace_schema_metadata({}), tmp_path / "plain.parquet")
    cases = {
        tmp_path / "missing.parquet": "no trace file .*missing.parquet$",
        tmp_path: "no trace file .* \\(it is a folder\\)",
        tmp_path / "text.parquet": "text.parquet is not a readable Parquet file: ",
        tmp_path / "plain.parquet": "plain.parquet is not a dynheads trace file \\(no readable 'dynheads' schema",
    }
    for path, says in cases.items():
        with pytest.raises(DynheadsError, match=says) as error:
            Trace.load(path)
        assert "\n" not in str(error.value)


def test_dynamic_heads_of_a_step_outside_the_trace_is_refused():
    trace = Trace.load(V1_TRACE)  # 4 steps
    assert trace.dynamic_heads(-1) == trace.dynamic_heads(3)  # a list index, as the docstring says
    assert all(isinstance(head, tuple) and len(head) == 2 for head in trace.dynamic_heads(0))
    with pytest.raises(DynheadsError, match="step 4 is outside this trace's 4 generated tokens"):
        trace.dynamic_heads(4)
    with pytest.raises(DynheadsError, match="step must be an integer, got str '1'"):
        trace.dynamic_heads("1")


def test_run_dir_takes_a_path_and_says_what_it_is():
    assert RunDir.__doc__ and "manifest" in RunDir.__doc__
    with pytest.raises(DynheadsError, match="a run directory is a path, got NoneType"):
        RunDir(None)


def test_a_run_file_that_is_not_json_is_refused_in_one_line_naming_it(tmp_path):
    run = RunDir(tmp_path / "run")
    run.start("niah", {"seed": 0}, None)
    run.save_sample({"sample_id": "s0", "accuracy": 1.0})
    assert run.records() == [{"sample_id": "s0", "accuracy": 1.0}]
    run.record_path("s0").write_text('{"sample_id": "s0", ', encoding="utf-8")  # cut short by a hand edit
    with pytest.raises(DynheadsError, match=r"samples/s0\.json is not valid JSON .*delete it to recompute it"):
        run.records()
    run.manifest_path.write_bytes(b"\xff\xfe")
    with pytest.raises(DynheadsError, match=r"manifest\.json is not valid JSON"):
        run.manifest()


def test_a_trace_of_no_steps_keeps_its_hidden_size(tmp_path):
    """A generation that stops at once (EOS first) is a trace of 0 steps: its hidden states are [0, D] when read."""
    import dataclasses

    full = _fixture_trace_now()
    empty = dataclasses.replace(
        full,
        **{
            field.name: value[:0]
            for field in dataclasses.fields(Trace)
            if isinstance(value := getattr(full, field.name), np.ndarray | list) and field.name != "prompt_ids"
        },
        scores={name: array[:0] for name, array in full.scores.items()},
    )
    empty.save(tmp_path / "empty.parquet")
    loaded = Trace.load(tmp_path / "empty.parquet")
    assert loaded.num_steps == 0 and loaded.hidden.shape == (0, full.hidden.shape[1]) and full.hidden.shape[1] > 0
