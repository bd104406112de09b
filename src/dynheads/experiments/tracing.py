"""The loop every tracing run shares: check the samples fit, trace the unfinished ones, save, summarise.

Samples are traced ``batch_size`` at a time (``dynheads.engine.batching``; 1 = the reference path) by the shared job
loop (``dynheads.runs.run_jobs``): under ``torchrun`` / ``accelerate launch`` each rank traces its own share.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Unpack

from dynheads.engine.tracing import trace_batch
from dynheads.experiments.experiment import Context, Experiment, Phase, Plan, Work, run_experiment
from dynheads.models import LoadedModel
from dynheads.outputs import Outputs
from dynheads.runs import RESULTS_FILE, Finished, Job, RunDir, RunOptions, RunView
from dynheads.tasks.registry import Task, get_task


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
    it (the scores' settings come from ``config``) and write results.csv and ``more_tables`` of the finished run.
    Results do not depend on ``batch_size`` beyond fp32 rounding of the scores (tests/test_batching.py)."""

    def plan(config, lm: LoadedModel) -> TracedPlan:
        samples, extra = prepare(lm.tokenizer)
        return TracedPlan(samples=samples, max_new_tokens=config.max_new_tokens, manifest=extra)

    def work(context: Context) -> Work:
        config, lm, samples = context.config, context.lm, context.plan.samples

        def traced(batch: list) -> list[Finished]:
            traces = trace_batch(
                lm, batch, config.max_new_tokens, sink_size=config.sink_size, local_window=config.local_window
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
