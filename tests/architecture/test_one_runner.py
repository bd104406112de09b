"""One runner: only ``experiments/experiment.py`` loads a run's model, checks its fits, resolves its head sources,
starts the run and runs its jobs (``reproduce.py`` keeps its own study manifest: ``start_run``).

Every call of every module under ``src/dynheads/experiments`` is read with ``ast``, so the test imports nothing it
checks; a call counts whether it names the function (``run_jobs(...)``) or reaches it through a module
(``runs.run_jobs(...)``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dynheads

EXPERIMENTS = Path(dynheads.__file__).parent / "experiments"
RUNNER_ONLY = ("run_model", "start_run", "run_jobs", "resolve", "check_fits")
ALLOWED = {"experiment.py": set(RUNNER_ONLY), "reproduce.py": {"start_run"}}


def runner_calls(source: str) -> list[tuple[int, str]]:
    """(line, name) of each call in ``source`` of a function only the runner may call."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        called = node.func
        name = called.id if isinstance(called, ast.Name) else called.attr if isinstance(called, ast.Attribute) else ""
        if name in RUNNER_ONLY and not _is_path_resolve(called):
            found.append((node.lineno, name))
    return found


def _is_path_resolve(called: ast.expr) -> bool:
    """``Path(x).resolve()`` and ``path.resolve()``: a path's method, not ``resources.resolve``."""
    return (
        isinstance(called, ast.Attribute)
        and called.attr == "resolve"
        and not (isinstance(called.value, ast.Name) and called.value.id == "resources")
    )


def test_only_the_runner_runs_experiments():
    paths = sorted(EXPERIMENTS.glob("*.py"))
    assert len(paths) > 10  # the whole package, not an empty glob
    problems = [
        f"experiments/{path.name}:{line} calls {name}"
        for path in paths
        for line, name in runner_calls(path.read_text(encoding="utf-8"))
        if name not in ALLOWED.get(path.name, set())
    ]
    assert not problems, "\n".join(problems) + "\n(declare an Experiment and run it with run_experiment)"
    assert {name for _, name in runner_calls((EXPERIMENTS / "experiment.py").read_text())} == set(RUNNER_ONLY)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("lm = run_model(config, options)", ["run_model"]),
        ("runs.run_jobs(run, jobs, work, desc='x')", ["run_jobs"]),
        ("def f():\n    check_fits(lm, 10, 4)\n", ["check_fits"]),
        ("sources = resolve(needs, static=None)", ["resolve"]),
        ("sources = resources.resolve(needs)", ["resolve"]),
        ("same = Path(a).resolve() == out.resolve()", []),
        ("run_experiment(KV, config, out)", []),
    ],
)
def test_the_check_sees_runner_calls(source, expected):
    assert [name for _, name in runner_calls(source)] == expected
