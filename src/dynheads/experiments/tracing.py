"""The loop every tracing run shares: check the samples fit, trace the unfinished ones, save, summarise.

Samples are traced ``batch_size`` at a time (``dynheads.engine.batching``; 1 = the reference path) by the shared job
loop (``dynheads.runs.run_jobs``): under ``torchrun`` / ``accelerate launch`` each rank traces its own share.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Unpack

from dynheads import distributed
from dynheads.engine.decoding import check_fits
from dynheads.engine.tracing import trace_batch
from dynheads.runs import Finished, Job, RunDir, RunOptions, batch_size_of, run_jobs, run_model, start_run
from dynheads.tasks.registry import Task, get_task


def run_traced(
    kind: str,
    config,
    out: str | Path,
    prepare: Callable[[Any], tuple[Sequence, dict]],
    score: Callable[[Any, str], dict],  # (one of prepare's samples, its answer) -> metrics
    *,
    device_map: str | None,
    **options: Unpack[RunOptions],
) -> RunDir:
    """What every tracing runner does: load ``config``'s model (unless ``options`` give ``lm``),
    ``prepare(tokenizer)`` the samples and the manifest's extra keys, start (or resume) the run in ``out`` and
    trace it (the scores' settings come from ``config``). Results do not depend on ``batch_size`` beyond fp32
    rounding of the scores (tests/test_batching.py)."""
    lm = run_model(config, options, device_map)
    samples, extra = prepare(lm.tokenizer)
    for sample in samples:  # fail before any work (and before --out is written), not halfway through the grid
        check_fits(lm, len(sample.input_ids), config.max_new_tokens)
    run = RunDir(out)
    start_run(run, kind, config, lm, extra, batch_size=batch_size_of(options))

    def work(batch: list) -> list[Finished]:
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

    run_jobs(
        run,
        [Job(sample.sample_id, sample) for sample in samples],
        work,
        desc=kind,
        **options,
    )
    if distributed.is_main():  # every process's samples are on disk: the table is written once
        run.write_results()
    return run


def run_task(
    task: Task | str,
    config,
    out: str | Path,
    *,
    device_map: str | None = None,
    **options: Unpack[RunOptions],
) -> RunDir:
    """Trace the grid of a registered task into ``out`` (resumable): ``task.grid(config, tokenizer)`` makes the
    samples, ``task.score`` scores each answer, the manifest records ``task.prompt(config)`` and the run's
    ``kind`` is the task's name."""
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

    return run_traced(task.name, config, out, prepare, task.score, device_map=device_map, **options)
