"""Imports run one way: a module of dynheads imports only modules of its own room or of a floor below.

Every import statement of every module under src/dynheads is read with ``ast`` (the ones inside functions too,
since a lazy import is still an arrow), so the test needs no model and imports nothing it checks. A new module
must be given a room here; the reason for each floor is written beside it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import dynheads

PACKAGE = Path(dynheads.__file__).parent

# Lowest floor first; each floor holds rooms (tuples of module prefixes). A module imports its own room and any
# floor below, never another room of its floor (the report and experiments sit side by side and neither imports
# the other). A module's room is that of the longest prefix listed (``dynheads.tasks`` covers ``...tasks.niah``).
FLOORS: list[tuple[str, list[tuple[str, ...]]]] = [
    # Plain helpers any code may need: errors, files, head names, config parsing, score thresholds, seeds, the
    # worker layout, the stage names, the paper's published numbers (data, no code of ours), the lazy
    # re-export helper of the public packages (it imports nothing of ours until a name is used), the score
    # vocabulary (Eq. 1, Eq. 2, D_t and their defaults: arithmetic on arrays, read by every floor above), and the
    # tables and stage summaries as data with their one renderer (analyses and stages write them, the report reads
    # them), the files a finished run's tables are (``outputs``: data from pure functions, written by one writer),
    # the pinned wheels that real data sets and models are read from (files, no torch), and the generic
    # registry of named variants (tasks, KV policies, strategies and stages each hold one), and the counter of host
    # reads (a torch function mode: benchmarks and tests measure the decoding loop with it).
    (
        "foundation",
        [
            (
                "dynheads.errors",
                "dynheads.hostreads",
                "dynheads.io",
                "dynheads.heads",
                "dynheads.config",
                "dynheads.thresholds",
                "dynheads.distributed",
                "dynheads.plugins",
                "dynheads.seeding",
                "dynheads.stages",
                "dynheads.paper",
                "dynheads.lazy",
                "dynheads.scores",
                "dynheads.tables",
                "dynheads.outputs",
                "dynheads.packaged",
                "dynheads.registry",
            )
        ],
    ),
    # Loading a model and the trace file format: what everything that runs or reads a generation shares.
    ("model and trace formats", [("dynheads.models",), ("dynheads.traces",)]),
    # Data and numbers without a forward pass: prompts and samples of each task (a tokenizer at most), and the
    # analyses of finished traces (dynamism, CCA, the MLP head predictor, head lists). Neither may depend on how a
    # generation is run or stored, so tasks never import runs and analyses never import the decoding loop.
    ("tasks and analyses", [("dynheads.tasks",), ("dynheads.analysis",)]),
    # The engine (``engine/``), its lower half: the attention probe, Eq. 1 / Eq. 2 inside the attention function,
    # and masking heads.
    ("attention probe", [("dynheads.engine", "dynheads.engine.probe")]),
    # The engine's upper half: the greedy decoding loop that drives the probe (its batched form, and tracing: the
    # loop's simplest policy, recording every head's scores at every step); beside it run folders (manifests,
    # records), the one resumable job loop that fills them, and the head sources a run reads (static lists and
    # predictors, checked against what the run evaluates in one place).
    (
        "decoding and runs",
        [
            ("dynheads.engine.decoding", "dynheads.engine.batching", "dynheads.engine.tracing"),
            ("dynheads.runs", "dynheads.resources"),
        ],
    ),
    # Mechanisms built on the decoding loop, a package each: per-step ablation (``ablation/``: the cascade, the
    # teacher-forced dose-response, the strategies), KV retention (``kv/``: its policies, simulated, the real
    # per-head cache, the head-guided token votes and kvpress's presses beside them), head-based RAG (``rag/``).
    ("mechanisms", [("dynheads.ablation",), ("dynheads.kv",), ("dynheads.rag",)]),
    # Figures from tables and arrays; experiments call them, nothing below draws.
    ("plots", [("dynheads.plots",)]),
    # The settings of every command, composed from small frozen pieces (no torch: the CLI builds its options from them).
    ("settings", [("dynheads.settings",)]),
    # Readings of finished runs, without decoding: dynamism, CCA and Figure 1, the head predictor trained on a run,
    # thresholds fitted on a run, detection, the KV tables and the join of KV runs. Experiments read them.
    ("views", [("dynheads.views",)]),
    # Runners that compose the floors below into the stages of the study (and ``reproduce``, all stages), beside
    # the report, which reads finished stage folders: it never runs a stage, and no stage writes the report.
    ("results", [("dynheads.experiments",), ("dynheads.report",)]),
    # Entry points: the CLI (which writes the report after ``reproduce``), the doctor, and the package's lazy
    # public facade (``dynheads.__init__`` loads names on first use, so importing it pulls in nothing below).
    ("entry points", [("dynheads.cli", "dynheads.doctor", "dynheads.__main__", "dynheads")]),
]


def room_of(module: str) -> tuple[int, int]:
    """(floor, room) of ``module``."""
    matches = [
        (len(prefix), floor, room)
        for floor, (_, rooms) in enumerate(FLOORS)
        for room, prefixes in enumerate(rooms)
        for prefix in prefixes
        if module == prefix or module.startswith(prefix + ".")
    ]
    if not matches:
        raise AssertionError(f"{module} has no floor: add it to FLOORS in tests/architecture/test_import_floors.py")
    return max(matches)[1:]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(source: str, package: Path = PACKAGE) -> list[tuple[int, str]]:
    """(line, module) of every dynheads import in ``source``; ``from dynheads.x import y`` names ``dynheads.x.y``
    when ``y`` is a module of the package, else ``dynheads.x``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "dynheads"]
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "dynheads":
            assert node.level == 0, "dynheads uses absolute imports only"
            for alias in node.names:
                sub = package.parent.joinpath(*node.module.split("."), alias.name)
                is_module = sub.with_suffix(".py").is_file() or (sub / "__init__.py").is_file()
                found.append((node.lineno, f"{node.module}.{alias.name}" if is_module else node.module))
    return found


def upward_imports(module: str, source: str) -> list[str]:
    """Each import of ``source`` (the text of ``module``) that reaches a higher floor or another room of its
    floor, as a readable line."""
    floor, room = room_of(module)
    problems = []
    for line, target in dict.fromkeys(imported_modules(source)):  # one line per module, not per name
        target_floor, target_room = room_of(target)
        if target_floor > floor or (target_floor == floor and target_room != room):
            where = "above" if target_floor > floor else "beside"
            problems.append(f"{module}:{line} imports {target} ({FLOORS[target_floor][0]}, {where} {module})")
    return problems


def test_no_import_runs_up_a_floor():
    paths = sorted(PACKAGE.rglob("*.py"))
    assert len(paths) > 40  # the whole package, not an empty glob
    problems = [
        problem for path in paths for problem in upward_imports(module_name(path), path.read_text(encoding="utf-8"))
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("dynheads.tasks.hotpotqa", "from dynheads.runs import derive_seed", ["dynheads.runs"]),
        (
            "dynheads.report.claim_parts",
            "def f():\n    from dynheads.experiments.rag import rag_table\n",
            ["dynheads.experiments.rag"],
        ),
        ("dynheads.analysis.cca", "import dynheads.engine.decoding", ["dynheads.engine.decoding"]),
        ("dynheads.experiments.experiment", "from dynheads.engine import batching", []),
        ("dynheads.experiments.reproduce", "from dynheads.report import write_report", ["dynheads.report"]),
        ("dynheads.analysis.static", "from dynheads.tasks import niah", ["dynheads.tasks.niah"]),
        ("dynheads.cli.commands", "from dynheads.report import write_report\nimport dynheads.experiments.rag", []),
        (
            "dynheads.report.claim_parts",
            "from dynheads.rag.results import rag_table\nfrom dynheads.paper import PAPER_MODEL",
            [],
        ),
    ],
)
def test_the_check_sees_upward_imports_lazy_ones_included(module, source, expected):
    assert [problem.split(" imports ")[1].split(" (")[0] for problem in upward_imports(module, source)] == expected


def private_imports(module: str, source: str) -> list[str]:
    """Each ``_private`` name ``source`` (the text of ``module``) imports from another dynheads module, as a
    readable line: ``from dynheads.x import _y`` and ``import dynheads.x._y`` alike (dunders such as
    ``__version__`` are public). A name shared between modules is made public or moved where it belongs."""
    problems = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "dynheads":
            names = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names if alias.name.split(".")[0] == "dynheads"]
        else:
            continue
        for name in names:
            private = [part for part in name.split(".") if part.startswith("_") and not part.endswith("__")]
            if private:
                problems.append(f"{module}:{node.lineno} imports {name}, a private name of another module")
    return problems


def test_no_module_imports_another_modules_private_name():
    paths = sorted(PACKAGE.rglob("*.py"))
    assert len(paths) > 40
    problems = [
        problem for path in paths for problem in private_imports(module_name(path), path.read_text(encoding="utf-8"))
    ]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from dynheads.plots.ablation import _save, plot_heatmaps", ["dynheads.plots.ablation._save"]),
        (
            "def f():\n    from dynheads.views.detect import (\n        Detector,\n        _score,\n    )\n",
            ["dynheads.views.detect._score"],
        ),
        ("import dynheads._internal.cache", ["dynheads._internal.cache"]),
        ("from dynheads import __version__\nfrom dynheads.tasks.niah import load_haystack", []),
        ("from numpy import _private\nimport os._x", []),
    ],
)
def test_the_check_sees_private_imports_multi_line_and_lazy_ones_included(source, expected):
    found = [problem.split(" imports ")[1].split(",")[0] for problem in private_imports("dynheads.x", source)]
    assert found == expected


def import_circle(graph: dict[str, set[str]]) -> list[str]:
    """One circle of ``graph`` (module -> the modules it imports) as a path that ends where it starts, or []."""
    state: dict[str, str] = {}  # "open" while its imports are walked, "done" after

    def walk(module: str, path: list[str]) -> list[str]:
        state[module] = "open"
        for target in sorted(graph.get(module, ())):
            if state.get(target) == "open":
                return path[path.index(target) :] + [target]
            if target not in state and (circle := walk(target, path + [target])):
                return circle
        state[module] = "done"
        return []

    for module in sorted(graph):
        if module not in state and (circle := walk(module, [module])):
            return circle
    return []


def test_no_import_circle_lazy_imports_included():
    """No module of dynheads reaches itself through imports, lazy ones included: the task registry imports no
    task (a task declares the data that selects it, ``Task.data_source`` and ``selects``, which ``task_of``
    reads), so a task module may import the registry."""
    paths = sorted(PACKAGE.rglob("*.py"))
    graph = {module_name(path): set() for path in paths}
    for path in paths:
        graph[module_name(path)] = {t for _, t in imported_modules(path.read_text(encoding="utf-8")) if t in graph}
    assert len(graph) > 40 and any(graph.values())
    circle = import_circle(graph)
    assert not circle, " -> ".join(circle)


def test_the_circle_check_finds_a_lazy_circle():
    assert import_circle({"a": {"b"}, "b": {"c"}, "c": {"b"}}) == ["b", "c", "b"]
    assert import_circle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) == []
