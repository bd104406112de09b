"""The cascade's jobs for the shared job loop (``runs.run_jobs``): a sample's arms decoded in one call, one record
each; the records every arm of the matched grid, the progressive ablation and the dose-response's cascade share."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from dynheads.ablation.cascade import AblationResult, AblationSettings, ablated_generate_batch
from dynheads.models import LoadedModel
from dynheads.runs import Finished, Job
from dynheads.tasks.registry import Task

ToRecord = Callable[[Any, AblationSettings, AblationResult, Task], dict]


def cascade_jobs(jobs: Sequence[tuple[str, Any, Callable[[], AblationSettings]]]) -> list[Job]:
    """One ``Job`` per (record id, sample, its settings when it is decoded); a sample's jobs are one group, so they
    go to one process and one call, which prefills the sample's prompt once."""
    return [Job(record_id, (sample, settings_of), group=sample.sample_id) for record_id, sample, settings_of in jobs]


def cascade_work(
    lm: LoadedModel, task: Task, max_new_tokens: int, rows: int, to_record: ToRecord
) -> Callable[[list[tuple[Any, Callable[[], AblationSettings]]]], list[Finished]]:
    """The work of ``cascade_jobs``: a batch of (sample, settings) decoded by ``ablated_generate_batch``, ``rows``
    rows together (1: each row alone, records identical to running each arm by itself), each result saved as
    ``to_record(sample, settings, result, task)``."""

    def work(batch: list[tuple[Any, Callable[[], AblationSettings]]]) -> list[Finished]:
        settings = [settings_of() for _, settings_of in batch]
        samples = [sample for sample, _ in batch]
        results = ablated_generate_batch(lm, samples, settings, max_new_tokens, rows_together=rows)
        return [
            Finished(to_record(sample, these, result, task))
            for (sample, _), these, result in zip(batch, settings, results, strict=True)
        ]

    return work


def result_record(sample, result: AblationResult, task: Task) -> dict:
    """What every record holds: the sample's settings, the generation, its metrics and the per-step counts; its
    ``grid_sample_id`` names the sample."""
    masked = [len(heads) for heads in result.masked]
    metrics = task.score(sample, result.text)
    return {
        **sample.describe(),
        "grid_sample_id": sample.sample_id,
        "generated": result.text,
        "stop_reason": result.stop_reason,
        "steps": len(result.masked),
        "metrics": metrics,
        "dynamic_counts": result.dynamic_counts,
        "mean_dynamic": result.mean_dynamic,
        "masked_counts": masked,
        "mean_masked": float(np.mean(masked)) if masked else 0.0,
    }
