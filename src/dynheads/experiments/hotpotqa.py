"""Trace HotpotQA questions (real data from a file, or the seeded synthetic set) over a length x depth grid.

The questions are one named stream of the source (``split``, ``first``, ``questions``; see
``dynheads.tasks.questions``): the manifest records the stream and its question ids, so runs that fit
something (static reasoning heads, probes) can be checked against runs that evaluate it. (question, cell)
pairs whose gold paragraphs exceed the cell's length are skipped and counted in the manifest.
``qa_task`` is the one place that turns a ``data`` value into a registered task: a HotpotQA file/folder or
None (synthetic HotpotQA) is ``hotpotqa``, ``multihop[:options]`` the synthetic multi-hop key-value task
(``dynheads.tasks.multihop``). Every HotpotQA-side runner (tracing, ablation, RAG) reads its questions here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Unpack

from dynheads.experiments.experiment import run_task
from dynheads.runs import RunDir, RunOptions
from dynheads.settings import HotpotConfig
from dynheads.tasks.grid import TaskGrid
from dynheads.tasks.hotpotqa import HOTPOTQA
from dynheads.tasks.registry import Task, task_of
from dynheads.tasks.sample import Sample
from dynheads.views.qa import answer_tables


def qa_task(config: HotpotConfig) -> Task:
    """The registered task of the config's ``data``: HotpotQA (a file, or None = synthetic) or multi-hop."""
    return task_of(HOTPOTQA.name, config.data)


def hotpot_grid(config: HotpotConfig, tokenizer) -> TaskGrid:
    """Question i of the stream goes to grid cell i mod (lengths x depths), so every cell gets questions of every
    type. A question whose gold paragraphs exceed its cell's length is skipped and counted, never fatal."""
    return qa_task(config).grid(config, tokenizer)


def hotpot_samples(config: HotpotConfig, tokenizer) -> list[Sample]:
    """The samples of ``hotpot_grid`` (skipped pairs left out)."""
    return hotpot_grid(config, tokenizer).samples


def run_hotpotqa(
    config: HotpotConfig, out: str | Path, *, device_map: str | None = None, **options: Unpack[RunOptions]
) -> RunDir:
    """Trace every question into ``out`` (Eq. 2 scores per head and step); resumable; ``summary.md`` holds the
    answers' table (``qa_summary``). The run's ``kind`` is the task's name: ``hotpotqa``; ``multihop`` or
    ``kv_lookup`` for ``multihop[:options]`` data; ``variable_tracking``, ``vt_lookup`` or ``multikey_niah``."""
    task = qa_task(config)
    return run_task(task, config, out, device_map=device_map, more_tables=answer_tables(task, config.seed), **options)
