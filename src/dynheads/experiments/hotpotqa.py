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

from collections.abc import Callable
from pathlib import Path

from dynheads.experiments.settings import HotpotConfig
from dynheads.experiments.tracing import run_task
from dynheads.io import read_json
from dynheads.models import LoadedModel
from dynheads.runs import RunDir
from dynheads.tasks.grid import TaskGrid
from dynheads.tasks.questions import refuse_overlap
from dynheads.tasks.registry import HOTPOTQA, Task, task_of
from dynheads.tasks.sample import Sample


def qa_task(config: HotpotConfig) -> Task:
    """The registered task of the config's ``data``: HotpotQA (a file, or None = synthetic) or multi-hop."""
    return task_of(HOTPOTQA.name, config.data)


def hotpot_grid(config: HotpotConfig, tokenizer) -> TaskGrid:
    """Question i of the stream goes to grid cell i mod (lengths x depths), so every cell gets questions of every
    type. A question whose gold paragraphs exceed its cell's length is skipped and counted, never fatal."""
    return qa_task(config).grid(config, tokenizer)


def refuse_static_overlap(static: str | Path, evaluated: list[str], evaluator: str) -> None:
    """Refuse a static head list scored on a run (its folder's manifest records the questions) that shares
    questions with ``evaluated``; a list from elsewhere (a file with no run manifest beside it) passes."""
    manifest = Path(static).parent / "manifest.json"
    questions = read_json(manifest).get("questions") if manifest.is_file() else None
    if questions:
        refuse_overlap(questions["ids"], f"the static head list {static}", evaluated, evaluator)


def hotpot_samples(config: HotpotConfig, tokenizer) -> list[Sample]:
    """The samples of ``hotpot_grid`` (skipped pairs left out)."""
    return hotpot_grid(config, tokenizer).samples


def run_hotpotqa(config: HotpotConfig, out: str | Path, *, lm: LoadedModel | None = None, progress: bool = True,
                 on_sample: Callable[[dict], None] | None = None, batch_size: int = 1,
                 device_map: str | None = None) -> RunDir:
    """Trace every question into ``out`` (Eq. 2 scores per head and step); resumable. The run's ``kind`` is the
    task's name: ``hotpotqa``, or ``multihop`` for ``multihop[:options]`` data."""
    return run_task(qa_task(config), config, out, lm=lm, device_map=device_map, progress=progress,
                    on_sample=on_sample, batch_size=batch_size)
