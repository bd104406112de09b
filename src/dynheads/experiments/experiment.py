"""One runner for every experiment: an ``Experiment`` declares what a run does, ``run_experiment`` runs it.

An experiment declares, for its config and the loaded model, a ``Plan``: the samples that must fit the model's
window, the head sources it reads and what it evaluates (so a source fitted on that is refused). With the sources
loaded and checked, its ``work`` gives what the run's manifest records and the ``Phase``s of jobs it decodes, and
its ``tables`` the files rank 0 writes from the finished run (``outputs.Outputs``, written by
``outputs.write_outputs``, the one writer). ``run_experiment`` is the only place that loads the model,
checks the fits, resolves the sources, starts (or resumes) the run and runs the jobs:

    check the config -> load the model -> plan -> check fits -> resolve sources -> work -> start the run
    -> run each phase's jobs (every process its share) -> rank 0 writes the tables

The public runners are thin functions over it (``run_kv(config, out)`` runs ``KV``). The tracing experiment every
registered task gets is here too (``run_traced``, ``run_task``): samples are traced ``batch_size`` at a time
(``dynheads.engine.batching``; 1 = the reference path), and under ``torchrun`` / ``accelerate launch`` each rank
traces its own share.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar, Unpack

from dynheads import distributed
from dynheads.engine.decoding import check_fits
from dynheads.engine.tracing import trace_batch
from dynheads.errors import DynheadsError
from dynheads.heads import head_key
from dynheads.models import LoadedModel
from dynheads.outputs import Outputs, write_outputs
from dynheads.resources import STATIC_HEADS, Evaluated, Resources, resolve, sample_identity
from dynheads.runs import (
    RESULTS_FILE,
    Finished,
    Job,
    RunDir,
    RunOptions,
    RunView,
    batch_size_of,
    run_jobs,
    run_model,
    start_run,
)
from dynheads.tasks.grid import TaskGrid
from dynheads.tasks.registry import Task, get_task
from dynheads.views.threshold_fit import ThresholdFit, fit_for_evaluation

Config = TypeVar("Config")
PlanT = TypeVar("PlanT", bound="Plan")


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What a run needs before any work: the ``samples`` whose prompts (plus ``max_new_tokens``) must fit the model,
    the head sources it ``needs`` (``resources``: ``STATIC_HEADS``, ``HEAD_PREDICTOR``) from the config's
    ``static`` / ``predictor`` paths, checked against what it ``evaluated``, and what a needed source not given
    does: ``refuse`` the run, or ``skip`` (the experiment drops what reads it). Experiments extend it with what
    their work reuses (the task, its grid)."""

    samples: Sequence[Any] = ()
    max_new_tokens: int = 0
    needs: frozenset[str] = frozenset()
    evaluated: Evaluated | None = None
    static: str | None = None
    predictor: str | None = None
    missing: Literal["refuse", "skip"] = "skip"


@dataclass(frozen=True, kw_only=True)
class GridPlan(Plan):
    """The plan of a run over a registered task's grid (``config.task_entry()``, ``config.task_config()``)."""

    evaluated: Evaluated
    task: Task
    task_config: Any
    grid: TaskGrid
    threshold_fit: ThresholdFit | None = None  # a fitted --threshold (--fit-run), checked against ``evaluated``

    def threshold(self, given: str) -> str:
        """The threshold D_t is decided with: the fitted one, else the config's ``given``."""
        return self.threshold_fit.applied if self.threshold_fit else given


def grid_plan(
    config: Any,
    lm: LoadedModel,
    needs: set[str],
    run: str,
    *,
    predictor: str | None = None,
    evaluated: Callable[[Task, Any, Sequence[Any]], Evaluated] | None = None,
    missing: Literal["refuse", "skip"] = "skip",
    fits_threshold: bool = False,
) -> GridPlan:
    """The plan of a grid run (``run`` names it in refusals: "this ablation run"): the task's grid for the model's
    tokenizer, every sample checked to fit with the config's ``max_new_tokens``, the config's static list (and
    ``predictor``) read when ``needs`` asks for them, checked against ``evaluated(task, task_config, samples)``
    (default: ``grid_evaluated`` with the task config's stream); where ``fits_threshold``, the config's fitted
    ``threshold`` on its ``fit_run`` (``views.threshold_fit.fit_for_evaluation``), refused where that run shares
    samples with the grid."""
    task, task_config = config.task_entry(), config.task_config()
    grid = task.grid(task_config, lm.tokenizer)
    if evaluated is None:
        checked = grid_evaluated(task, getattr(task_config, "split", None), grid.samples, run)
    else:
        checked = evaluated(task, task_config, grid.samples)
    fit = None
    if fits_threshold and config.fit_run is not None:
        fit = fit_for_evaluation(config.threshold, config.score_kind(), config.fit_run, checked)
    return GridPlan(
        samples=grid.samples,
        max_new_tokens=config.max_new_tokens,
        needs=frozenset(needs),
        evaluated=checked,
        static=config.static,
        predictor=predictor,
        missing=missing,
        task=task,
        task_config=task_config,
        grid=grid,
        threshold_fit=fit,
    )


def grid_evaluated(task: Task, split: str | None, samples: Sequence[Any], run: str) -> Evaluated:
    """What a grid evaluates: its question ids (a question task), its samples' seeds and needle values (a seeded
    task such as NIAH), and its stream."""
    if task.questions:
        return Evaluated(run, questions=tuple(sorted({s.record_id for s in samples})), split=split)
    seeded = all(s.seed is not None for s in samples)
    identities = tuple(sample_identity(s.sample_id, s.seed, s.answer) for s in samples) if seeded else ()
    return Evaluated(run, samples=identities, split=split)


def grid_manifest(context: Context[Any, GridPlan], extra: dict, top: int = 20) -> dict:
    """What a grid run's manifest records: the prompt, ``extra``, the grid, the static list's ``top`` heads and what
    fitted it."""
    plan, samples = context.plan, context.plan.samples
    return {
        "prompt": plan.task.prompt(plan.task_config),
        "prompt_template": samples[0].prompt_template,
        "chat_template_kwargs": samples[0].chat_template_kwargs,
        **extra,
        **plan.grid.manifest(),
        "static_top": [head_key(h) for h in context.sources.static_ranking[:top]],
        "static_source": context.sources.manifest()[STATIC_HEADS],  # the list, and what fitted it
        **({"threshold_fit": plan.threshold_fit.to_dict()} if plan.threshold_fit else {}),
    }


@dataclass(frozen=True)
class Phase:
    """Jobs decoded in one pass of ``runs.run_jobs``: the jobs of one group (a sample's arms, sharing its prefill)
    go to ``work`` in one call, ``batch_size`` groups per call; ``then`` reads this process's records of the phase
    before the next phase starts."""

    jobs: Sequence[Job]
    work: Callable[[list], list[Finished]]
    desc: str
    then: Callable[[list[dict]], object] | None = None


@dataclass(frozen=True)
class Work:
    """What a run records in its manifest (beside its config, model and versions) and the phases it decodes."""

    manifest: dict[str, Any]
    phases: Sequence[Phase] = ()


@dataclass(frozen=True)
class Context(Generic[Config, PlanT]):
    """What an experiment's ``work`` and ``tables`` read: the config, the model, the plan, the loaded sources,
    the run directory and the records decoded together."""

    config: Config
    lm: LoadedModel
    plan: PlanT
    sources: Resources
    run: RunDir
    batch_size: int


def _check_config(config: Any) -> None:
    config.check()


def _config_itself(config: Any) -> Any:
    return config


@dataclass(frozen=True)
class Experiment(Generic[Config, PlanT]):
    """A kind of run, declared: its ``kind`` (the manifest's), its ``plan`` and ``work``, the ``tables`` (pure: the
    files they return, ``outputs.Outputs``) that rank 0 writes once every process has finished (none: the records
    are the result), what is refused before the model
    loads (``check``: the config's own ``check``), the config its manifest ``records`` (a resumed run must match
    it) and what is checked once the run has started (``on_start``, with the manifest)."""

    kind: str
    plan: Callable[[Config, LoadedModel], PlanT]
    work: Callable[[Context[Config, PlanT]], Work]
    tables: Callable[[Context[Config, PlanT]], Outputs] | None = None
    check: Callable[[Config], object] = _check_config
    records: Callable[[Config], Any] = _config_itself
    on_start: Callable[[dict, RunDir], object] | None = field(default=None)


def run_experiment(
    experiment: Experiment[Config, PlanT],
    config: Config,
    out: str | Path,
    *,
    device_map: str | None = None,
    **options: Unpack[RunOptions],
) -> RunDir:
    """Run ``experiment`` on ``config`` into ``out`` (resumable: finished records are kept), every process its
    share of each phase's jobs; rank 0 writes the tables. Everything that can be refused is refused before the
    run directory is written: the config, samples longer than the model's window, sources fitted on what the run
    evaluates, and (``Plan.missing == "refuse"``) sources the run needs but was not given."""
    experiment.check(config)
    lm = run_model(config, options, device_map)
    plan = experiment.plan(config, lm)
    for sample in plan.samples:  # fail before any work, not halfway through the grid
        check_fits(lm, len(sample.input_ids), plan.max_new_tokens)
    sources = plan_sources(plan, lm.describe())
    run, batch_size = RunDir(out), batch_size_of(options)
    context = Context(config, lm, plan, sources, run, batch_size)
    work = experiment.work(context)
    manifest = start_run(run, experiment.kind, experiment.records(config), lm, work.manifest, batch_size=batch_size)
    if experiment.on_start is not None:
        experiment.on_start(manifest, run)
    for phase in work.phases:
        groups = Counter(job.record_id if job.group is None else job.group for job in phase.jobs)
        together: RunOptions = {**options, "batch_size": batch_size * max(groups.values(), default=1)}
        records = run_jobs(run, phase.jobs, phase.work, desc=phase.desc, **together)
        if phase.then is not None:
            phase.then(records)
    if experiment.tables is not None and distributed.is_main():  # every process's records are on disk
        write_outputs(run.path, experiment.tables(context))
    return run


def plan_sources(plan: Plan, model: dict[str, Any]) -> Resources:
    """The plan's sources loaded and checked for ``model`` (a run manifest's ``model``: its shape, and that a
    source's run was of the same model; ``resources.resolve``); a missing one refused where the plan says."""
    if not plan.needs:
        return Resources()
    if plan.evaluated is None:
        raise DynheadsError("an experiment that reads head sources must say what it evaluates (Plan.evaluated)")
    sources = resolve(
        plan.needs,
        static=plan.static,
        predictor=plan.predictor,
        shape=(model["num_layers"], model["num_heads"]),
        evaluated=plan.evaluated,
        model=model,
    )
    if plan.missing == "refuse" and sources.missing:  # a variant that reads a source never runs without it
        raise DynheadsError(
            f"this run needs a {' and a '.join(sources.missing)}: " + "; ".join(sources.missing.values())
        )
    return sources


# ---- the tracing experiment: any registered task's grid, traced -----------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class TracedPlan(Plan):
    manifest: dict


def run_traced(
    kind: str,
    config,
    out: str | Path,
    prepare: Callable[[Any], tuple[Sequence, dict]],
    score: Callable[[Any, str], dict],  # (one of prepare's samples, its answer) -> metrics
    *,
    device_map: str | None,
    more_tables: Callable[[RunView], Outputs] = lambda view: Outputs(),
    **options: Unpack[RunOptions],
) -> RunDir:
    """What every tracing runner does: load ``config``'s model (unless ``options`` give ``lm``),
    ``prepare(tokenizer)`` the samples and the manifest's extra keys, start (or resume) the run in ``out``, trace
    it (the scores' settings come from ``config``: sink, local window, and ``write_score`` where it has one) and
    write results.csv and ``more_tables`` of the finished run.
    Results do not depend on ``batch_size`` beyond fp32 rounding of the scores (tests/test_batching.py)."""

    def plan(config, lm: LoadedModel) -> TracedPlan:
        samples, extra = prepare(lm.tokenizer)
        return TracedPlan(samples=samples, max_new_tokens=config.max_new_tokens, manifest=extra)

    def work(context: Context) -> Work:
        config, lm, samples = context.config, context.lm, context.plan.samples

        def traced(batch: list) -> list[Finished]:
            traces = trace_batch(
                lm,
                batch,
                config.max_new_tokens,
                sink_size=config.sink_size,
                local_window=config.local_window,
                head_outputs=getattr(config, "write_score", False),  # a task's own config may not have it
            )
            return [
                Finished(
                    {
                        **sample.describe(),
                        "generated": result.text,
                        "stop_reason": result.stop_reason,
                        "steps": result.num_steps,
                        "metrics": score(sample, result.text),
                    },
                    result,
                )
                for sample, result in zip(batch, traces, strict=True)
            ]

        jobs = [Job(sample.sample_id, sample) for sample in samples]
        return Work(context.plan.manifest, [Phase(jobs, traced, kind)])

    def tables(context: Context) -> Outputs:  # every process's samples are on disk: the table is written once
        view = RunView.of(context.run)
        return Outputs().add(RESULTS_FILE, view.results()).extend(more_tables(view))

    experiment = Experiment(kind, plan, work, tables, check=_no_check)
    return run_experiment(experiment, config, out, device_map=device_map, **options)


def _no_check(config) -> None:
    """Tracing configs are checked where their samples are made."""


def run_task(
    task: Task | str,
    config,
    out: str | Path,
    *,
    device_map: str | None = None,
    more_tables: Callable[[RunView], Outputs] = lambda view: Outputs(),
    **options: Unpack[RunOptions],
) -> RunDir:
    """Trace the grid of a registered task into ``out`` (resumable): ``task.grid(config, tokenizer)`` makes the
    samples, ``task.score`` scores each answer, the manifest records ``task.prompt(config)`` and the run's
    ``kind`` is the task's name; results.csv and ``more_tables`` are written once it has finished."""
    task = get_task(task) if isinstance(task, str) else task

    def prepare(tokenizer) -> tuple[list, dict]:
        grid = task.grid(config, tokenizer)
        samples = grid.samples
        return samples, {
            "prompt": task.prompt(config),
            "prompt_template": samples[0].prompt_template,
            **grid.manifest(),
            "chat_template_kwargs": samples[0].chat_template_kwargs,
        }

    return run_traced(
        task.name, config, out, prepare, task.score, device_map=device_map, more_tables=more_tables, **options
    )
