"""The tables of a re-rank run (``experiments.rerank``), from its stored scores: QRHead's heads and the fusion
weights fitted on the fitting stream, every evaluation question ranked by every strategy (rankings.csv), and
rerank.md with the metrics, the paired differences (Holm-adjusted), the fusions and the gold positions."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

import numpy as np
import pandas as pd

from dynheads.analysis.evidence import (
    EvidenceSettings,
    HolmDecision,
    Interval,
    fraction_interval,
    holm_differences,
    mean_interval,
)
from dynheads.analysis.ranking import METRICS, qrhead_scores, ranking_metrics, top_heads
from dynheads.errors import DynheadsError
from dynheads.heads import Head, head_key
from dynheads.outputs import REMOVED, Outputs
from dynheads.rag import fusion, rerank
from dynheads.rag.rerank_strategies import RERANK_STRATEGIES, Candidates, base_strategies, calibrated, fused_parts
from dynheads.resources import Resources, needs_of
from dynheads.runs import RunDir, RunView
from dynheads.seeding import derive_seed
from dynheads.settings import RerankFields
from dynheads.tables import Items, Summary, Table

FIT = "fit"  # the stream QRHead and the fusion weights are fitted on


EVAL = "eval"  # the stream every strategy is measured on


# Settings that only change how the stored scores are ranked: a scored run may be summarised again with others.
RANKING_FIELDS = ("strategies", "k", "static", "probe", "bootstrap")


@dataclass(frozen=True)
class HeadSources:
    """What the head-subset strategies read: the static list, the predictor, QRHead's ranked heads (fitted when a
    run is summarised), and strategies left out (why)."""

    static: list[Head] | None
    predict_top: Callable[[np.ndarray, int], list[Head]] | None
    skipped: dict[str, str]
    qrhead: list[Head] | None = None  # every head, best first
    fit_questions: int = 0  # fitting questions QRHead's heads were chosen on
    weights: dict[str, float] = dataclasses.field(default_factory=dict)  # each mix:<strategy>'s fitted weight


def head_sources(config: RerankFields, sources: Resources) -> HeadSources:
    """The sources the chosen strategies read (``resources``); a strategy whose source was not given is skipped."""
    bases = base_strategies(config.strategies)
    reading = {name: needs_of([RERANK_STRATEGIES.get(name)]) for name in RERANK_STRATEGIES.names() if name in bases}
    missing = {
        name: [sources.missing[n] for n in sorted(needs) if n in sources.missing] for name, needs in reading.items()
    }
    skipped = {name: "; ".join(reasons) for name, reasons in missing.items() if reasons}
    static = list(sources.static.ranking) if sources.static else None
    predict_top = sources.predictor.top_heads if sources.predictor else None
    return HeadSources(static, predict_top, skipped)


# ---- ranking and metrics -------------------------------------------------------------------------------------------
def _arrays(run: RunDir, record: dict) -> dict[str, np.ndarray]:
    with np.load(run.arrays_path(record["sample_id"])) as data:
        return {key: data[key] for key in data.files}


def fit_qrhead(view: RunView, config: RerankFields, heads: HeadSources) -> tuple[HeadSources, Outputs]:
    """QRHead's head ranking from the whole fitting stream (the manifest's ``fit_questions``), with
    ``qrhead_heads.json``; while any of those questions is unscored the strategy is skipped and said so."""
    no_ranking = Outputs().add("qrhead_heads.json", REMOVED)  # none of an earlier summary's stays
    if "qrhead" not in base_strategies(config.strategies):
        return heads, no_ranking
    expected = view.manifest["fit_questions"]["ids"]
    fit = {r["question_id"]: r for r in view.records if r["stream"] == FIT}
    missing = [question for question in expected if question not in fit]
    if missing or not expected:
        why = f"fitted on the whole fitting stream only: {len(expected) - len(missing)} of its {len(expected)} scored"
        return dataclasses.replace(heads, skipped={**heads.skipped, "qrhead": why}), no_ranking
    records = [fit[question] for question in expected]
    qr = qrhead_scores([calibrated(_arrays(view.run, r)) for r in records], [r["gold"] for r in records])
    order = top_heads(qr, qr.size)
    ranked = Outputs().add("qrhead_heads.json", [[head_key(h), float(qr[h])] for h in order])
    return dataclasses.replace(heads, qrhead=order, fit_questions=len(records)), ranked


def fit_fusion_weights(view: RunView, config: RerankFields, heads: HeadSources) -> tuple[HeadSources, Outputs]:
    """Each ``mix:<strategy>`` weight from the whole fitting stream, with ``fusion_weights.json``; while any
    question of it is unscored (or its head strategy is skipped) the fused strategy is skipped and said so."""
    mixes = [s for s in config.strategies if (fused_parts(s) or ("",))[0] == "mix"]
    if not mixes:
        return heads, Outputs().add("fusion_weights.json", REMOVED)
    expected = view.manifest["fit_questions"]["ids"]
    fit = {r["question_id"]: r for r in view.records if r["stream"] == FIT}
    scored = [fit[q] for q in expected if q in fit]
    weights, grids, skipped = {}, {}, dict(heads.skipped)
    for strategy in mixes:
        base = cast(tuple[str, str], fused_parts(strategy))[1]
        if base in heads.skipped or len(scored) < len(expected) or not expected:
            skipped[strategy] = (
                f"its weight is fitted on the whole fitting stream: {len(scored)} of {len(expected)} scored"
                + (f", and {base} is skipped" if base in heads.skipped else "")
            )
            continue
        arrays = [(_arrays(view.run, r), r) for r in scored]
        head_scores = [question_scores(base, r, a, config, heads)[0] for a, r in arrays]
        weights[strategy], grids[strategy] = fusion.fit_weight(
            head_scores, [np.asarray(r["bm25"]) for r in scored], [r["gold"] for r in scored]
        )
    fitted = Outputs().add(
        "fusion_weights.json",
        {"weights": weights, "grid": grids, "fit_questions": len(scored)} if weights else REMOVED,
    )
    return dataclasses.replace(heads, weights=weights, skipped=skipped), fitted


def question_scores(
    strategy: str, record: dict, arrays: dict[str, np.ndarray], config: RerankFields, heads: HeadSources
) -> tuple[np.ndarray, list[Head] | None, float]:
    """One question's candidate scores under ``strategy`` (``rerank_strategies``, or a fusion of one with BM25), the
    heads it read (None: every head, or none) and the seconds they cost."""
    parts = fused_parts(strategy)
    if parts is not None:
        base_scores, chosen, seconds = question_scores(parts[1], record, arrays, config, heads)
        fused = fusion.fuse(parts[0], base_scores, np.asarray(record["bm25"]), heads.weights.get(strategy))
        return fused, chosen, seconds + record["bm25_seconds"]
    question = Candidates(record, arrays, config.k, config.seed, heads.qrhead, heads.static, heads.predict_top)
    return RERANK_STRATEGIES.get(strategy).scores(question)


def rank_questions(view: RunView, config: RerankFields, heads: HeadSources) -> pd.DataFrame:
    """One row per (evaluation question, strategy): ranking, gold, metrics, seconds (QRHead's heads and the
    fusion weights: ``heads``, from ``fit_qrhead`` and ``fit_fusion_weights``)."""
    evaluation = [r for r in view.records if r["stream"] == EVAL]
    if not evaluation:
        raise DynheadsError(f"{view.path} has no scored evaluation questions yet")
    strategies = [s for s in config.strategies if s not in heads.skipped and _base(s) not in heads.skipped]
    rows = []
    for record in evaluation:
        arrays = _arrays(view.run, record)
        every_head = int(np.prod(arrays["real"].shape[:2]))
        for strategy in strategies:
            scores, chosen, seconds = question_scores(strategy, record, arrays, config, heads)
            reads_heads = RERANK_STRATEGIES.get(_base(strategy)).reads_heads
            ranked = rerank.ranking(scores)
            rows.append(
                {
                    "question_id": record["question_id"],
                    "type": record.get("type"),
                    "strategy": strategy,
                    "heads": len(chosen) if chosen is not None else (every_head if reads_heads else None),
                    "ranking": json.dumps(ranked),
                    "gold": json.dumps(record["gold"]),
                    "top1_position": ranked[0],
                    "seconds": seconds,
                    **ranking_metrics(ranked, record["gold"]),
                }
            )
    return pd.DataFrame(rows)


def _base(strategy: str) -> str:
    parts = fused_parts(strategy)
    return parts[1] if parts is not None else strategy


def _evidence(config: RerankFields, name: str) -> EvidenceSettings:
    """The bootstrap settings of one table cell: its own seed, derived from the run's and the cell's name."""
    return EvidenceSettings(resamples=config.bootstrap, seed=derive_seed(config.seed, name))


def _interval_text(mean: Interval) -> str:
    return f"{mean.effect:.3f} [{mean.low:.3f}, {mean.high:.3f}]"


def _share_text(values, config: RerankFields, name: str) -> str:
    """A metric in [0, 1] per question: its mean and interval (exact Clopper-Pearson when every value is 0 or 1)."""
    return _interval_text(fraction_interval(values, _evidence(config, name)))


def rerank_tables(view: RunView, config: RerankFields, heads: HeadSources) -> Outputs:
    """QRHead's heads and the fusion weights fitted on the fitting stream, then every evaluation question ranked:
    qrhead_heads.json, fusion_weights.json, rankings.csv and rerank.md (its numbers in summary.json)."""
    heads, outputs = fit_qrhead(view, config, heads)
    heads, weights = fit_fusion_weights(view, config, heads)
    frame = rank_questions(view, config, heads)
    return outputs.extend(weights).add("rankings.csv", frame).add("rerank.md", _summary(frame, config, heads))


def _summary(frame: pd.DataFrame, config: RerankFields, heads: HeadSources) -> Summary:
    """``rerank.md``: the metrics per strategy with intervals, the paired differences, fusions and positions."""
    qr_heads = heads.qrhead[: config.k] if heads.qrhead is not None else []
    strategies = list(dict.fromkeys(frame["strategy"]))
    per = {s: frame[frame["strategy"] == s].set_index("question_id") for s in strategies}
    n = len(per[strategies[0]])
    fitted = (
        f"QRHead's heads fitted on {heads.fit_questions} of the {config.fit_questions} fitting questions"
        if heads.qrhead is not None
        else f"QRHead not asked for, so no heads fitted on the {config.fit_questions} fitting questions"
    )
    blocks: list = [
        f"{n} of the {config.questions} evaluation questions scored ({config.data}, stream from question "
        f"{config.first}); {fitted} (stream from question {config.fit_first}). Means with 95 % intervals over "
        f"questions: exact (Clopper-Pearson) where every question's value is 0 or 1, else percentile bootstrap "
        f"({config.bootstrap} resamples).",
        _metrics_table(per, config),
    ]
    blocks += _paired_blocks(per, config)
    blocks += _fusion_blocks(per, config, heads) + _position_blocks(per, strategies)
    notes = [f"{s}: skipped ({why})" for s, why in heads.skipped.items()]
    if qr_heads:
        notes.append(
            f"QRHead's {len(qr_heads)} heads: {', '.join(head_key(h) for h in qr_heads)} "
            "(all heads ranked in qrhead_heads.json)"
        )
    notes.append(
        "Seconds: ICR and the head subsets = one prefill of the prompt plus the content-free query's "
        "pass on the cached paragraphs; icr-uncalibrated = the prefill alone; bm25 = indexing and scoring "
        "the candidates."
    )
    blocks.append(Items(notes))
    numbers = {s: {m: float(per[s][m].mean()) for m in METRICS} for s in strategies}
    ranking_settings = {name: getattr(config, name) for name in RANKING_FIELDS}
    blocks.append(f"Ranking settings: `{json.dumps(ranking_settings)}` (the scoring settings are in manifest.json).")
    summary = Summary(
        blocks,
        {
            "questions": n,
            "fit_questions": heads.fit_questions,
            "qrhead_heads": [head_key(h) for h in qr_heads],
            "fusion_weights": heads.weights,
            "metrics": numbers,
            "ranking": ranking_settings,
            "skipped": heads.skipped,
        },
        title="Heads as a re-ranker",
    )
    return summary


def _metrics_table(per: dict[str, pd.DataFrame], config: RerankFields) -> Table:
    """Every strategy's metrics over the evaluation questions, with intervals, and its seconds per question."""
    return Table(
        ["strategy", "heads", "questions", *METRICS, "seconds / question"],
        [
            [
                s,
                _heads_text(frame["heads"].iloc[0]),
                len(frame),
                *(_share_text(frame[m].to_numpy(), config, f"{s}-{m}") for m in METRICS),
                float(frame["seconds"].mean()),
            ]
            for s, frame in per.items()
        ],
        {"seconds / question": ".3f"},
    )


HOLM_NOTE = (
    "each cell: the unadjusted 95 % interval of the mean difference; then Holm's family-wise adjustment over every "
    "cell of the table (``evidence.holm_differences``: 95 % family-wise, two-sided against 0), the interval at the "
    "step-down level the cell was decided at and ≠ 0 where the adjusted interval excludes 0, n.s. where it does not"
)


def _paired_blocks(per: dict[str, pd.DataFrame], config: RerankFields) -> list:
    """Every strategy minus BM25 and minus ICR, per question, each with the interval of its mean and its
    Holm-adjusted interval and decision over the table's family (every strategy x metric)."""
    blocks: list = []
    for baseline in ("bm25", "icr"):
        if baseline in per:
            strategies = [s for s in per if s != baseline]
            family = {(s, m): (per[s][m] - per[baseline][m]).to_numpy() for s in strategies for m in METRICS}
            adjusted = rerank_holm(family, config, f"holm-{baseline}")
            rows = [
                [s, *(_difference_text(family[s, m], config, f"{s}-{baseline}-{m}", adjusted[s, m]) for m in METRICS)]
                for s in strategies
            ]
            blocks += [
                f"Paired differences vs {baseline} (strategy minus {baseline}, per question; {HOLM_NOTE}; "
                f"{len(family)} differences):",
                Table(["strategy", *(f"Δ {m}" for m in METRICS)], rows),
            ]
    return blocks


def rerank_holm(family: dict, config: RerankFields, name: str) -> dict:
    """Holm's adjustment of a family of per-question differences of two metrics in [0, 1] (key -> array), with
    the run's resamples and a seed derived from ``name``: key -> ``HolmDecision``."""
    named = {str(key): values for key, values in family.items()}
    decided = holm_differences(named, _evidence(config, name), bounds=(-1.0, 1.0))
    return {key: decided[str(key)] for key in family}


def _difference_text(differences, config: RerankFields, name: str, adjusted: HolmDecision) -> str:
    """A per-question difference of two metrics in [0, 1]: its mean and interval (exact when all agree), then its
    Holm-adjusted interval and decision."""
    unadjusted = mean_interval(np.asarray(differences), _evidence(config, name), bounds=(-1.0, 1.0))
    return f"{_interval_text(unadjusted)}; Holm {adjusted.text()}"


def _fusion_blocks(per: dict[str, pd.DataFrame], config: RerankFields, heads: HeadSources) -> list:
    """Each fused strategy and its head strategy against BM25, per question type (bridge / comparison): where the
    heads add to BM25 and where they do not; and the fitted ``mix`` weights."""
    fused = [s for s in per if fused_parts(s) is not None]
    if not fused or "bm25" not in per:
        return []
    shown = list(dict.fromkeys(name for s in fused for name in (s, _base(s)) if name in per))
    bm25 = per["bm25"]
    kinds = {kind: bm25.index[bm25["type"] == kind] for kind in sorted(bm25["type"].dropna().unique())}
    family = {
        (s, kind, m): (per[s].loc[ids, m] - bm25.loc[ids, m]).to_numpy()
        for s in shown
        for kind, ids in kinds.items()
        for m in FUSION_METRICS
    }
    adjusted = rerank_holm(family, config, "holm-fusion-types")
    rows = [
        [s, kind, len(ids)]
        + [
            _difference_text(family[s, kind, m], config, f"{s}-{kind}-{m}", adjusted[s, kind, m])
            for m in FUSION_METRICS
        ]
        for s in shown
        for kind, ids in kinds.items()
    ]
    weights = ", ".join(f"{s} {w:.2f}" for s, w in heads.weights.items())
    return [
        f"Fusions with BM25 by question type (strategy minus bm25, per question; {HOLM_NOTE}; {len(family)} "
        "differences)"
        + (f"; mix weights (head share) fitted on the fitting stream: {weights}" if weights else "")
        + ":",
        Table(["strategy", "type", "questions", "Δ recall@2", "Δ mrr"], rows),
    ]


FUSION_METRICS = ("recall@2", "mrr")  # the by-type table's metrics


def _heads_text(value) -> str:
    return "-" if value is None or (isinstance(value, float) and np.isnan(value)) else str(int(value))


def _position_blocks(per: dict[str, pd.DataFrame], strategies: list[str]) -> list:
    """Where the gold candidates sit in the (shuffled) prompt, and where each strategy's top candidate sits: a
    strategy that favours a position shows it here whatever the gold distribution."""
    first = per[strategies[0]]
    size = max(len(json.loads(r)) for r in first["ranking"])
    gold = np.zeros(size, dtype=int)
    for text in first["gold"]:
        for position in json.loads(text):
            gold[position] += 1
    top1 = {s: np.bincount(per[s]["top1_position"].to_numpy(dtype=int), minlength=size) for s in strategies}
    rows = [[position, int(gold[position]), *(int(top1[s][position]) for s in strategies)] for position in range(size)]
    return [
        "Prompt positions (0 = first candidate): how many gold candidates sit there, and how often each strategy "
        "ranks the candidate there first:",
        Table(["position", "gold", *(f"top-1 {s}" for s in strategies)], rows),
    ]
