"""One runner: only ``experiments/experiment.py`` loads a run's model, checks its fits, resolves its head sources,
starts the run and runs its jobs (``reproduce.py`` keeps its own study manifest: ``start_run``); the readings of
finished runs (``views/``) run nothing. One writer: both write their files through ``outputs.write_outputs``.

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
VIEWS = Path(dynheads.__file__).parent / "views"  # readings of finished runs: they run nothing and write the same way
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
    paths = sorted(EXPERIMENTS.glob("*.py")) + sorted(VIEWS.glob("*.py"))
    assert len(paths) > 10  # the whole packages, not an empty glob
    problems = [
        f"{path.parent.name}/{path.name}:{line} calls {name}"
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


# ---- one writer: experiments write files through outputs.write_outputs only ----------------------------------------
WRITE_CALLS = {"atomic_path", "mkdir", "savefig", "savez", "to_csv", "to_parquet", "write_bytes", "write_text"}
ONE_WRITER = "write_outputs"
WRITES_ALLOWED = {"reproduce.py": {"write_json"}}  # the study's stage log, beside its manifest (start_run)


def file_writes(source: str, checked_elsewhere: frozenset[str] = frozenset()) -> list[tuple[int, str]]:
    """(line, name) of each call in ``source`` that writes a file by itself: a write primitive, ``open`` for
    writing, a ``save*`` or ``write_*`` function or method (``outputs.write_outputs``, the one writer, excepted, and
    the functions ``checked_elsewhere``: those of experiments/, whose own bodies are checked), or a ``plot_*``
    function of ``dynheads.plots`` (each saves its figure)."""
    tree = ast.parse(source)
    plots = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dynheads.plots")
        for alias in node.names
        if alias.name.startswith("plot_")
    }
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        called = node.func
        name = called.id if isinstance(called, ast.Name) else called.attr if isinstance(called, ast.Attribute) else ""
        writes = name in WRITE_CALLS or name.startswith(("save", "write_")) or name in plots or _opens_to_write(node)
        if writes and name != ONE_WRITER and name not in checked_elsewhere:
            found.append((node.lineno, name))
    return found


def _opens_to_write(call: ast.Call) -> bool:
    """``open(path, "w")`` and the like (a mode with w, a or x); reading is no write."""
    if not (isinstance(call.func, ast.Name) and call.func.id == "open"):
        return False
    modes = list(call.args[1:2]) + [kw.value for kw in call.keywords if kw.arg == "mode"]
    return any(isinstance(mode, ast.Constant) and set(str(mode.value)) & set("wax") for mode in modes)


def defined_functions(paths: list[Path]) -> frozenset[str]:
    return frozenset(
        node.name
        for path in paths
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.FunctionDef)
    )


def test_experiments_write_files_through_the_one_writer():
    paths = sorted(EXPERIMENTS.glob("*.py")) + sorted(VIEWS.glob("*.py"))
    ours = defined_functions(paths)
    assert {"write_cells", "write_doses", "write_kv_tables"} <= ours  # wrappers of write_outputs, checked themselves
    problems = [
        f"{path.parent.name}/{path.name}:{line} calls {name}"
        for path in paths
        for line, name in file_writes(path.read_text(encoding="utf-8"), ours)
        if name not in WRITES_ALLOWED.get(path.name, set())
    ]
    assert not problems, "\n".join(problems) + "\n(return the files as outputs.Outputs; write_outputs writes them)"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("frame.to_csv(path, index=False)", ["to_csv"]),
        ("write_json(out / 'a.json', data)", ["write_json"]),
        ("with atomic_path(path) as tmp:\n    pass\n", ["atomic_path"]),
        ("from dynheads.plots.kv import plot_kv_grid\nplot_kv_grid(cells, path)", ["plot_kv_grid"]),
        ("from dynheads.plots.kv import plot_kv_grid\nfigure = Written(partial(plot_kv_grid, cells))", []),
        ("fitted.save(path)", ["save"]),
        ("write_outputs(run.path, outputs)", []),
        ("table = frame.groupby('k').mean()", []),
        ("with open(path, 'wb') as handle:\n    pass\n", ["open"]),
        ("text = open(path).read()", []),
        ("from dynheads.plots.kv import pareto_front\nfront = pareto_front(table)", []),
    ],
)
def test_the_check_sees_file_writes(source, expected):
    assert [name for _, name in file_writes(source)] == expected


# ---- three floors inside experiments/: the runner, the experiments, the study ---------------------------------------
# A module imports modules of a lower floor (or, on the study's floor, of its own): an experiment reads the runner
# and nothing beside it (settings, views and mechanisms live below experiments/ altogether).
EXPERIMENT_FLOORS = [
    {"experiment"},  # the one runner, and the tracing experiment every task gets
    {"ablation", "dose", "halueval", "hotpotqa", "kv", "niah", "rag", "rerank", "static"},  # one kind of run each
    {"paper_stages", "reproduce", "study_time"},  # the study: its stages' declarations, its loop, its time estimate
]


def sibling_imports(source: str) -> set[str]:
    """The modules of experiments/ that ``source`` imports (``from dynheads.experiments.x import ...`` and
    ``from dynheads.experiments import x``), lazy imports included."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module == "dynheads.experiments":
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("dynheads.experiments."):
            found.add(node.module.split(".")[2])
        elif isinstance(node, ast.Import):
            found |= {a.name.split(".")[2] for a in node.names if a.name.startswith("dynheads.experiments.")}
    return found


def floor_of(module: str) -> int:
    floors = [index for index, members in enumerate(EXPERIMENT_FLOORS) if module in members]
    assert floors, f"experiments/{module}.py has no floor: add it to EXPERIMENT_FLOORS in {__name__}"
    return floors[0]


def test_experiments_import_only_a_floor_below_or_the_study_its_own():
    modules = sorted(path.stem for path in EXPERIMENTS.glob("*.py") if path.stem != "__init__")
    assert set(modules) == set().union(*EXPERIMENT_FLOORS)  # every module has a floor, no floor names a ghost
    problems = []
    for module in modules:
        floor = floor_of(module)
        for target in sibling_imports((EXPERIMENTS / f"{module}.py").read_text(encoding="utf-8")) - {module}:
            target_floor = floor_of(target)
            if target_floor > floor or (target_floor == floor and floor != len(EXPERIMENT_FLOORS) - 1):
                problems.append(f"experiments/{module}.py imports experiments/{target}.py")
    assert not problems, "\n".join(problems)


def test_the_floor_check_reads_every_form_of_import():
    source = "from dynheads.experiments.kv import run_kv\nfrom dynheads.experiments import dose\n"
    lazy = "def f():\n    import dynheads.experiments.rag\n"
    assert sibling_imports(source + lazy) == {"kv", "dose", "rag"}
    assert sibling_imports("from dynheads.settings import KVFields\nfrom dynheads.views import qa\n") == set()


# ---- a variant's name is parsed by its registry alone ------------------------------------------------------------
def registered_names() -> set[str]:
    """Every name of the variant registries the runners choose from (KV policies and presses, ablation strategies and
    matchings, RAG and re-rank strategies)."""
    from dynheads.ablation.strategies import ABLATION_STRATEGIES, MATCHINGS
    from dynheads.kv.policies import KV_POLICIES
    from dynheads.kv.press_registry import KVPRESS_PRESSES
    from dynheads.rag.rerank_strategies import RERANK_STRATEGIES
    from dynheads.rag.strategies import RAG_STRATEGIES

    registries = (KV_POLICIES, KVPRESS_PRESSES, ABLATION_STRATEGIES, MATCHINGS, RAG_STRATEGIES, RERANK_STRATEGIES)
    return {name for registry in registries for name in registry.names()}


def name_comparisons(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) of each comparison in ``source`` with a registered name as a literal (``policy == "full"``,
    ``strategy in ("dynamic", "static")``): what a variant is must come from its registry entry."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Compare):
            continue
        for side in (node.left, *node.comparators):
            literals = side.elts if isinstance(side, ast.Tuple | ast.Set | ast.List) else [side]
            found += [
                (node.lineno, literal.value)
                for literal in literals
                if isinstance(literal, ast.Constant) and literal.value in names
            ]
    return found


def test_no_runner_compares_a_name_with_a_registered_variant():
    names = registered_names()
    assert {"full", "dynamic", "snapkv", "qrhead", "mean"} <= names  # the registries were read
    problems = [
        f"experiments/{path.name}:{line} compares with {name!r}"
        for path in sorted(EXPERIMENTS.glob("*.py"))
        for line, name in name_comparisons(path.read_text(encoding="utf-8"), names)
    ]
    assert not problems, "\n".join(problems) + "\n(read what the variant is from its registry entry: kv.arms, ...)"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("record_probe = policy == 'full'", ["full"]),
        ("if r['strategy'] in ('dynamic', 'static'):\n    pass\n", ["dynamic", "static"]),
        ("if 'qrhead' not in bases:\n    pass\n", ["qrhead"]),
        ("same = arm.reference and budget is None", []),
        ("kind = manifest.get('kind') != RERANK.kind", []),
    ],
)
def test_the_check_sees_comparisons_with_registered_names(source, expected):
    assert [name for _, name in name_comparisons(source, {"full", "dynamic", "static", "qrhead"})] == expected
