"""The tables of a RAG run (``experiments.rag``), from its records: the results per (strategy, k), retrieval recall,
chance, and Dynamic's and Static's F1 per question (the paper's Table 4 pair), in ``rag.md``."""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from dynheads.analysis.evidence import EvidenceSettings, paired_difference
from dynheads.paper import PAPER_MODEL, PAPER_TABLE4
from dynheads.rag.results import rag_table
from dynheads.runs import RunView
from dynheads.seeding import derive_seed
from dynheads.settings import RagFields
from dynheads.tables import Summary, Table
from dynheads.tasks import candidates


def rag_summary(view: RunView, config: RagFields, skip_note: str, ranking: list | None) -> Summary:
    """``rag.md``: the results table, retrieval recall, chance and the notes on skipped questions and short lists;
    Dynamic's and Static's F1 per question beside it (``per_question_f1``)."""
    notes = [skip_note]
    if ranking is not None and max(config.ks) > len(ranking):
        notes.append(
            f"static: only {len(ranking)} heads of {config.static} have a non-zero score, so 'static' used "
            f"{len(ranking)} heads wherever k > {len(ranking)} (never zero-score filler)"
        )
    records = view.records
    return Summary(
        [
            rag_summary_table(rag_table(view.run)),
            *recall_blocks(records, config.seed, order=(config.strategies, config.ks)),
            *chance_blocks(records),
            *(f"{n}." for n in notes if n),
        ],
        {"f1_pairs": per_question_f1(records)},
    )


def per_question_f1(records: list[dict]) -> dict[str, dict[str, list[float]]]:
    """The RAG verdict's input: per k (as text), Dynamic's and Static's F1 per question over the questions both
    answered at that k, in one question order."""
    frame = pd.DataFrame(
        [
            {"question": r["question_id"], "strategy": r["strategy"], "k": r["k"], "f1": r["metrics"]["f1"]}
            for r in records
            if r["strategy"] in ("dynamic", "static")
        ]
    )
    pairs = {}
    for k, group in frame.groupby("k") if not frame.empty else ():
        table = group.pivot_table(index="question", columns="strategy", values="f1", aggfunc="mean").dropna()
        if {"dynamic", "static"} <= set(table.columns):
            pairs[str(int(k))] = {name: [float(value) for value in table[name]] for name in ("dynamic", "static")}
    return pairs


def recall_blocks(records: list[dict], seed: int = 0, order: tuple[Sequence[str], Sequence[int]] | None = None) -> list:
    """Which strategy's windows hold the gold facts more often: each (strategy, k) with a retrieval recall against
    the first one, paired by question (the questions both answered with a recall): the mean difference of retrieval
    recall with its bootstrap interval, and on how many questions each side showed more of the gold tokens.
    ``order`` (the run's strategies and ks) says which arm is first and the rows' order; without it, the records'."""
    kept = [r for r in records if r["retrieval_recall"] is not None]
    if order is not None:
        strategies, ks = list(order[0]), list(order[1])
        kept.sort(key=lambda r: (_position(strategies, r["strategy"]), _position(ks, r["k"])))  # stable
    frame = pd.DataFrame(
        [{"question": r["question_id"], "arm": _arm(r), "recall": r["retrieval_recall"]} for r in kept]
    )
    arms = list(dict.fromkeys(frame["arm"])) if not frame.empty else []
    if len(arms) < 2:
        return []
    table = frame.pivot_table(index="question", columns="arm", values="recall", aggfunc="mean")
    base, rows = arms[0], []
    for arm in arms[1:]:
        pair = table[[base, arm]].dropna()
        difference = (pair[arm] - pair[base]).to_numpy()
        settings = EvidenceSettings(seed=derive_seed(seed, base, arm))  # identical differences: the exact interval
        delta = paired_difference(pair[arm], pair[base], settings, bounds=(-1.0, 1.0)).text()
        rows.append(
            [arm, len(pair), float(pair[base].mean()), float(pair[arm].mean()), delta]
            + [int((difference > 0).sum()), int((difference < 0).sum())]
        )
    return [
        f"Retrieval recall paired by question against {base} (share of supporting-fact tokens the windows showed; "
        "95 % bootstrap interval of the mean difference):",
        Table(["strategy", "questions", f"recall {base}", "recall", f"Δ vs {base}", "more gold shown", "less"], rows),
    ]


def _position(values: list, value) -> int:
    """Where ``value`` is in ``values`` (past the end when it is not there: a record of a strategy not asked for)."""
    return values.index(value) if value in values else len(values)


def _arm(record: dict) -> str:
    return record["strategy"] + (f" k={record['k']}" if record["k"] is not None else "")


def chance_blocks(records: list[dict]) -> list:
    """For questions with same-form candidates in the context: the chance level and position heuristics (once,
    over the questions) and, per (strategy, k), the wrong answers and the share that are a distractor's value."""
    if not any((r.get("meta") or {}).get(candidates.CANDIDATES) for r in records):
        return []
    questions = list({r["question_id"]: r for r in records}.values())
    base = candidates.summarise([{**r, "metrics": {"em": 0.0}} for r in questions])
    rows = []
    for (strategy, k), group in pd.DataFrame(records).groupby(["strategy", "k"], sort=False, dropna=False):
        summary = candidates.summarise(group.to_dict("records"))
        rows.append(
            [
                strategy,
                "-" if pd.isna(k) else int(k),
                summary["n"],
                summary["model"],
                summary["wrong"],
                summary["distractor_share"],
            ]
        )
    rates = candidates.heuristic_rates(questions)
    return [
        f"Chance with the context visible over these {base['n']} questions: a random same-form candidate "
        f"{base['chance']:.3f} EM"
        + "".join(f"; {name} {value:.3f}" for name, value in rates.items())
        + " (dynheads.tasks.candidates).",
        Table(["strategy", "k", "questions", "EM", "wrong", "wrong = a distractor's value"], rows, missing="n/a"),
    ]


def rag_summary_table(table: pd.DataFrame) -> Table:
    """``rag_table``'s rows beside the paper's llama3.1-8b EM / F1 at k = 5; "n/a" where a mean is undefined."""
    rows = []
    for row in table.itertuples():
        paper = PAPER_TABLE4[PAPER_MODEL].get(row.strategy)
        paper_text = f"{paper[0]:.3f} / {paper[1]:.4f}" if paper and row.k in (5, "-") else ""
        rows.append(
            [
                row.strategy,
                row.k if isinstance(row.k, str) else int(row.k),
                int(row.questions),
                float(row.em),
                float(row.f1),
                _number(row.retrieval_recall),
                float(row.retrievals),
                _number(row.visible_tokens),
                float(row.context_tokens),
                paper_text,
            ]
        )
    return Table(
        [
            "strategy",
            "k",
            "questions",
            "EM",
            "F1",
            "retrieval recall",
            "retrievals / question",
            "visible tokens / retrieval",
            "context tokens",
            "paper llama3.1-8b EM / F1 (k=5)",
        ],
        rows,
        {"retrievals / question": ".2f", "visible tokens / retrieval": ".0f", "context tokens": ".0f"},
        missing="n/a",
    )


def _number(value: float | None) -> float | None:
    return None if value is None else float(value)
