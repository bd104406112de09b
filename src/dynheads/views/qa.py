"""The answers table of a traced question run (HotpotQA, multi-hop, RULER's question tasks): metrics per context
length and, where the context holds same-form candidates, chance, the position heuristics and the failure modes."""

from __future__ import annotations

from collections.abc import Callable

from dynheads.analysis.evidence import EvidenceSettings, fraction_interval, mean_interval
from dynheads.outputs import Outputs
from dynheads.runs import RunView
from dynheads.tables import Cell, Summary, Table
from dynheads.tasks import candidates
from dynheads.tasks.registry import Task


def answer_tables(task: Task, seed: int) -> Callable[[RunView], Outputs]:
    """What a traced question run writes beside results.csv: ``summary.md``, the answers' table (``qa_summary``)."""

    def tables(view: RunView) -> Outputs:
        return Outputs().add("summary.md", qa_summary(view.records, task, seed))

    return tables


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
                missing="–",  # the model's own row: no difference to itself
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
