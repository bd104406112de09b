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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Unpack

import numpy as np

from dynheads.analysis.ranking import check_head_count
from dynheads.errors import DynheadsError
from dynheads.experiments.experiment import Context, Experiment, Phase, Plan, Work, plan_sources, run_experiment
from dynheads.models import LoadedModel
from dynheads.outputs import Outputs, write_outputs
from dynheads.rag import rerank
from dynheads.rag.rerank_strategies import RERANK_STRATEGIES, base_strategies, check_strategy_names
from dynheads.resources import Evaluated, needs_of
from dynheads.runs import Finished, Job, RunDir, RunOptions, RunView
from dynheads.seeding import derive_seed
from dynheads.settings import RerankFields
from dynheads.tasks.hotpotqa import HotpotRecord, load_hotpotqa, render_paragraph
from dynheads.tasks.prompting import template_of
from dynheads.tasks.questions import QuestionStream, refuse_overlap
from dynheads.views.rerank_tables import EVAL, FIT, RANKING_FIELDS, head_sources, rerank_tables


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
        check_strategy_names(self.strategies)
        if self.k < 1 or self.bootstrap < 1:
            raise DynheadsError(f"--k and --bootstrap must be >= 1, got {self.k} and {self.bootstrap}")


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
    _check_k(config, lm.num_layers * lm.num_heads)  # a ranking setting, but refused before any question is scored
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
        **template_of(lm.tokenizer, rerank.SYSTEM_PROMPT),
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
    return rerank_tables(RunView.of(context.run), context.config, head_sources(context.config, context.sources))


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
    if manifest.get("kind") != RERANK.kind or manifest.get("config") != json.loads(json.dumps(config.scoring())):
        raise DynheadsError(
            f"{run.path} is not a rerank run scored with these settings (data, streams, seed, "
            "model): give the settings it was run with"
        )
    refuse_other_rows(manifest, run)
    model = manifest["model"]
    _check_k(config, model["num_layers"] * model["num_heads"])
    sources = plan_sources(Plan(**_source_fields(config, manifest["questions"]["ids"])), model)
    write_outputs(run.path, rerank_tables(RunView.of(run), config, head_sources(config, sources)))
    return run


def _check_k(config: RerankConfig, num_heads: int) -> None:
    """Refuse a ``--k`` the model cannot give when a chosen strategy scores k heads (``takes_k``)."""
    if any(RERANK_STRATEGIES.get(name).takes_k for name in base_strategies(config.strategies)):
        check_head_count(config.k, num_heads)


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
