"""CLI for tracing: ``trace --task NAME`` (any registered task), ``tasks`` (the registered ones) and the older
spellings ``niah`` and ``hotpotqa`` (``trace --task niah`` / ``--task hotpotqa`` with their own options' defaults).

A task's config has one of two shapes (docs/tasks.md): NIAH-shaped (``NiahConfig``: lengths x depths x runs) or
question-shaped (``HotpotConfig``: a question stream over lengths x depths); ``trace`` takes the options of both
and builds the one its task reads.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from dynheads.cli import checks
from dynheads.cli.app import app
from dynheads.cli.options import (
    BatchSize,
    ConfigFile,
    DeviceMap,
    Opt,
    RunOut,
    config_options,
    shared_options,
    with_options,
)
from dynheads.errors import DynheadsError
from dynheads.settings import HotpotConfig, NiahConfig

TaskName = Annotated[str, Opt("--task", help="a registered task ('dynheads tasks' lists them)")]
SHAPES = {"niah": NiahConfig, "question tasks": HotpotConfig}  # trace's option defaults are named by these labels


@app.command()
@with_options(shared_options(SHAPES))
def trace(
    out: RunOut,
    task: TaskName = "niah",
    batch_size: BatchSize = 1,
    device_map: DeviceMap = None,
    config: ConfigFile = None,
    **settings,
) -> None:
    """Trace greedy generation on any registered task's grid, scoring every head at every step.

    The task decides the score (Eq. 1 or Eq. 2) and which options apply: 'dynheads tasks' lists them."""
    _trace(task, out, config, settings, batch_size=batch_size, device_map=device_map)


@app.command()
@with_options(config_options(NiahConfig))
def niah(
    out: RunOut, batch_size: BatchSize = 1, device_map: DeviceMap = None, config: ConfigFile = None, **settings
) -> None:
    """Trace greedy generation on a Needle-in-a-Haystack grid, scoring every head at every step.

    The same as 'dynheads trace --task niah', with NIAH's options only."""
    _trace("niah", out, config, settings, batch_size=batch_size, device_map=device_map)


@app.command()
@with_options(config_options(HotpotConfig))
def hotpotqa(
    out: RunOut, batch_size: BatchSize = 1, device_map: DeviceMap = None, config: ConfigFile = None, **settings
) -> None:
    """Trace multi-hop QA (HotpotQA or its synthetic stand-in), scoring every head at every step with Eq. 2.

    The same as 'dynheads trace --task hotpotqa'; --data multihop:..., variable_tracking or multikey_niah traces
    that task."""
    _trace("hotpotqa", out, config, settings, batch_size=batch_size, device_map=device_map)


@app.command("tasks")
def list_tasks() -> None:
    """List the registered tasks ('dynheads trace --task NAME', 'dynheads ablate --task NAME'), one line each."""
    from dynheads.tasks.registry import get_task, task_names

    entries = [get_task(name) for name in task_names()]
    width = max(len(entry.name) for entry in entries)
    for entry in entries:
        typer.echo(f"{entry.name:{width}}  {describe(entry)}")


# What ``dynheads list`` shows: the kind a user names -> the registry ("module:attribute") and how a name is typed
REGISTRIES = {
    "tasks": ("dynheads.tasks.registry:TASKS", "--task {}"),
    "scores": ("dynheads.scores:HEAD_SCORES", "--score {}"),
    "ablation-strategies": ("dynheads.ablation.strategies:ABLATION_STRATEGIES", "--strategies {}"),
    "matchings": ("dynheads.ablation.strategies:MATCHINGS", "--matching {}"),
    "kv-policies": ("dynheads.kv.policies:KV_POLICIES", "--policies {}"),
    "kvpress-presses": ("dynheads.kv.press_registry:KVPRESS_PRESSES", "--policies kvpress:{}"),
    "rag-strategies": ("dynheads.rag.strategies:RAG_STRATEGIES", "--strategies {}"),
    "rerank-strategies": ("dynheads.rag.rerank_strategies:RERANK_STRATEGIES", "--strategies {}"),
    "stages": ("dynheads.stages:STAGES", "reproduce --stages {}"),
}


@app.command("list")
def list_variants(
    kind: Annotated[
        str | None, typer.Argument(help=f"one of {', '.join(REGISTRIES)}; none: every kind", show_default=False)
    ] = None,
) -> None:
    """List the registered variants of one kind (or of every kind), one line each: the option that takes each name
    and what it does; a variant a --plugin registers is listed with them."""
    from dynheads.errors import did_you_mean
    from dynheads.lazy import imported
    from dynheads.tasks.registry import load_builtin_tasks

    if kind is not None and kind not in REGISTRIES:
        raise DynheadsError(
            f"no kind {kind!r} to list: use one of {', '.join(REGISTRIES)}{did_you_mean(kind, REGISTRIES)}"
        )
    load_builtin_tasks()
    for name in [kind] if kind else list(REGISTRIES):
        target, spelling = REGISTRIES[name]
        registry = imported(target)
        typed = {entry: spelling.format(entry) for entry in registry.names()}
        width = max(map(len, typed.values()), default=0)
        indent = "" if kind else "  "
        if not kind:
            typer.echo(f"{name}:")
        for entry, shown in typed.items():
            typer.echo(f"{indent}{shown:{width}}  {registry.help(entry)}")


def describe(task: Any) -> str:
    """One line: label, score, grid, metrics and the paper's task its numbers are set beside."""
    score = "Eq. 1 copy score" if task.score_kind == "copy" else "Eq. 2 reasoning score"
    grid = "question stream over lengths x depths" if task.questions else "lengths x depths x runs"
    if task.check_data is not None:
        grid = "your records (--data FILE), each as written"
    paper = f"; set beside the paper's {task.paper_label}" if task.paper_task else ""
    return f"{task.label}: {score}, {grid}; metrics {', '.join(task.metrics.values())}{paper}"


def default_data(name: str) -> str | None:
    """The ``data`` value that selects question task ``name`` when none is given (``task_of``'s spelling; None:
    HotpotQA's synthetic questions, or a task that reads no ``data``)."""
    from dynheads.tasks.registry import TASKS, load_builtin_tasks

    load_builtin_tasks()
    return TASKS.get(name).default_data if name in TASKS else None


def _trace(
    name: str, out: Path, config_file: Path | None, settings: dict, *, batch_size: int, device_map: str | None
) -> None:
    """Build the task's config (its shape's fields only), check it and ``out``, trace, print one summary line."""
    import dataclasses

    from dynheads.distributed import is_main
    from dynheads.tasks.registry import get_task, task_of

    shape: type[HotpotConfig] | type[NiahConfig] = HotpotConfig if get_task(name).questions else NiahConfig
    fields = {field.name for field in dataclasses.fields(shape)}
    ignored = get_task(name).ignores
    foreign = [key for key, value in settings.items() if value is not None and (key not in fields or key in ignored)]
    if foreign:
        raise DynheadsError(
            f"--{foreign[0].replace('_', '-')} does not apply to task {name!r}: "
            + (
                f"it does not read {', '.join('--' + key.replace('_', '-') for key in ignored)}"
                if foreign[0] in ignored
                else "a question task takes the settings of 'dynheads hotpotqa', not those of 'dynheads niah'"
                if shape is HotpotConfig
                else "a needle task takes the settings of 'dynheads niah', not those of 'dynheads hotpotqa'"
            )
            + (
                f"; your own records: dynheads trace --task custom --data {settings['data']}"
                if foreign[0] == "data" and str(settings["data"]).endswith(".jsonl")
                else ""
            )
        )
    cfg: HotpotConfig | NiahConfig = checks.checked_config(
        shape, config_file, **{key: settings.get(key) for key in fields}
    )
    given_data = getattr(cfg, "data", None)
    if isinstance(cfg, HotpotConfig) and given_data is None and default_data(name):
        cfg = dataclasses.replace(cfg, data=default_data(name))
    entry = task_of(name, getattr(cfg, "data", None))
    checks.batch_size(batch_size)
    checks.out_dir(out, entry.name, cfg)
    if entry.check_data is not None:  # a user's file: every record checked before the model loads
        entry.check_data(cfg)
    from dynheads.experiments.experiment import run_task
    from dynheads.experiments.hotpotqa import qa_task, run_hotpotqa  # the runners (torch) after the checks

    if isinstance(cfg, NiahConfig) or entry.check_data is not None:
        run = run_task(entry, cfg, out, device_map=device_map, batch_size=batch_size)
    elif qa_task(cfg) is entry:  # HotpotQA and the tasks a data value selects: the answers' table in summary.md
        run = run_hotpotqa(cfg, out, batch_size=batch_size, device_map=device_map)
    elif given_data is not None:
        raise DynheadsError(f"--data {given_data} selects task {qa_task(cfg).name!r}, not {entry.name!r}")
    else:  # a question task registered elsewhere: its grid reads no data value
        run = run_task(entry, cfg, out, device_map=device_map, batch_size=batch_size)
    if is_main():  # under torchrun / accelerate launch, rank 0 summarises
        typer.echo(_summary_line(run, entry, out))


def _summary_line(run: Any, task: Any, out: Path) -> str:
    """``N samples in OUT: accuracy 1.000, ROUGE-L 1.000``; question tasks add the skipped pairs and the chance
    level (from summary.md's numbers)."""
    from dynheads.io import read_json

    frame = run.write_results()
    means = ", ".join(
        f"{label} {frame[f'metrics.{key}'].mean():.3f}"
        for key, label in task.metrics.items()
        if f"metrics.{key}" in frame
    )
    if not task.questions:
        return f"{len(frame)} samples in {out}: {means}"
    if task.check_data is not None:  # a user's file: no grid cells, nothing skipped
        return f"{len(frame)} records in {out}: {means} ('dynheads view {out}' shows the heads per step)"
    skipped = run.manifest().get("skipped", {})
    reasons = "; ".join(f"{n} {why}" for why, n in skipped.get("by_reason", {}).items())
    chance = (run.path / "summary.json").is_file() and read_json(run.path / "summary.json")["documents"]["summary.md"][
        "numbers"
    ].get("candidates")
    return (
        f"{len(frame)} questions in {out}: {means}; "
        f"{skipped.get('count', 0)} (question, cell) pairs skipped"
        + (f" ({reasons})" if reasons else "")
        + (
            f"; chance (random candidate) EM {chance['chance']:.3f}, best position heuristic "
            f"{max(chance.get('heuristics', {}).values(), default=float('nan')):.3f} (summary.md)"
            if chance
            else ""
        )
    )
