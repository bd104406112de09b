"""Find a model's static retrieval heads: trace a NIAH grid on the ``static`` split, score it as Wu et al. do.

The samples come from the ``static`` seed stream, so they are disjoint from the ``analysis`` samples that
``dynheads niah`` traces and ``dynheads dynamism`` measures. ``samples`` is spread evenly over the
lengths x depths grid and rounded up to whole passes of it: runs per cell = ceil(samples / cells), so every
cell gets the same number of tests (20 samples on a 3 x 5 grid trace 30).

Files written into the run directory besides the traces (see ``write_static``):

- ``static_heads.json``: per-head scores of every counted test, Wu et al.'s published format,
- ``static_ranking.csv``: rank, head, layer, head index and mean score of all L*H heads, best first,
- ``static_summary.json``: settings, pass rate, counts, the top-20 heads and the disjointness note.

With ``score`` other than ``copy`` (``write``: LOCOS's pooled write heads) the same traces rank heads by that score's
mean over steps, then over the counted tests (the same ROUGE-1 filter), into ``static_heads-<score>.json``,
``static_ranking-<score>.csv`` and ``static_summary-<score>.json``: one static run gives both lists.

``run_static_qrhead`` ranks heads of the same static stream as QRHead does (Zhang et al. 2025): per head, the
attention mass that the prompt's question rows put on the needle, minus the same under a content-free query
(ICR's calibration, ``dynheads.rag.rerank``), averaged over the tests; two prefill passes per test, no
generation, all tests counted. Into its own run folder: ``static_heads-qrhead.json``, ``static_ranking-qrhead.csv``,
``static_summary-qrhead.json``, per test the ``[L, H]`` scores in ``scores/``.

``run_static_reasoning`` does the same for HotpotQA: static *reasoning* heads, the mean Eq. 2 score per head
over the questions of the ``static`` question stream (disjoint from the questions ablation and RAG evaluate),
written in the same three files.
"""

from __future__ import annotations

from dataclasses import asdict
from functools import partial
from pathlib import Path
from typing import Unpack

import numpy as np
import pandas as pd

from dynheads.analysis.headlists import save_head_scores
from dynheads.analysis.static import (
    NiahTest,
    ReasoningTest,
    StaticHeads,
    static_heads,
    static_reasoning_heads,
    unfiltered_static_heads,
)
from dynheads.errors import DynheadsError
from dynheads.experiments.experiment import Context, Experiment, Phase, Plan, Work, run_experiment, run_task
from dynheads.heads import head_label
from dynheads.models import LoadedModel
from dynheads.outputs import Outputs, Written, write_outputs
from dynheads.rag.rerank import QUERY_ROWS, needle_prompt, span_scores
from dynheads.runs import Finished, Job, RunDir, RunOptions, RunView
from dynheads.settings import STATIC_SPLIT, StaticConfig, StaticReasoningConfig
from dynheads.tasks.hotpotqa import HOTPOTQA
from dynheads.tasks.registry import task_of
from dynheads.views.qa import answer_tables

SPLIT = STATIC_SPLIT
DISJOINT_NOTE = (
    "static heads are scored on the 'static' seed stream, disjoint from the 'analysis' samples that "
    "'dynheads niah' traces and 'dynheads dynamism' measures"
)
REASONING_NOTE = (
    "static reasoning heads are scored on their own HotpotQA question stream (recorded with its ids in "
    "manifest.json); 'dynheads ablation --task hotpotqa' and 'dynheads rag' refuse a list whose "
    "questions overlap theirs"
)


def run_static(config: StaticConfig, out: str | Path, **options: Unpack[RunOptions]) -> StaticHeads:
    """Trace the static grid of ``config.task`` (NIAH by default) into ``out`` (resumable), then score and write
    the static heads."""
    task = task_of(config.task)
    if task.questions:
        raise DynheadsError(f"static heads of {task.name!r} (a question task): use dynheads static-reasoning")
    run = run_task(task, config.niah_config(), out, **options)
    return write_static(run, config)


def write_static(run: RunDir, config: StaticConfig) -> StaticHeads:
    """Score the traced tests of ``run`` and write the three files of the module docstring."""
    if config.score != "copy":
        return _write_pooled_static(run, config)
    tests = [
        NiahTest(trace, record["answer"], record["answer_token_count"], record.get("generated"))
        for record, trace in run.iter_traces()
    ]
    if not tests:
        raise DynheadsError(f"{run.path} has no traced samples: nothing to score")
    heads = static_heads(tests, success_threshold=config.success_threshold)
    outputs = _head_files(heads).add(
        "static_summary.json",
        {
            "config": asdict(config),
            "split": SPLIT,
            "note": DISJOINT_NOTE,
            "num_tests": heads.num_tests,
            "num_counted": heads.num_counted,
            "pass_rate": heads.pass_rate,
            "top20": [head_label(head) for head in heads.scored_top(20)],
            "heads_scoring_above_0.1": int((heads.mean_scores > 0.1).sum()),
        },
    )
    write_outputs(run.path, outputs)
    return heads


def _write_pooled_static(run: RunDir, config: StaticConfig) -> StaticHeads:
    """Heads ranked by ``config.score``'s mean over steps, then over the tests Wu's ROUGE-1 filter counts."""
    first = next(iter(task_of(config.task).metrics))
    tests = [ReasoningTest(trace, _recall(record["metrics"], first)) for record, trace in run.iter_traces()]
    if not tests:
        raise DynheadsError(f"{run.path} has no traced samples: nothing to score")
    heads, empty = static_reasoning_heads(tests, success_threshold=config.success_threshold, score=config.score)
    suffix = f"-{config.score}"
    outputs = _head_files(heads, suffix).add(
        f"static_summary{suffix}.json",
        {
            "config": asdict(config),
            "score": f"{config.score} (mean over steps, then over counted tests)",
            "split": SPLIT,
            "note": DISJOINT_NOTE,
            "num_tests": heads.num_tests,
            "num_counted": heads.num_counted,
            "empty_traces_skipped": empty,
            "top20": [head_label(head) for head in heads.scored_top(20)],
        },
    )
    write_outputs(run.path, outputs)
    return heads


def _recall(metrics: dict, first: str) -> float:
    """What Wu's success filter reads: the answer's ROUGE-1 recall, or the task's first metric without one."""
    return float(metrics["rouge1_recall"] if "rouge1_recall" in metrics else metrics[first])


def _head_files(heads: StaticHeads, suffix: str = "") -> Outputs:
    """static_heads.json (Wu et al.'s format) and static_ranking.csv (rank, head, mean score), names + ``suffix``."""
    return (
        Outputs()
        .add(f"static_heads{suffix}.json", Written(partial(save_head_scores, test_scores=heads.per_head())))
        .add(f"static_ranking{suffix}.csv", _ranking(heads))
    )


def _ranking(heads: StaticHeads) -> pd.DataFrame:
    means = heads.mean_scores
    frame = pd.DataFrame(
        [
            {
                "rank": rank,
                "head": head_label(head),
                "layer": head[0],
                "head_index": head[1],
                "mean_score": float(means[head]),
            }
            for rank, head in enumerate(heads.ranking, start=1)
        ]
    )
    return frame


# ---- QRHead's heads on the static needle stream ----------------------------------------------------------------------
QRHEAD = "qrhead"


def _check_qrhead(config: StaticConfig) -> None:
    """A needle task and a grid with samples, refused before the model loads."""
    task = task_of(config.task)
    if task.questions:
        raise DynheadsError(f"QRHead's needle heads of {task.name!r} (a question task): use dynheads rerank")
    config.niah_config()


def _qrhead_plan(config: StaticConfig, lm: LoadedModel) -> Plan:
    return Plan(samples=task_of(config.task).grid(config.niah_config(), lm.tokenizer).samples)


def _qrhead_work(context: Context[StaticConfig, Plan]) -> Work:
    lm, niah = context.lm, context.config.niah_config()
    question = task_of(context.config.task).prompt(niah)["question"]  # the needle form's question

    def scored(batch: list) -> list[Finished]:
        finished = []
        for sample in batch:
            scores = span_scores(lm, needle_prompt(lm.tokenizer, sample, question))
            arrays = {QRHEAD: scores.calibrated[:, :, 0].astype(np.float32)}
            finished.append(Finished(sample.describe(), arrays=arrays))
        return finished

    jobs = [Job(sample.sample_id, sample) for sample in context.plan.samples]
    manifest = {"prompt": task_of(context.config.task).prompt(niah), "query_rows": QUERY_ROWS, "split": SPLIT}
    return Work(manifest, [Phase(jobs, scored, "qrhead")])


def _qrhead_tables(context: Context[StaticConfig, Plan]) -> Outputs:
    view, config = RunView.of(context.run), context.config
    per_test = [np.load(context.run.arrays_path(r["sample_id"]))[QRHEAD] for r in view.records]
    heads = unfiltered_static_heads(per_test)
    suffix = f"-{QRHEAD}"
    return _head_files(heads, suffix).add(
        f"static_summary{suffix}.json",
        {
            "config": asdict(config),
            "score": "QRHead: the question rows' attention mass on the needle minus under a content-free query, "
            "mean over tests",
            "split": SPLIT,
            "note": DISJOINT_NOTE,
            "num_tests": heads.num_tests,
            "num_counted": heads.num_counted,
            "top20": [head_label(head) for head in heads.scored_top(20)],
        },
    )


STATIC_QRHEAD = Experiment("static-qrhead", _qrhead_plan, _qrhead_work, _qrhead_tables, check=_check_qrhead)


def run_static_qrhead(config: StaticConfig, out: str | Path, **options: Unpack[RunOptions]) -> RunDir:
    """QRHead's head ranking on ``config``'s static needle stream into ``out`` (resumable; module docstring)."""
    return run_experiment(STATIC_QRHEAD, config, out, **options)


# ---- static reasoning heads (HotpotQA, Eq. 2) ----------------------------------------------------------------------
def run_static_reasoning(config: StaticReasoningConfig, out: str | Path, **options: Unpack[RunOptions]) -> StaticHeads:
    """Trace the static HotpotQA stream into ``out`` (resumable), then write the static reasoning heads there."""
    hotpot = config.hotpot_config()
    task = task_of(HOTPOTQA.name, hotpot.data)  # HotpotQA, or the multi-hop task its data selects
    run = run_task(task, hotpot, out, more_tables=answer_tables(task, hotpot.seed), **options)
    return write_static_reasoning(run, config)


def write_static_reasoning(run: RunDir, config: StaticReasoningConfig) -> StaticHeads:
    """static_heads.json (Wu et al.'s format: per head, its mean Eq. 2 score of every counted question),
    static_ranking.csv and static_summary.json, as ``write_static`` writes them for copy heads."""
    tests = [ReasoningTest(trace, record["metrics"]["f1"]) for record, trace in run.iter_traces()]
    if not tests:
        raise DynheadsError(f"{run.path} has no traced questions: nothing to score")
    heads, empty = static_reasoning_heads(tests, success_threshold=config.success_f1)
    manifest = run.manifest()
    outputs = _head_files(heads).add(
        "static_summary.json",
        {
            "config": asdict(config),
            "score": "reasoning (Eq. 2, mean over steps, then over questions)",
            "split": SPLIT,
            "note": REASONING_NOTE,
            "questions": manifest.get("questions"),
            "skipped": {key: value for key, value in manifest.get("skipped", {}).items() if key != "pairs"},
            "num_tests": heads.num_tests,
            "num_counted": heads.num_counted,
            "empty_traces_skipped": empty,
            "top20": [head_label(head) for head in heads.scored_top(20)],
            "heads_with_nonzero_score": int((heads.mean_scores > 0).sum()),
        },
    )
    write_outputs(run.path, outputs)
    return heads
