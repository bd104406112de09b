"""``--help`` of every model-loading command: generated from its config, so it lists --model/--dtype/--device and
shows the config's real defaults (not None), comma-separated for lists."""

from __future__ import annotations

import dataclasses

import pytest
import typer.main
from typer.testing import CliRunner

from dynheads import settings
from dynheads.analysis.settings import CCAConfig, HeadPredictorConfig
from dynheads.cli.app import app, register_commands

register_commands()
# command -> the config its options are generated from
COMMAND_CONFIGS = {
    "niah": settings.NiahConfig,
    "hotpotqa": settings.HotpotConfig,
    "rag": settings.RagFields,
    "static": settings.StaticConfig,
    "static-reasoning": settings.StaticReasoningConfig,
    "ablate": settings.AblationFields,
    "ablate-progressive": settings.ProgressiveFields,
    "kv": settings.KVFields,
    "kv-export": settings.KVExportSettings,
    "reproduce": settings.ReproduceConfig,
}
FLAGS = {("rag", "ks"): "--k"}  # rag's flag for its ks field, as before
# the commands that analyse a run: (command words) -> the configs (and fields left out) their options come from
ANALYSIS_CONFIGS = {
    ("dynamism",): [(settings.DynamismSettings, ())],
    ("plot", "heads"): [(settings.HeadPlotSettings, ())],
    ("cca",): [(CCAConfig, ()), (settings.ScoreChoice, ())],
    ("predictor", "train"): [(HeadPredictorConfig, ()), (settings.ScoreChoice, ())],
    ("detect",): [(settings.DetectConfig, ()), (settings.HaluevalConfig, ("data",))],
    ("detect-transfer",): [(settings.DetectConfig, ("static", "folds", "repeats"))],
}


def _help(*words: str) -> str:
    result = CliRunner().invoke(app, [*words, "--help"], env={"COLUMNS": "400", "TERMINAL_WIDTH": "400"})
    assert result.exit_code == 0, result.output
    return result.output


def _params(*words: str) -> dict:
    command = typer.main.get_command(app)
    for word in words:
        command = command.commands[word]
    return {opt: param for param in command.params for opt in param.opts}


@pytest.mark.parametrize("name", sorted(COMMAND_CONFIGS))
def test_help_lists_model_dtype_device_with_the_dtype_default(name):
    text = _help(name)
    for flag in ("--model", "--dtype", "--device"):
        assert flag in text, flag
    dtype_line = next(line for line in text.splitlines() if "--dtype" in line)
    assert "[default: auto]" in dtype_line


def _assert_generated(words: tuple[str, ...], config: type, skip: tuple[str, ...] = ()) -> None:
    """Every field of ``config`` (but ``skip``) is an option of the command, with the field's help and its real
    default shown."""
    params, lines = _params(*words), _help(*words).splitlines()
    for field in dataclasses.fields(config):
        flag = FLAGS.get((words[0], field.name), "--" + field.name.replace("_", "-"))
        if field.name in skip:  # not taken, or the command's own (detect's --data: its help differs)
            continue
        assert flag in params, flag
        assert params[flag].help == field.metadata["help"]  # the help is the field's, written once
        if field.default in (None, "", ()):
            continue  # the help says what None means
        if isinstance(field.default, bool):  # a switch: --name / --no-name
            shown = flag[2:] if field.default else "no-" + flag[2:]
        elif isinstance(field.default, tuple):
            shown = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in field.default)
        else:
            shown = str(field.default)
        block = _option_block(lines, flag)
        assert f"[default: {shown}]" in block, (flag, block)


def _option_block(lines: list[str], flag: str) -> str:
    """The help of option ``flag``: its line and the lines it wraps onto, up to the next option, joined (a long help
    text wraps and its default then stands on a later line)."""
    start = next(i for i, line in enumerate(lines) if f"{flag} " in line)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].lstrip("│ ").startswith("-")), len(lines))
    return " ".join(line.strip("│ ") for line in lines[start:end])


@pytest.mark.parametrize("name", sorted(COMMAND_CONFIGS))
def test_help_shows_each_fields_real_default(name):
    _assert_generated((name,), COMMAND_CONFIGS[name])


@pytest.mark.parametrize("words", sorted(ANALYSIS_CONFIGS), ids=" ".join)
def test_the_analysis_commands_options_are_generated_from_their_configs(words):
    for config, skip in ANALYSIS_CONFIGS[words]:
        _assert_generated(words, config, skip)


def test_the_progressive_lengths_default_is_its_own_not_the_grid_piece_s():
    line = next(line for line in _help("ablate-progressive").splitlines() if "--lengths " in line)
    assert "[default: 1000]" in line


def test_a_default_shown_in_help_does_not_override_the_config_file(monkeypatch, tmp_path):
    """Options the user did not give keep the TOML file's values; given ones override them."""
    import dynheads.experiments.rag as rag

    seen = []

    def fake_run_rag(config, out, batch_size=1):
        seen.append(config)
        (tmp_path / "rag.md").write_text("table\n")
        return type("Run", (), {"path": tmp_path})()

    monkeypatch.setattr(rag, "run_rag", fake_run_rag)
    toml = tmp_path / "rag.toml"
    toml.write_text('questions = 7\nlengths = [300]\ndtype = "float32"\n')
    for extra in ([], ["--questions", "9", "--dtype", "auto"]):
        result = CliRunner().invoke(app, ["rag", "--out", str(tmp_path), "--config", str(toml), *extra])
        assert result.exit_code == 0, result.output
    from_file, overridden = seen
    assert (from_file.questions, from_file.lengths, from_file.dtype) == (7, (300,), "float32")
    assert (overridden.questions, overridden.lengths, overridden.dtype) == (9, (300,), "auto")


def test_help_groups_the_generated_options_by_their_config_piece():
    text = _help("kv")
    panels = [line.split("─")[1].strip() for line in text.splitlines() if line.startswith("╭─")]
    assert panels == ["Options", "Model", "Grid", "Questions and grid"]  # kv reads a question task's stream too
    model_box = text[text.index("╭─ Model") : text.index("╭─ Grid")]
    assert "--dtype" in model_box and "--budgets" not in model_box  # kv's own fields stay under Options
    assert "--lengths" in text[text.index("╭─ Grid") :]
    assert {"Tracing HaluEval (with --data)", "Detectors"} <= {
        line.split("─")[1].strip() for line in _help("detect").splitlines() if line.startswith("╭─")
    }
    detect = _help("detect")
    traced_box = detect[detect.index("╭─ Tracing HaluEval") : detect.index("╭─ Detectors")]
    assert all(flag in traced_box for flag in ("--model", "--dtype", "--questions", "--data"))  # only with --data


def test_trace_shows_each_task_shape_s_default_where_they_differ():
    lines = _help("trace").splitlines()
    line = next(line for line in lines if "--max-new-tokens " in line)
    assert "(default: niah 48, question tasks 24)" in line and "[default:" not in line
    assert "(question tasks only) [default: 45]" in next(line for line in lines if "--questions " in line)


def test_the_head_predictor_keeps_probe_as_a_hidden_alias():
    top = CliRunner().invoke(app, ["--help"], env={"COLUMNS": "400"}).output
    assert "│ predictor " in top and "│ probe " not in top
    for group in ("predictor", "probe"):
        result = CliRunner().invoke(app, [group, "train", "--help"], env={"COLUMNS": "400"})
        assert result.exit_code == 0 and "Train the MLP head predictor" in result.output


def test_trace_help_describes_the_data_of_every_task():
    shown = " ".join(_help("trace").split())
    for words in (
        "custom: your JSONL",
        "{id, context, question, answer, spans?}",
        "variable_tracking[:",
        "hotpotqa-dev",
    ):
        assert words in shown, words


def test_reproduce_help_names_every_stage_in_run_order():
    from dynheads.stages import study_stages

    stages_help = _params("reproduce")["--stages"].help
    assert stages_help.endswith("the stages, in run order: " + ", ".join(study_stages()))
    assert len(study_stages()) == 16


def test_the_command_list_shows_each_first_paragraph_as_one_line():
    """Typer's rich mode kept a docstring's line breaks in ``dynheads --help``, cutting sentences mid-line."""
    top = _help()
    compare = next(line for line in top.splitlines() if "│ compare " in line)
    assert "the verdict matrix, Table 1 beside the paper's rows, the statistics against model size" in compare
    rules = next(line for line in top.splitlines() if "│ rules " in line)
    assert rules.rstrip(" │").endswith("which rules may decide a verdict (no model is loaded).")
