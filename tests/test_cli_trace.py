"""``dynheads trace --task NAME`` traces any registered task; ``niah`` and ``hotpotqa`` are its aliases;
``dynheads tasks`` lists the registry; ``--help`` loads no torch."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from cli_main import run_main

from dynheads.runs import RunDir
from dynheads.tasks.registry import get_task, task_names

SMALL = ["--lengths", "200", "--depths", "0.5", "--max-new-tokens", "3"]


def test_tasks_lists_every_registered_task_with_its_label(capsys, monkeypatch):
    result = run_main(capsys, monkeypatch, "tasks")
    assert result.code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert [line.split()[0] for line in lines] == task_names()
    for line, name in zip(lines, task_names(), strict=True):
        task = get_task(name)
        assert f"{task.label}: " in line and ", ".join(task.metrics.values()) in line
    assert "Eq. 1 copy score, lengths x depths x runs" in lines[0]


def test_list_shows_every_registered_variant_as_its_option_takes_it(capsys, monkeypatch):
    from dynheads.ablation.strategies import ABLATION_STRATEGIES
    from dynheads.cli.trace_commands import REGISTRIES
    from dynheads.kv.press_registry import KVPRESS_PRESSES
    from dynheads.lazy import imported

    everything = run_main(capsys, monkeypatch, "list")
    assert everything.code == 0, everything.stderr
    headings = [line[:-1] for line in everything.stdout.splitlines() if not line.startswith(" ")]
    assert headings == list(REGISTRIES)
    listed = sum(len(imported(target).names()) for target, _ in REGISTRIES.values())
    assert len(everything.stdout.splitlines()) == len(REGISTRIES) + listed
    presses = run_main(capsys, monkeypatch, "list", "kvpress-presses").stdout.splitlines()
    assert [line.split()[:2] for line in presses] == [["--policies", f"kvpress:{n}"] for n in KVPRESS_PRESSES.names()]
    assert presses[1].endswith(KVPRESS_PRESSES.help("snapkv"))
    tasks = run_main(capsys, monkeypatch, "list", "tasks").stdout.splitlines()
    assert [line.split()[1] for line in tasks] == task_names()

    mine = ABLATION_STRATEGIES.get("dynamic")
    ABLATION_STRATEGIES.register("listed-by-a-test", mine, help="registered where the user's code is")
    try:
        strategies = run_main(capsys, monkeypatch, "list", "ablation-strategies").stdout
    finally:
        ABLATION_STRATEGIES.unregister("listed-by-a-test")
    assert re.search(r"^--strategies listed-by-a-test +registered where the user's code is$", strategies, re.M)
    wrong = run_main(capsys, monkeypatch, "list", "kv-polices")
    assert wrong.code == 2 and "did you mean 'kv-policies'" in wrong.stderr and "Traceback" not in wrong.stderr


def test_trace_niah_equals_the_niah_alias(tiny_model_dir, tmp_path, capsys, monkeypatch):
    common = ["--model", tiny_model_dir, *SMALL, "--runs", "1"]
    alias = run_main(capsys, monkeypatch, "niah", *common, "--out", tmp_path / "alias")
    traced = run_main(capsys, monkeypatch, "trace", "--task", "niah", *common, "--out", tmp_path / "trace")
    assert alias.code == traced.code == 0, alias.stderr + traced.stderr
    assert alias.stdout.replace(str(tmp_path / "alias"), "OUT") == traced.stdout.replace(str(tmp_path / "trace"), "OUT")
    assert traced.stdout.startswith("1 samples in") and "accuracy" in traced.stdout
    assert RunDir(tmp_path / "alias").records() == RunDir(tmp_path / "trace").records()
    manifests = [json.loads((tmp_path / name / "manifest.json").read_text()) for name in ("alias", "trace")]
    assert manifests[0]["kind"] == manifests[1]["kind"] == "niah"
    assert manifests[0]["config"] == manifests[1]["config"]


def test_trace_a_question_task_reads_its_own_data_spelling(tiny_model_dir, tmp_path, capsys, monkeypatch):
    out = tmp_path / "multihop"
    result = run_main(
        capsys,
        monkeypatch,
        "trace",
        "--task",
        "multihop",
        "--model",
        tiny_model_dir,
        *SMALL,
        "--questions",
        "2",
        "--out",
        out,
    )
    assert result.code == 0, result.stderr
    manifest = RunDir(out).manifest()
    assert manifest["kind"] == "multihop" and manifest["config"]["data"] == "multihop:hops=2"
    assert result.stdout.startswith("2 questions in") and "EM" in result.stdout
    assert (out / "summary.md").is_file()  # the question tasks' answer table, as 'hotpotqa --data multihop:...'


@pytest.mark.parametrize(
    "name", [name for name in task_names() if get_task(name).questions and get_task(name).check_data is None]
)
def test_every_question_task_s_default_data_selects_it(name):
    """What 'trace --task NAME' without --data reads, and what the HotpotQA-shaped runner makes of it, agree (a task
    that reads the user's own file, ``custom``, is selected by its name only: tests/test_own_data*.py)."""
    from dynheads.cli.trace_commands import default_data
    from dynheads.experiments.hotpotqa import qa_task
    from dynheads.settings import HotpotConfig

    assert qa_task(HotpotConfig(data=default_data(name))) is get_task(name)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--task", "no_such_task"], "unknown task 'no_such_task'"),
        (["--task", "niah", "--questions", "3"], "--questions does not apply to task 'niah'"),
        (
            ["--task", "hotpotqa", "--runs", "2"],
            "--runs does not apply to task 'hotpotqa': a question task takes the settings of 'dynheads hotpotqa'",
        ),
        (["--task", "variable_tracking", "--data", "multihop"], "--data multihop selects task 'kv_lookup'"),
        (
            ["--task", "custom", "--lengths", "500"],
            "--lengths does not apply to task 'custom': it does not read --lengths, --depths, --pad",
        ),
    ],
)
def test_a_wrong_task_or_option_is_one_line(tmp_path, capsys, monkeypatch, args, message):
    result = run_main(
        capsys, monkeypatch, "trace", *args, "--model", tmp_path / "never-loaded", "--out", tmp_path / "out"
    )
    assert result.code == 2 and result.stderr.startswith("error: ") and message in result.stderr, result.stderr
    assert len(result.stderr.splitlines()) == 1 and not (tmp_path / "out").exists()


@pytest.mark.parametrize("args", [["--help"], ["trace", "--help"], ["kv", "--help"]])
def test_help_imports_no_torch(args):
    script = (
        "import sys\nfrom dynheads.cli.app import main\nsys.argv = ['dynheads', *sys.argv[1:]]\n"
        "try:\n    main()\nexcept SystemExit as stop:\n    assert stop.code in (0, None), stop.code\n"
        "print('torch' in sys.modules)"
    )
    result = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "False" and "Usage" in result.stdout
