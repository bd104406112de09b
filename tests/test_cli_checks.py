"""Every command checks its inputs before it loads a model: a corrupt or wrong file or folder, or a value out of
range, is one line ``error: ...`` naming it, exit code 2, never a traceback (``dynheads.cli.checks``).

``--model`` points at a folder that does not exist in every case, so a check that ran after the model load would
fail with 'model path not found' instead of the message expected here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from cli_main import run_main

NO_MODEL = ["--model", "/no/such/model"]
OWN_RECORDS = ["trace", "--task", "custom", "--data", "{t}/no-tokenizer/custom.jsonl"]


@pytest.fixture
def files(tmp_path):
    """Wrong inputs of every kind, by name."""
    (tmp_path / "bad.json").write_text('{"heads": [1, 2,')
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    (tmp_path / "good.json").write_text("{}")
    (tmp_path / "plain").mkdir()  # a folder that is no run
    kv_run = tmp_path / "kv-run"  # a run of another stage: no traces
    kv_run.mkdir()
    (kv_run / "manifest.json").write_text(json.dumps({"kind": "kv", "format_version": 2}))
    broken = tmp_path / "broken-run"
    broken.mkdir()
    (broken / "manifest.json").write_text("{not json")
    (tmp_path / "untrained").mkdir()
    (tmp_path / "static-run").mkdir()  # a 'dynheads static' folder given where its list is meant
    (tmp_path / "static-run" / "static_heads.json").write_text("{}")
    study = tmp_path / "study"  # a study's folder: its stage folders hold the traces
    (study / "niah" / "traces").mkdir(parents=True)
    (study / "manifest.json").write_text(json.dumps({"kind": "reproduce", "format_version": 2}))
    (study / "niah" / "traces" / "s0.parquet").write_bytes(b"")
    (tmp_path / "text-lengths.toml").write_text('lengths = "abc"\n')
    (tmp_path / "one-length.toml").write_text("lengths = 200\n")
    (tmp_path / "text-tokens.toml").write_text('max_new_tokens = "4"\ndepths = [0.5, 1]\n')
    (tmp_path / "no-runs.toml").write_text('base = "smoke"\n[niah]\nruns = -3\n[rag]\nks = [5, -1]\n')
    (tmp_path / "junk.gguf").write_bytes(b"not a gguf file")
    (tmp_path / "empty-model").mkdir()
    (tmp_path / "no-tokenizer").mkdir()  # the weights and config saved without the tokenizer
    (tmp_path / "no-tokenizer" / "config.json").write_text('{"model_type": "llama"}')
    (tmp_path / "no-tokenizer" / "custom.jsonl").write_text(
        '{"id": "a", "context": "Paris is in France.", "question": "Where?", "answer": "France"}\n'
    )
    (tmp_path / "lines.json").write_text('{"id": "a"}\n{"id": "b"}\n')
    (tmp_path / "misspelt.toml").write_text('base = "smoke"\n[niah]\nrunz = 3\n')
    (tmp_path / "text-list.toml").write_text('base = "smoke"\n[rag]\nks = "5"\n')
    (tmp_path / "retired.toml").write_text('base = "smoke"\n[hotpotqa-ablation]\nrelative_doses = [1.0]\n')
    return tmp_path


CASES = [  # (command line, what the error names, what it says)
    (["detect-apply", "{t}/bad.json", "{t}/bad.parquet"], "{t}/bad.json", "is not valid JSON"),
    (["detect-apply", "{t}/good.json", "{t}/bad.parquet"], "{t}/bad.parquet", "is not a readable Parquet file"),
    (["detect-apply", "{t}/good.json", "{t}/missing.parquet"], "{t}/missing.parquet", "trace not found"),
    (["dynamism", "{t}/plain", "--static", "{t}/good.json"], "{t}/plain", "is not a dynheads run directory"),
    (["dynamism", "{t}/kv-run", "--static", "{t}/good.json"], "{t}/kv-run", "has no traced samples yet (a 'kv' run"),
    (["cca", "{t}/broken-run"], "{t}/broken-run/manifest.json", "is not valid JSON"),
    (["probe", "train", "{t}/kv-run"], "{t}/kv-run", "has no traced samples yet (a 'kv' run"),
    (["plot", "heads", "{t}/missing-run"], "{t}/missing-run", "run directory not found"),
    (["detect", "{t}/plain"], "{t}/plain", "is not a dynheads run directory"),
    (["detect-transfer", "{t}/broken-run", "{t}/kv-run", "--out", "{t}/out"], "{t}/broken-run", "is not valid JSON"),
    (["report", "{t}/kv-run"], "{t}/kv-run", "is not a study folder"),
    (["niah", *NO_MODEL, "--runs", "-1", "--out", "{t}/out"], "--runs", "runs must be at least 1, got -1"),
    (["niah", *NO_MODEL, "--batch-size", "0", "--out", "{t}/out"], "--batch-size", "batch size must be at least 1"),
    (
        ["reproduce", *NO_MODEL, "--batch-size", "0", "--out", "{t}/out"],
        "--batch-size",
        "batch size must be at least 1",
    ),
    (
        ["reproduce", *NO_MODEL, "--stages", "hotpotqa,nope", "--out", "{t}/out"],
        "'nope'",
        "no stage 'nope' in this study: its stages are niah, static,",
    ),
    (["reproduce", *NO_MODEL, "--preset", "{t}/good.json", "--out", "{t}/out"], "'{t}/good.json'", "unknown preset"),
    (
        ["trace", "--task", "hotpotqa", *NO_MODEL, "--questions", "0", "--out", "{t}/out"],
        "--questions",
        "must be at least 1",
    ),
    (
        ["hotpotqa", *NO_MODEL, "--data", "{t}/missing.json", "--out", "{t}/out"],
        "{t}/missing.json",
        "data file not found",
    ),
    (["hotpotqa", *NO_MODEL, "--data", "{t}/bad.json", "--out", "{t}/out"], "{t}/bad.json", "is not valid JSON"),
    (["kv", *NO_MODEL, "--budgets", "0.5,1.5", "--out", "{t}/out"], "--budgets", "budget must be in (0, 1], got 1.5"),
    (
        ["kv", *NO_MODEL, "--out", "{t}/plain/../kv-run", "--probe", "{t}/untrained"],
        "{t}/untrained",
        "is not a trained probe folder",
    ),
    (["rag", *NO_MODEL, "--static", "{t}/bad.json", "--out", "{t}/out"], "{t}/bad.json", "is not valid JSON"),
    (["rag", *NO_MODEL, "--k", "-5", "--out", "{t}/out"], "--k", "must be at least 0, got -5"),
    (["ablate", *NO_MODEL, "--out", "{t}/kv-run"], "{t}/kv-run", "already holds a 'kv' run"),
    (["ablate", *NO_MODEL, "--out", "{t}/good.json"], "{t}/good.json", "is a file, not a folder"),
    (
        ["ablate", *NO_MODEL, "--score", "write", "--threshold", "null:0.1", "--fit-run", "{t}/kv-run", "--out", "{t}"],
        "{t}/kv-run",
        "has no traced samples yet (a 'kv' run",
    ),
    (["static", *NO_MODEL, "--samples", "0", "--out", "{t}/out"], "--samples", "must be at least 1"),
    (["kv-export", *NO_MODEL, "--static", "{t}/bad.json", "--out", "{t}/out"], "{t}/bad.json", "is not valid JSON"),
    (
        ["kv-export", *NO_MODEL, "--static", "{t}/missing.json", "--out", "{t}/out"],
        "{t}/missing.json",
        "static head list not found",
    ),
    (
        ["kv-export", *NO_MODEL, "--static", "{t}/static-run", "--out", "{t}/out"],
        "{t}/static-run/static_heads.json",
        "--static takes a head list file, and",
    ),
    (["detect", "--data", "halueval:qa", "--out", "{t}/out", "--folds", "1"], "--folds", "must be at least 2"),
    (["plot", "heads", "{t}/missing-run", "--top", "0"], "--top", "top must be at least 1, got 0"),
    (["cca", "{t}/plain", "--test-fraction", "1.5"], "test_fraction", "must lie strictly between 0 and 1"),
    (["predictor", "train", "{t}/plain", "--split", "0.5,0.5"], "split", "three positive fractions summing to 1"),
    (["predictor", "train", "{t}/plain", "--activation", "tanh"], "'tanh'", "unknown probe activation"),
    (
        ["kv-export", *NO_MODEL, "--static", "{t}/good.json", "--out", "{t}/out", "--aggregation", "median"],
        "--aggregation",
        "takes one of max, mean, got 'median'",
    ),
    (
        ["kv-export", *NO_MODEL, "--static", "{t}/good.json", "--out", "{t}/out", "--full-heads", "0"],
        "--full-heads",
        "full heads must be at least 1, got 0",
    ),
    (["detect", "{t}/plain", "--questions", "3"], "--questions", "applies only with --data"),
    (["detect", "{t}/plain", "--batch-size", "4"], "--batch-size", "applies only with --data"),
    (["rag", *NO_MODEL, "--trigger-form", "pos", "--out", "{t}/out"], "--trigger-form", "takes one of paper, dragin"),
    (
        ["trace", *NO_MODEL, "--config", "{t}/text-lengths.toml", "--out", "{t}/out"],
        "config file {t}/text-lengths.toml: lengths",
        "takes tuple[int, ...], got 'abc'",
    ),
    (["trace", *NO_MODEL, "--config", "{t}/one-length.toml", "--out", "{t}/out"], "lengths", "got 200"),
    (
        ["trace", *NO_MODEL, "--config", "{t}/text-tokens.toml", "--out", "{t}/out"],
        "max_new_tokens",
        "takes int, got '4'",
    ),
    (
        ["reproduce", *NO_MODEL, "--preset", "{t}/misspelt.toml", "--out", "{t}/out"],
        "preset file {t}/misspelt.toml, table [niah]",
        "no setting 'runz'; did you mean 'runs'?",
    ),
    (
        ["reproduce", *NO_MODEL, "--preset", "{t}/text-list.toml", "--out", "{t}/out"],
        "table [rag]: ks",
        "takes tuple[int, ...], got '5'",
    ),
    (
        ["reproduce", *NO_MODEL, "--preset", "{t}/retired.toml", "--out", "{t}/out"],
        "table [hotpotqa-ablation]",
        "relative_doses (a fixed k heads per step, from the mean |D_t|) are retired",
    ),
    (["reproduce", *NO_MODEL, "--floor", "-1", "--out", "{t}/out"], "--floor", "floor must be at least 1, got -1"),
    (["reproduce", *NO_MODEL, "--resamples", "0", "--out", "{t}/out"], "--resamples", "must be at least 1, got 0"),
    (["cca", "{t}/plain", "--resamples", "0"], "--resamples", "resamples must be at least 1, got 0"),
    (
        ["reproduce", *NO_MODEL, "--preset", "{t}/no-runs.toml", "--out", "{t}/out"],
        "preset table [niah] runs",
        "runs must be at least 1, got -3",
    ),
    (["ablate", *NO_MODEL, "--strategies", "dynamic,statc", "--out", "{t}/out"], "'statc'", "did you mean 'static'?"),
    (
        ["ablate", *NO_MODEL, "--strategies", "dynamic,random", "--out", "{t}/out"],
        "--strategies dynamic,random",
        "picks the matched grid's strategies: add --fractions '' to run them",  # the dose-response ignored them
    ),
    (["kv", *NO_MODEL, "--policies", "full,statc", "--out", "{t}/out"], "['statc']", "did you mean 'static'?"),
    (["reproduce", *NO_MODEL, "--stages", "nia", "--out", "{t}/out"], "'nia'", "did you mean 'niah'?"),
    (["reproduce", *NO_MODEL, "--preset", "quik", "--out", "{t}/out"], "'quik'", "did you mean 'quick'?"),
    (["view", "{t}/study"], "the traced runs inside it: {t}/study/niah", "give one of them"),
    (["view", "{t}/good.json"], "{t}/good.json", "is a file, not a run directory"),
    (["trace", "--model", "{t}/junk.gguf", "--out", "{t}/out"], "'{t}/junk.gguf'", "as a causal LM"),
    (["trace", "--model", "{t}/empty-model", "--out", "{t}/out"], "'{t}/empty-model'", "has no config.json"),
    (["trace", "--model", "{t}/no-tokenizer", "--out", "{t}/out"], "'{t}/no-tokenizer'", "has no tokenizer (none of"),
    (
        [*OWN_RECORDS, "--model", "{t}/empty-model", "--out", "{t}/out"],
        "'{t}/empty-model'",
        "has no config.json",  # read by the tokenizer-only check, which said "cannot read the tokenizer" here
    ),
    (
        [*OWN_RECORDS, "--model", "{t}/no-tokenizer", "--out", "{t}/out"],
        "'{t}/no-tokenizer'",
        "save it beside the weights, tokenizer.save_pretrained(folder)",
    ),
    (["report", "{t}/plain"], "{t}/plain", "is not a study folder written by 'dynheads reproduce' (it has no manifest"),
    (
        ["trace", *NO_MODEL, "--data", "{t}/no-tokenizer/custom.jsonl", "--out", "{t}/out"],
        "--task custom --data {t}/no-tokenizer/custom.jsonl",
        "does not apply to task 'niah': a needle task takes the settings of 'dynheads niah', not those of 'dynheads "
        "hotpotqa'; your own records: dynheads trace",
    ),
    (
        ["trace", *NO_MODEL, "--task", "custom", "--data", "{t}/lines.json", "--out", "{t}/out"],
        "{t}/lines.json",
        "Extra data (line 2, column 1) (one JSON value per line is JSON Lines: name the file .jsonl)",
    ),
    (["trace", *NO_MODEL, "--device", "tpu", "--out", "{t}/out"], "'tpu'", "unknown device 'tpu': use cpu, cuda"),
    (["trace", *NO_MODEL, "--device", "cuda:99", "--out", "{t}/out"], "'cuda:99'", "is not available"),
    (
        ["niah", *NO_MODEL, "--chat-template-kwargs", "{{bad", "--out", "{t}/out"],
        "'{{bad'",
        "chat template kwargs must be a JSON object",
    ),
]


@pytest.mark.parametrize(("args", "named", "says"), CASES, ids=[" ".join(case[0][:2]) for case in CASES])
def test_a_bad_input_is_one_line_naming_it(files, capsys, monkeypatch, args, named, says):
    result = run_main(capsys, monkeypatch, *(arg.format(t=files) for arg in args))
    assert result.code == 2, (result.code, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert named.format(t=files) in lines[0] and says in lines[0], lines[0]
    assert "Traceback" not in result.stderr
    assert not (files / "out").exists()  # nothing was started


def test_through_the_installed_entry_point_too(files):
    result = subprocess.run(
        [sys.executable, "-m", "dynheads", "detect-apply", str(files / "good.json"), str(files / "bad.parquet")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.startswith(f"error: trace {files / 'bad.parquet'} is not a readable Parquet file")


def test_ctrl_c_says_how_to_continue_and_exits_130(tmp_path, capsys, monkeypatch):
    from dynheads.cli import checks

    def interrupted(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(checks, "traced_run", interrupted)
    result = run_main(capsys, monkeypatch, "view", tmp_path)
    assert result.code == 130 and "run the same command to continue" in result.stderr


def test_view_of_a_study_folder_names_the_runs_inside_it(tmp_path, capsys, monkeypatch):
    for stage in ("niah", "hotpotqa"):
        (tmp_path / "quick" / stage).mkdir(parents=True)
        (tmp_path / "quick" / stage / "manifest.json").write_text("{}")
    result = run_main(capsys, monkeypatch, "view", tmp_path / "quick")
    assert result.code == 2 and result.stderr.count("\n") == 1
    assert f"the runs inside it (a study's stage folders): {tmp_path / 'quick' / 'hotpotqa'}, " in result.stderr
    assert str(tmp_path / "quick" / "niah") in result.stderr


def test_a_rerun_with_other_settings_is_refused_before_the_model_loads(tmp_path, capsys, monkeypatch):
    import dynheads.runs
    from dynheads.experiments.niah import NiahConfig

    def no_model(*args, **kwargs):
        raise AssertionError("the model loaded before the re-run was refused")

    run = dynheads.runs.RunDir(tmp_path / "run")
    run.start("niah", NiahConfig(lengths=(500,)), None)
    monkeypatch.setattr(dynheads.runs, "load_model", no_model)
    result = run_main(capsys, monkeypatch, "trace", "--lengths", "250", "--out", run.path)
    assert result.code == 2 and result.stderr.count("\n") == 1, result.stderr
    assert "already holds a different run (--lengths was [500] there, [250] now" in result.stderr


PLUGIN = """
from dynheads.ablation.strategies import ABLATION_STRATEGIES, ablation_strategy


@ABLATION_STRATEGIES.register("plugin-last-layer", help="mask heads of the last layer, as many as D_t")
@ablation_strategy("last-layer heads masked", matched=True)
def choose(inputs):
    return [(inputs.num_layers - 1, head) for head in range(min(inputs.count, inputs.num_heads))]
"""


def test_a_plugin_registers_variants_the_command_then_takes(tmp_path, capsys, monkeypatch):
    """``dynheads --plugin FILE.py`` imports the file before the command: the strategy it registers is a name
    ``ablate --strategies`` takes (the command goes on to its next check, refused here), where without it the name is
    unknown; a plugin that cannot be imported is one line naming it."""
    from dynheads.ablation.strategies import ABLATION_STRATEGIES
    from dynheads.plugins import PLUGINS_VARIABLE, recorded_plugins

    monkeypatch.setenv(PLUGINS_VARIABLE, "")  # restored when the test ends: the plugin is recorded there
    plugin = tmp_path / "my_heads.py"
    plugin.write_text(PLUGIN)
    args = ["ablate", *NO_MODEL, "--strategies", "dynamic,plugin-last-layer", "--out", str(tmp_path / "out")]
    without = run_main(capsys, monkeypatch, *args)
    assert without.code == 2 and "unknown ablation strategy 'plugin-last-layer'" in without.stderr
    try:
        with_plugin = run_main(capsys, monkeypatch, "--plugin", str(plugin), *args)
        assert "plugin-last-layer" in ABLATION_STRATEGIES
        assert recorded_plugins() == [str(plugin)]  # for the processes a study starts (distributed.spawn)
    finally:
        ABLATION_STRATEGIES.unregister("plugin-last-layer")
        sys.modules.pop("my_heads", None)
        monkeypatch.setenv(PLUGINS_VARIABLE, "")  # else the commands below import it again, for the next tests
    assert with_plugin.code == 2 and "ablation strategy" not in with_plugin.stderr
    # past the strategies' names, to the next check: the dose-response (the default) does not read them
    assert "--strategies dynamic,plugin-last-layer picks the matched grid's strategies" in with_plugin.stderr
    missing = run_main(capsys, monkeypatch, "--plugin", str(tmp_path / "none.py"), "doctor")
    assert missing.code == 2 and missing.stderr.startswith(f"error: cannot import plugin '{tmp_path / 'none.py'}'")
    (tmp_path / "json.py").write_text(PLUGIN)  # its name is taken: it would be skipped silently
    taken = run_main(capsys, monkeypatch, "--plugin", str(tmp_path / "json.py"), "doctor")
    assert taken.code == 2 and "its name 'json' is already a module" in taken.stderr and "rename" in taken.stderr
    broken = run_main(capsys, monkeypatch, "--plugin", "no_such_module_of_yours", "doctor")
    assert broken.code == 2 and "ModuleNotFoundError" in broken.stderr and len(broken.stderr.splitlines()) == 1
    assert "plugin-last-layer" not in ABLATION_STRATEGIES  # nothing left registered for the tests that follow


def test_a_spawned_process_imports_the_recorded_plugins(tmp_path, monkeypatch):
    """What ``distributed.spawn``'s processes do first: import the plugins ``DYNHEADS_PLUGINS`` names (the starting
    command recorded them), each once."""
    from dynheads.plugins import PLUGINS_VARIABLE, import_recorded_plugins

    plugin = tmp_path / "counted_plugin.py"
    plugin.write_text("import builtins\nbuiltins.counted_plugin_runs = getattr(builtins, 'counted_plugin_runs', 0) + 1")
    monkeypatch.setenv(PLUGINS_VARIABLE, f"{plugin}{os.pathsep}")
    try:
        import_recorded_plugins()
        import_recorded_plugins()
        import builtins

        assert builtins.counted_plugin_runs == 1  # type: ignore[attr-defined]
    finally:
        sys.modules.pop("counted_plugin", None)
