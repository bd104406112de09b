"""The generated CLI options: every model-loading command takes --dtype, and flags reach the config parsed."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from dynheads.cli.app import app, register_commands

register_commands()
MODEL_COMMANDS = [
    "niah",
    "hotpotqa",
    "rag",
    "static",
    "static-reasoning",
    "ablate",
    "ablate-progressive",
    "kv",
    "kv-export",
]


def _params(name: str) -> set[str]:
    import typer.main

    command = typer.main.get_command(app).commands[name]
    return {opt for param in command.params for opt in param.opts}


@pytest.mark.parametrize("name", MODEL_COMMANDS)
def test_every_model_loading_command_takes_model_dtype_device(name):
    assert {"--model", "--dtype", "--device"} <= _params(name)


@pytest.fixture
def rag_configs(monkeypatch, tmp_path) -> dict:
    """The config each ``dynheads rag`` invocation hands to the runner (stubbed: no model loads)."""
    import dynheads.experiments.rag as rag

    seen: dict = {}

    def fake_run_rag(config, out, batch_size=1):
        seen["config"] = config
        (tmp_path / "rag.md").write_text("table\n")
        return type("Run", (), {"path": tmp_path})()

    monkeypatch.setattr(rag, "run_rag", fake_run_rag)
    return seen


def test_flags_reach_the_config_parsed_and_renamed(rag_configs, tmp_path):
    from dynheads.experiments.rag import RagConfig

    seen = rag_configs
    result = CliRunner().invoke(
        app,
        [
            "rag",
            "--out",
            str(tmp_path),
            "--k",
            "5,10",
            "--lengths",
            "250",
            "--depths",
            "0.5",
            "--dtype",
            "float32",
            "--strategies",
            "none,static",
        ],
    )
    assert result.exit_code == 0, result.output
    config = seen["config"]
    assert config.ks == (5, 10) and config.lengths == (250,) and config.depths == (0.5,)
    assert config.dtype == "float32" and config.strategies == ("none", "static")
    assert config.questions == RagConfig().questions  # flags not given keep the config's value


@pytest.mark.parametrize("flag", ["--predictor", "--probe"])
def test_the_head_predictor_is_given_by_predictor_and_its_old_spelling(flag, rag_configs, monkeypatch, tmp_path):
    """Issue 62: ``--predictor`` names the trained head predictor (the "probe" is the attention probe); ``--probe``
    still works. The config field keeps its name, so manifests and TOML files of earlier runs still read."""
    from dynheads.cli import checks

    for name in ("rag", "kv", "rerank", "detect"):
        assert {"--predictor", "--probe"} <= _params(name), name

    monkeypatch.setitem(checks.FIELD_CHECKS, "probe", lambda path: None)  # no trained predictor needed here
    result = CliRunner().invoke(app, ["rag", "--out", str(tmp_path), flag, str(tmp_path / "predictor")])
    assert result.exit_code == 0, result.output
    assert rag_configs["config"].probe == str(tmp_path / "predictor")


def test_static_takes_no_runs_option():
    assert "--runs" not in _params("static") and "--samples" in _params("static")


def test_detect_transfer_hands_the_shared_detector_options_to_its_config(monkeypatch, tmp_path):
    import dynheads.experiments.halueval as halueval

    seen = {}

    def fake_run_transfer(first, second, config, out):
        seen["config"] = config
        out.mkdir()
        (out / "transfer.md").write_text("table\n")

    monkeypatch.setattr(halueval, "run_transfer", fake_run_transfer)
    for name in ("qa", "dialogue"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "manifest.json").write_text('{"kind": "detect"}')
    result = CliRunner().invoke(
        app,
        [
            "detect-transfer",
            str(tmp_path / "qa"),
            str(tmp_path / "dialogue"),
            "--out",
            str(tmp_path / "out"),
            "--feature-sets",
            "lookback, entropy",
            "--match-length",
            "--bootstrap",
            "50",
        ],
    )
    assert result.exit_code == 0, result.output
    config = seen["config"]
    assert config.feature_sets == ("lookback", "entropy") and config.match_length and config.bootstrap == 50
    assert config.seed == type(config)().seed  # not given: the config's
