"""The loop every tracing run shares: check the samples fit, trace the unfinished ones, save, summarise.

Samples are traced ``batch_size`` at a time (``dynheads.batching``; 1 = the reference path). Under
``torchrun`` / ``accelerate launch`` each rank traces its own share (``dynheads.distributed``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from dynheads import distributed
from dynheads.decoding import check_fits, trace_batch
from dynheads.errors import DynheadsError
from dynheads.models import LoadedModel, load_model
from dynheads.runs import RunDir
from dynheads.tasks.registry import Task, get_task


def start_run(run: RunDir, kind: str, config, lm: LoadedModel, extra: dict | None = None) -> dict:
    """``run.start`` once: rank 0 writes (or checks) the manifest, then the other ranks check it."""
    _, world = distributed.rank_and_world()
    extra = {**(extra or {}), "processes": world}
    manifest = run.start(kind, config, lm, extra) if distributed.is_main() else None
    distributed.barrier()
    return manifest if manifest is not None else run.start(kind, config, lm, extra)


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
    return trace_samples(run, lm, samples, score, max_new_tokens=config.max_new_tokens, sink_size=config.sink_size,
                         local_window=config.local_window, desc=kind, **tracing)


def run_task(task: Task | str, config, out: str | Path, *, lm: LoadedModel | None = None,
             device_map: str | None = None, **tracing) -> RunDir:
    """Trace the grid of a registered task into ``out`` (resumable): ``task.grid(config, tokenizer)`` makes the
    samples, ``task.score`` scores each answer, the manifest records ``task.prompt(config)`` and the run's
    ``kind`` is the task's name. ``tracing``: ``trace_samples`` keyword arguments (progress, batch_size, ...)."""
    task = get_task(task) if isinstance(task, str) else task

    def prepare(tokenizer) -> tuple[list, dict]:
        grid = task.grid(config, tokenizer)
        samples = grid.samples
        return samples, {"prompt": task.prompt(config), "prompt_template": samples[0].prompt_template,
                         **grid.manifest(), "chat_template_kwargs": samples[0].chat_template_kwargs}

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
    if batch_size < 1:
        raise DynheadsError("batch size must be at least 1")
    for sample in samples:  # fail before any work, not halfway through the grid
        check_fits(lm, len(sample.input_ids), max_new_tokens)
    mine = distributed.shard(samples)
    todo = [s for s in mine if not run.is_done(s.sample_id)]
    bar = tqdm(total=len(mine), initial=len(mine) - len(todo), desc=desc, unit="sample", disable=not progress)
    for start in range(0, len(todo), batch_size):
        batch = todo[start : start + batch_size]
        traces = trace_batch(lm, batch, max_new_tokens, sink_size=sink_size, local_window=local_window)
        for sample, result in zip(batch, traces, strict=True):
            record = {**sample.describe(), "generated": result.text, "stop_reason": result.stop_reason,
                      "steps": result.num_steps, "metrics": score(sample, result.text)}
            run.save_sample(record, result)
            if on_sample:
                on_sample(record)
            bar.update()
    bar.close()
    distributed.barrier()  # every rank's samples are on disk before the table is written, once
    if distributed.is_main():
        run.write_results()
    return run
