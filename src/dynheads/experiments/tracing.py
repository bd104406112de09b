"""The loop every tracing run shares: check the samples fit, trace the unfinished ones, save, summarise.

Samples are traced ``batch_size`` at a time (``dynheads.batching``; 1 = the reference path) by the shared job
loop (``dynheads.runs.run_jobs``): under ``torchrun`` / ``accelerate launch`` each rank traces its own share.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from dynheads import distributed
from dynheads.decoding import check_fits, trace_batch
from dynheads.models import LoadedModel, load_model
from dynheads.runs import Finished, Job, RunDir, run_jobs, start_run
from dynheads.tasks.registry import Task, get_task


def run_traced(
    kind: str,
    config,
    out: str | Path,
    prepare: Callable[[Any], tuple[Sequence, dict]],
    score: Callable[[Any, str], dict],  # (one of prepare's samples, its answer) -> metrics
    *,
    lm: LoadedModel | None,
    device_map: str | None,
    **tracing,
) -> RunDir:
    """What every tracing runner does: load ``config``'s model (unless ``lm`` is given), ``prepare(tokenizer)`` the
    samples and the manifest's extra keys, start (or resume) the run in ``out`` and trace it (``trace_samples``
    keyword arguments in ``tracing``; the scores' settings come from ``config``)."""
    lm = lm or load_model(config.model, dtype=config.dtype, device=config.device, device_map=device_map)
    samples, extra = prepare(lm.tokenizer)
    run = RunDir(out)
    start_run(run, kind, config, lm, extra)
    return trace_samples(
        run,
        lm,
        samples,
        score,
        max_new_tokens=config.max_new_tokens,
        sink_size=config.sink_size,
        local_window=config.local_window,
        desc=kind,
        **tracing,
    )


def run_task(
    task: Task | str,
    config,
    out: str | Path,
    *,
    lm: LoadedModel | None = None,
    device_map: str | None = None,
    **tracing,
) -> RunDir:
    """Trace the grid of a registered task into ``out`` (resumable): ``task.grid(config, tokenizer)`` makes the
    samples, ``task.score`` scores each answer, the manifest records ``task.prompt(config)`` and the run's
    ``kind`` is the task's name. ``tracing``: ``trace_samples`` keyword arguments (progress, batch_size, ...)."""
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

    return run_traced(task.name, config, out, prepare, task.score, lm=lm, device_map=device_map, **tracing)


def trace_samples(
    run: RunDir,
    lm: LoadedModel,
    samples: Sequence,
    score: Callable[[object, str], dict],
    *,
    max_new_tokens: int,
    sink_size: int,
    local_window: int,
    desc: str,
    progress: bool = True,
    on_sample: Callable[[dict], None] | None = None,
    batch_size: int = 1,
) -> RunDir:
    """Trace every sample of this rank not yet finished in ``run``; ``score(sample, generated)`` gives its metrics.

    Results do not depend on ``batch_size`` beyond fp32 rounding of the scores (tests/test_batching.py).
    """
    for sample in samples:  # fail before any work, not halfway through the grid
        check_fits(lm, len(sample.input_ids), max_new_tokens)

    def work(batch: list) -> list[Finished]:
        traces = trace_batch(lm, batch, max_new_tokens, sink_size=sink_size, local_window=local_window)
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
        batch_size=batch_size,
        desc=desc,
        progress=progress,
        on_record=on_sample,
    )
    if distributed.is_main():  # every process's samples are on disk: the table is written once
        run.write_results()
    return run
