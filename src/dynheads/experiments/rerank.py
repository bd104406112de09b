"""Heads as a re-ranker on HotpotQA's distractor setting (10 candidates, 2 gold), beside BM25; resumable.

Two disjoint question streams of the data: the fitting stream (QRHead's head choice) and the evaluation stream.
Per question the candidates are shuffled with a seed derived from the master seed and the question id, rendered
before the question (``dynheads.rag.rerank``), and scored once: the ``[L, H, S]`` span scores under the real and
the content-free query and the final hidden state go to ``scores/<sample_id>.npz``, BM25's scores and every
timing to the record. Rankings and metrics are computed from those files when the run is summarised, so every
strategy is ranked from the same passes:

- ``icr``: all heads, calibrated; ``icr-uncalibrated``: all heads, raw (what the calibration buys);
- ``qrhead``: the k heads with the highest mean calibrated score on the gold candidates of the fitting stream, fitted
  only once every question of that stream is scored (the manifest lists them);
- ``static``: the k best heads of a Wu et al. list (``--static``); ``predictor``: the k heads the head predictor
  (``--predictor``) scores highest from the hidden state at the prompt's last token; ``random``: k heads drawn per
  question (seeded);
- ``bm25``: ``bm25s`` over the candidates' text;
- ``rrf:<strategy>`` and ``mix:<strategy>``: a head strategy fused with BM25 (``dynheads.rag.fusion``):
  reciprocal-rank fusion, or min-max scaled scores mixed with a weight fitted on the fitting stream only (every
  question of it scored, as for QRHead; ``fusion_weights.json``). ``mix:qrhead`` fits its weight on QRHead's own
  fitting questions, where QRHead's heads are in-sample.

The manifest records the scoring settings (streams, seed, model, data); the ranking settings (strategies, k, the
static list, the head predictor, bootstrap resamples) may change when a scored run is summarised again, and each
summary records its own.

Outputs: ``rankings.csv`` (one row per question and strategy), ``qrhead_heads.json`` (the fitted ranking, a ranked
head list), ``fusion_weights.json`` (each ``mix`` weight and its grid on the fitting stream), ``rerank.md`` /
``summary.json`` (metrics with paired bootstrap intervals, differences vs BM25 and vs ICR, each fusion against BM25
by question type, cost per question, and where gold and top-1 candidates sit in the prompt).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Unpack, cast

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
from dynheads.experiments.experiment import Context, Experiment, Phase, Plan, Work, plan_sources, run_experiment
from dynheads.heads import Head, head_key
from dynheads.models import LoadedModel
from dynheads.outputs import Outputs, write_outputs
from dynheads.rag import fusion, rerank
from dynheads.rag.rerank_strategies import RERANK_STRATEGIES, Candidates, calibrated
from dynheads.resources import Evaluated, Resources, needs_of
from dynheads.runs import Finished, Job, RunDir, RunOptions, RunView
from dynheads.seeding import derive_seed
from dynheads.settings import RerankFields
from dynheads.tables import Items, Summary, Table
from dynheads.tasks.hotpotqa import HotpotRecord, load_hotpotqa, render_paragraph
from dynheads.tasks.questions import QuestionStream, refuse_overlap

FIT, EVAL = "fit", "eval"
# Settings that only change how the stored scores are ranked: a scored run may be summarised again with others.
RANKING_FIELDS = ("strategies", "k", "static", "probe", "bootstrap")


@dataclass(frozen=True)
class RerankConfig(RerankFields):
    def streams(self) -> tuple[QuestionStream, QuestionStream]:
        """(fitting, evaluation) streams; refused when their index ranges overlap."""
        fit = QuestionStream("rerank-fit", self.fit_first, self.fit_questions)
        evaluation = QuestionStream("rerank", self.first, self.questions)
        if fit.first < evaluation.stop and evaluation.first < fit.stop:
            raise DynheadsError(
                f"the fitting stream (questions {fit.first}..{fit.stop - 1}) overlaps the evaluation "
                f"stream ({evaluation.first}..{evaluation.stop - 1}): move --first or --fit-first"
            )
        return fit, evaluation

    def scoring(self) -> dict:
        """The settings the stored scores depend on: what the manifest records and a resumed run must repeat."""
        return {name: value for name, value in dataclasses.asdict(self).items() if name not in RANKING_FIELDS}

    def check(self) -> None:
        """Every setting that can be refused before the model loads."""
        self.streams()
        unknown = sorted(s for s in self.strategies if s not in RERANK_STRATEGIES and fused_parts(s) is None)
        if unknown or not self.strategies:
            raise DynheadsError(
                f"unknown rerank strategy {', '.join(unknown) or '(none given)'}: use {RERANK_STRATEGIES.choices()}, "
                f"or {'/'.join(fusion.FUSIONS)}:<one of {', '.join(head_strategies())}> (fused with bm25)"
            )
        if self.k < 1 or self.bootstrap < 1:
            raise DynheadsError(f"--k and --bootstrap must be >= 1, got {self.k} and {self.bootstrap}")


def head_strategies() -> list[str]:
    """The registered strategies that read heads: what a fusion may combine with BM25."""
    return [name for name in RERANK_STRATEGIES.names() if RERANK_STRATEGIES.get(name).reads_heads]


def fused_parts(strategy: str) -> tuple[str, str] | None:
    """(fusion, head strategy) of a fused strategy's name (``rrf:static``), None for any other name."""
    kind, _, base = strategy.partition(":")
    return (kind, base) if kind in fusion.FUSIONS and base in head_strategies() else None


def base_strategies(strategies: tuple[str, ...]) -> set[str]:
    """The strategies whose scores the chosen ones read (a fusion reads its head strategy's and BM25's)."""
    parts = [fused_parts(s) for s in strategies]
    return {s for s, part in zip(strategies, parts, strict=True) if part is None} | {
        name for part in parts if part is not None for name in (part[1], "bm25")
    }


@dataclass(frozen=True, kw_only=True)
class _RerankPlan(Plan):
    fit: QuestionStream
    evaluation: QuestionStream
    fit_records: list[HotpotRecord]
    eval_records: list[HotpotRecord]


def _check_rerank(config: RerankConfig) -> None:
    config.check()
    rerank.require_bm25()  # a missing bm25s fails here, before any model work


def _rerank_plan(config: RerankConfig, lm: LoadedModel) -> _RerankPlan:
    """Both streams' questions (disjoint); the sources the chosen strategies read, checked against the evaluated
    questions. A strategy whose source was not given is skipped (``HeadSources.skipped``)."""
    fit, evaluation = config.streams()
    records = load_hotpotqa(config.data)
    fit_records, eval_records = fit.take(records, config.data), evaluation.take(records, config.data)
    eval_ids = [r.id for r in eval_records]
    refuse_overlap([r.id for r in fit_records], "QRHead's fitting stream", eval_ids, "this rerank run")
    return _RerankPlan(
        **_source_fields(config, eval_ids),
        fit=fit,
        evaluation=evaluation,
        fit_records=fit_records,
        eval_records=eval_records,
    )


def _source_fields(config: RerankConfig, eval_ids: list[str]) -> dict[str, Any]:
    """The plan's head sources: those the chosen strategies read, checked against the evaluated questions."""
    bases = base_strategies(config.strategies)
    needs = needs_of(RERANK_STRATEGIES.get(name) for name in RERANK_STRATEGIES.names() if name in bases)
    return {
        "needs": frozenset(needs),
        "evaluated": Evaluated("this rerank run", questions=tuple(eval_ids)),
        "static": config.static,
        "predictor": config.probe,
    }


def _rerank_work(context: Context[RerankConfig, _RerankPlan]) -> Work:
    """Every question of both streams scored once (its arrays saved beside its record)."""
    config, lm, plan = context.config, context.lm, context.plan
    manifest = {
        "data": config.data,
        "prompt": {
            "system": rerank.SYSTEM_PROMPT,
            "user": rerank.USER_TEMPLATE,
            "content_free_query": rerank.CONTENT_FREE_QUERY,
            "query_rows": rerank.QUERY_ROWS,
        },
        "questions": plan.evaluation.describe([r.id for r in plan.eval_records]),
        "fit_questions": plan.fit.describe([r.id for r in plan.fit_records]),
        "order_seed": "derive_seed(seed, question id, 'order'): a permutation of the record's paragraphs",
    }
    jobs = [
        Job(sample_id(stream, r.id), (stream, r))
        for stream, rs in ((FIT, plan.fit_records), (EVAL, plan.eval_records))
        for r in rs
    ]
    scoring = Phase(
        jobs, lambda batch: [score_question(lm, record, stream, config) for stream, record in batch], "rerank"
    )
    return Work(manifest, [scoring])


def _rerank_tables(context: Context[RerankConfig, _RerankPlan]) -> Outputs:
    """Rank, measure and summarise once every process has finished."""
    return rerank_tables(RunView.of(context.run), context.config, _head_sources(context.config, context.sources))


RERANK = Experiment(
    "rerank",
    _rerank_plan,
    _rerank_work,
    _rerank_tables,
    check=_check_rerank,
    records=lambda config: config.scoring(),
    on_start=lambda manifest, run: refuse_other_rows(manifest, run),
)


def run_rerank(config: RerankConfig, out: str | Path, **options: Unpack[RunOptions]) -> RunDir:
    """Score both streams into ``out`` (finished questions are skipped), then rank, measure and summarise."""
    return run_experiment(RERANK, config, out, **options)


def summarise_scored(config: RerankConfig, out: str | Path) -> RunDir:
    """Rank and summarise the questions ``out`` has scored so far, scoring none and loading no model (the ranking
    settings of ``config`` may differ from the run's; its scoring settings must be the run's)."""
    config.check()
    run = RunDir(out)
    manifest = run.manifest()
    if manifest.get("kind") != "rerank" or manifest.get("config") != json.loads(json.dumps(config.scoring())):
        raise DynheadsError(
            f"{run.path} is not a rerank run scored with these settings (data, streams, seed, "
            "model): give the settings it was run with"
        )
    refuse_other_rows(manifest, run)
    model = manifest["model"]
    sources = plan_sources(
        Plan(**_source_fields(config, manifest["questions"]["ids"])), model["num_layers"], model["num_heads"]
    )
    write_outputs(run.path, rerank_tables(RunView.of(run), config, _head_sources(config, sources)))
    return run


def refuse_other_rows(manifest: dict, run: RunDir) -> None:
    """Scores stored under another query-row rule (before ICR's per-row mean) are not comparable: refuse them."""
    if manifest.get("prompt", {}).get("query_rows") != rerank.QUERY_ROWS:
        raise DynheadsError(
            f"{run.path} was scored with other query rows (the question's rows summed, before ICR's per-row "
            "mean over the instruction, question and template end): score again into a new --out"
        )


def sample_id(stream: str, question_id: str) -> str:
    return f"{stream}-{question_id}"


def score_question(lm: LoadedModel, record: HotpotRecord, stream: str, config: RerankConfig) -> Finished:
    """Shuffle, render and score one question: its record and its arrays (saved first; the record marks the
    question done)."""
    order_seed = derive_seed(config.seed, record.id, "order")
    order = [int(i) for i in np.random.default_rng(order_seed).permutation(len(record.context))]
    paragraphs = [render_paragraph(record.context[i]) for i in order]
    gold_titles = set(record.gold_titles)
    gold = [position for position, i in enumerate(order) if record.context[i][0] in gold_titles]
    prompt = rerank.build_prompt(lm.tokenizer, paragraphs, record.question)
    scores = rerank.span_scores(lm, prompt)
    bm25, bm25_seconds = rerank.bm25_scores(paragraphs, record.question)
    name = sample_id(stream, record.id)
    arrays = {"real": scores.real, "content_free": scores.content_free, "hidden": scores.hidden}
    described = {
        "sample_id": name,
        "question_id": record.id,
        "stream": stream,
        "question": record.question,
        "type": record.type,
        "order_seed": order_seed,
        "order": order,
        "titles": [record.context[i][0] for i in order],
        "gold": gold,
        "prompt_tokens": len(prompt.input_ids),
        "query_rows": [prompt.query[1] - prompt.query[0], prompt.null_query[1] - prompt.null_query[0]],
        "paragraph_tokens": [b - a for a, b in prompt.spans],
        "prefill_seconds": scores.prefill_seconds,
        "calibration_seconds": scores.calibration_seconds,
        "bm25": bm25.tolist(),
        "bm25_seconds": bm25_seconds,
    }
    return Finished(described, arrays=arrays)


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


def _head_sources(config: RerankConfig, sources: Resources) -> HeadSources:
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


def fit_qrhead(view: RunView, config: RerankConfig, heads: HeadSources) -> tuple[HeadSources, Outputs]:
    """QRHead's head ranking from the whole fitting stream (the manifest's ``fit_questions``), with
    ``qrhead_heads.json``; while any of those questions is unscored the strategy is skipped and said so."""
    if "qrhead" not in base_strategies(config.strategies):
        return heads, Outputs()
    expected = view.manifest["fit_questions"]["ids"]
    fit = {r["question_id"]: r for r in view.records if r["stream"] == FIT}
    missing = [question for question in expected if question not in fit]
    if missing or not expected:
        why = f"fitted on the whole fitting stream only: {len(expected) - len(missing)} of its {len(expected)} scored"
        return dataclasses.replace(heads, skipped={**heads.skipped, "qrhead": why}), Outputs()
    records = [fit[question] for question in expected]
    qr = qrhead_scores([calibrated(_arrays(view.run, r)) for r in records], [r["gold"] for r in records])
    order = top_heads(qr, qr.size)
    ranked = Outputs().add("qrhead_heads.json", [[head_key(h), float(qr[h])] for h in order])
    return dataclasses.replace(heads, qrhead=order, fit_questions=len(records)), ranked


def fit_fusion_weights(view: RunView, config: RerankConfig, heads: HeadSources) -> tuple[HeadSources, Outputs]:
    """Each ``mix:<strategy>`` weight from the whole fitting stream, with ``fusion_weights.json``; while any
    question of it is unscored (or its head strategy is skipped) the fused strategy is skipped and said so."""
    mixes = [s for s in config.strategies if (fused_parts(s) or ("",))[0] == "mix"]
    if not mixes:
        return heads, Outputs()
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
    fitted = Outputs()
    if weights:
        fitted.add("fusion_weights.json", {"weights": weights, "grid": grids, "fit_questions": len(scored)})
    return dataclasses.replace(heads, weights=weights, skipped=skipped), fitted


def question_scores(
    strategy: str, record: dict, arrays: dict[str, np.ndarray], config: RerankConfig, heads: HeadSources
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


def rank_questions(view: RunView, config: RerankConfig, heads: HeadSources) -> pd.DataFrame:
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


def _evidence(config: RerankConfig, name: str) -> EvidenceSettings:
    """The bootstrap settings of one table cell: its own seed, derived from the run's and the cell's name."""
    return EvidenceSettings(resamples=config.bootstrap, seed=derive_seed(config.seed, name))


def _interval_text(mean: Interval) -> str:
    return f"{mean.effect:.3f} [{mean.low:.3f}, {mean.high:.3f}]"


def _share_text(values, config: RerankConfig, name: str) -> str:
    """A metric in [0, 1] per question: its mean and interval (exact Clopper-Pearson when every value is 0 or 1)."""
    return _interval_text(fraction_interval(values, _evidence(config, name)))


def rerank_tables(view: RunView, config: RerankConfig, heads: HeadSources) -> Outputs:
    """QRHead's heads and the fusion weights fitted on the fitting stream, then every evaluation question ranked:
    qrhead_heads.json, fusion_weights.json, rankings.csv and rerank.md (its numbers in summary.json)."""
    heads, outputs = fit_qrhead(view, config, heads)
    heads, weights = fit_fusion_weights(view, config, heads)
    frame = rank_questions(view, config, heads)
    return outputs.extend(weights).add("rankings.csv", frame).add("rerank.md", _summary(frame, config, heads))


def _summary(frame: pd.DataFrame, config: RerankConfig, heads: HeadSources) -> Summary:
    """``rerank.md``: the metrics per strategy with intervals, the paired differences, fusions and positions."""
    qr_heads = heads.qrhead[: config.k] if heads.qrhead is not None else []
    strategies = list(dict.fromkeys(frame["strategy"]))
    per = {s: frame[frame["strategy"] == s].set_index("question_id") for s in strategies}
    n = len(per[strategies[0]])
    blocks: list = [
        f"{n} of the {config.questions} evaluation questions scored ({config.data}, stream from question "
        f"{config.first}); QRHead's heads fitted on {heads.fit_questions} of the {config.fit_questions} fitting "
        f"questions (stream from question {config.fit_first}). Means with 95 % intervals over "
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


def _metrics_table(per: dict[str, pd.DataFrame], config: RerankConfig) -> Table:
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


def _paired_blocks(per: dict[str, pd.DataFrame], config: RerankConfig) -> list:
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


def rerank_holm(family: dict, config: RerankConfig, name: str) -> dict:
    """Holm's adjustment of a family of per-question differences of two metrics in [0, 1] (key -> array), with
    the run's resamples and a seed derived from ``name``: key -> ``HolmDecision``."""
    named = {str(key): values for key, values in family.items()}
    decided = holm_differences(named, _evidence(config, name), bounds=(-1.0, 1.0))
    return {key: decided[str(key)] for key in family}


def _difference_text(differences, config: RerankConfig, name: str, adjusted: HolmDecision) -> str:
    """A per-question difference of two metrics in [0, 1]: its mean and interval (exact when all agree), then its
    Holm-adjusted interval and decision."""
    unadjusted = mean_interval(np.asarray(differences), _evidence(config, name), bounds=(-1.0, 1.0))
    return f"{_interval_text(unadjusted)}; Holm {adjusted.text()}"


def _fusion_blocks(per: dict[str, pd.DataFrame], config: RerankConfig, heads: HeadSources) -> list:
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
