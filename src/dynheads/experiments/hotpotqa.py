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

from dynheads.analysis.evidence import EvidenceSettings, fraction_interval, mean_interval
from dynheads.experiments.settings import HotpotConfig
from dynheads.experiments.tracing import run_task
from dynheads.outputs import Outputs
from dynheads.runs import RunDir, RunOptions, RunView
from dynheads.tables import Cell, Summary, Table
from dynheads.tasks import candidates
from dynheads.tasks.grid import TaskGrid
from dynheads.tasks.hotpotqa import HOTPOTQA
from dynheads.tasks.registry import Task, task_of
from dynheads.tasks.sample import Sample


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

    def answers(view: RunView) -> Outputs:
        return Outputs().add("summary.md", qa_summary(view.records, task, config.seed))

    return run_task(task, config, out, device_map=device_map, more_tables=answers, **options)


def qa_summary(records: list[dict], task: Task, seed: int = 0) -> Summary:
    """The run's table: metrics per context length, and for tasks with same-form candidates in the context the
    chance level, the position heuristics, EM by fact order and by gold position (third of the context) and the
    wrong answers that are a distractor's value (``dynheads.tasks.candidates``), with 95 % bootstrap intervals
    over questions."""
    metrics = [m for m in task.metrics if all(m in r["metrics"] for r in records)]
    lengths = sorted({r["context_tokens"] for r in records})
    rows = [
        [length, len(group), *(sum(r["metrics"][m] for r in group) / len(group) for m in metrics)]
        for length in lengths
        for group in [[r for r in records if r["context_tokens"] == length]]
    ]
    blocks: list = [
        f"{len(records)} questions of {task.label}.",
        Table(["context tokens", "questions", *(task.metrics[m] for m in metrics)], rows),
    ]
    numbers: dict = {"n": len(records), **{m: sum(r["metrics"][m] for r in records) / len(records) for m in metrics}}
    summary = candidates.summarise(records)
    if summary["n"]:
        evidence = EvidenceSettings(seed=seed)  # the run's seed resamples the questions of every row
        model_em = fraction_interval(
            [r["metrics"]["em"] for r in records if r["meta"].get(candidates.CANDIDATES)], evidence
        )
        diffs = {
            name: mean_interval(values, evidence, bounds=(-1.0, 1.0))
            for name, values in candidates.gaps(records).items()
        }
        rates = candidates.heuristic_rates(records)
        heuristics: list[list[Cell]] = [
            [name, value, summary["model"] - value, f"[{diffs[name].low:.3f}, {diffs[name].high:.3f}]"]
            for name, value in rates.items()
        ]
        thirds = candidates.by_gold_third(records)
        blocks += [
            "Chance and failure modes (same-form candidates in the context; EM with its exact Clopper-Pearson 95 % "
            "interval; differences with 95 % bootstrap intervals over questions, seed recorded, exact when every "
            "question agrees): chance is an answer drawn at random from "
            "a question's candidates (mean of 1 / candidates); each position heuristic answers the candidate its "
            "rule picks from where the candidates sit in the context (dynheads.tasks.candidates); the model minus "
            "each is paired per question.",
            Table(
                ["answerer", "EM", "model - it", "95 % interval of the difference"],
                [
                    ["model", summary["model"], None, f"EM interval [{model_em.low:.3f}, {model_em.high:.3f}]"],
                    [
                        "random candidate (chance)",
                        summary["chance"],
                        summary["model"] - summary["chance"],
                        f"[{diffs['chance'].low:.3f}, {diffs['chance'].high:.3f}]",
                    ],
                    *heuristics,
                ],
                missing="nan",
            ),
            f"Wrong answers: {summary['wrong']}; share equal to a distractor's value: "
            f"{summary['distractor_share']:.3f}."
            if summary["wrong"]
            else "Wrong answers: 0.",
            Table(
                ["gold rank among candidates (fact order)", "questions", "EM"],
                [[rank, n, em] for rank, (n, em) in candidates.by_gold_rank(records).items()],
            ),
            Table(
                ["gold position (third of the context)", "questions", "EM"],
                [[third, n, em] for third, (n, em) in thirds.items()],
                missing="n/a",
            ),
        ]
        numbers["candidates"] = {
            **summary,
            "em_interval": [model_em.low, model_em.high],
            "seed": seed,
            "differences": {k: [v.low, v.high] for k, v in diffs.items()},
            "heuristics": rates,
            "by_gold_third": {third: {"n": n, "em": em} for third, (n, em) in thirds.items()},
        }
    return Summary(blocks, numbers, f"{task.label}: answers")
