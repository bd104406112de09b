"""Dynamic RAG evaluation (paper Section 6, Tables 4 and 6) over HotpotQA samples, resumable.

One record per (question, strategy, k); ``none`` and ``full-context`` use no heads and run once per question.
Besides EM/F1 we report what the paper does not: retrieval recall (share of supporting-fact tokens that some
retrieval made visible), retrievals per question, and visible context tokens per retrieval.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Unpack, cast

import numpy as np

from dynheads.analysis.ranking import check_head_count
from dynheads.config import pieces_of
from dynheads.errors import DynheadsError
from dynheads.experiments.experiment import Context, Experiment, Phase, Plan, Work, run_experiment
from dynheads.models import LoadedModel
from dynheads.outputs import Outputs
from dynheads.rag.loop import RagAnswer, RagSettings, answer_questions
from dynheads.rag.strategies import RAG_STRATEGIES, HeadPredictor, HeadSelector, RagStrategy
from dynheads.rag.trigger import TriggerConfig, TriggerForm
from dynheads.rag.windows import RetrievalConfig
from dynheads.resources import HEAD_PREDICTOR, Evaluated, PredictorSource, needs_of
from dynheads.runs import RESULTS_FILE, Finished, Job, RunDir, RunOptions, RunView
from dynheads.seeding import derive_seed
from dynheads.settings import HotpotConfig, QaGrid, RagFields
from dynheads.tasks import candidates
from dynheads.tasks.grid import TaskGrid
from dynheads.tasks.registry import Task, task_of
from dynheads.tasks.sample import Sample, template_fields
from dynheads.views.rag_tables import rag_summary


@dataclass(frozen=True)
class RagConfig(RagFields):
    def settings(self) -> RagSettings:
        return RagSettings(
            max_new_tokens=self.max_new_tokens,
            draft_tokens=self.draft_tokens,
            max_retrievals=self.max_retrievals,
            trigger=TriggerConfig(threshold=self.threshold, form=cast(TriggerForm, self.trigger_form)),  # checks it
            retrieval=RetrievalConfig(top_n=self.top_n, window=self.window, gap=self.gap),
        )

    def task_entry(self) -> Task:
        """The registered question task the run answers: ``task``, or the one its ``data`` selects."""
        task = task_of(self.task, self.data)
        if not task.questions:
            raise DynheadsError(f"rag answers questions: task {task.name!r} has none (use hotpotqa or custom)")
        return task

    def check(self) -> None:
        """What can be refused before the model loads: the task, and a user's file record by record."""
        task = self.task_entry()
        if task.check_data is not None:
            task.check_data(self.hotpot_config())

    def hotpot_config(self) -> HotpotConfig:
        """The question grid the RAG run answers."""
        return HotpotConfig(**pieces_of(self, QaGrid), split=self.split)


@dataclass(frozen=True)
class RagArm:
    """One (strategy, k) of a RAG run, its strategy resolved once (k None: a strategy that uses no heads)."""

    name: str
    strategy: RagStrategy
    k: int | None

    @property
    def needs_static(self) -> bool:
        return self.strategy.needs_static

    @property
    def needs_probe(self) -> bool:
        return self.strategy.needs_probe


def rag_arms(config: RagConfig) -> list[RagArm]:
    """Every (strategy, k) arm: one per k of ``config.ks`` for a strategy that uses heads, else one with k None;
    an unknown name is the registry's one line listing the registered ones, a repeated strategy or k one line."""
    RAG_STRATEGIES.check(config.strategies)
    for option, values in (("--strategies", config.strategies), ("--k", config.ks)):
        repeated = [value for i, value in enumerate(values) if value in values[:i]]
        if repeated:  # each record id is one (strategy, k): a repeat would answer it twice and keep one
            raise DynheadsError(f"{option} names {repeated[0]!r} twice")
    arms: list[RagArm] = []
    for name in config.strategies:
        strategy = RAG_STRATEGIES.get(name)
        arms += [RagArm(name, strategy, k) for k in (config.ks if strategy.uses_heads else (None,))]
    return arms


@dataclass(frozen=True, kw_only=True)
class _RagPlan(Plan):
    task: Task
    hotpot: HotpotConfig
    grid: TaskGrid


def _rag_plan(config: RagConfig, lm: LoadedModel) -> _RagPlan:
    """The questions; the sources the strategies read, refused where fitted on them (and refused when not given).
    The prompts are not checked against the window here: a retrieval's prompt is built per step."""
    hotpot, task = config.hotpot_config(), config.task_entry()
    arms = rag_arms(config)
    for k in {arm.k for arm in arms if arm.k is not None}:  # before the run folder is written: it would keep the k
        check_head_count(k, lm.num_layers * lm.num_heads)
    grid = task.grid(hotpot, lm.tokenizer)
    return _RagPlan(
        needs=frozenset(needs_of(arms)),
        evaluated=Evaluated("this RAG run", questions=tuple(sorted({sample.record_id for sample in grid.samples}))),
        static=config.static,
        predictor=config.probe,
        missing="refuse",
        task=task,
        hotpot=hotpot,
        grid=grid,
    )


def _rag_work(context: Context[RagConfig, _RagPlan]) -> Work:
    """Every question under every (strategy, k): a question's jobs are one call, one prefill of its prompt."""
    config, lm, plan, sources = context.config, context.lm, context.plan, context.sources
    arms = rag_arms(config)
    predict_top = _top_heads(sources.predictor) if sources.predictor else None
    ranking = list(sources.static.ranking) if sources.static else None
    manifest = {
        "data": config.data or "synthetic",
        "prompt": plan.task.prompt(plan.hotpot)["user"],
        **template_fields(plan.grid.samples),
        **plan.grid.manifest(),
        "static_scored_heads": len(ranking) if ranking else None,
        "probe_questions_checked": HEAD_PREDICTOR in plan.needs,
    }
    answering = [
        Job(_record_id(s.sample_id, arm.name, arm.k), (s, arm), group=s.sample_id)
        for s in plan.grid.samples
        for arm in arms
    ]
    answerer = _RagAnswerer(lm, config, plan.task, ranking, predict_top, config.settings(), context.batch_size)
    return Work(manifest, [Phase(answering, answerer, "rag")])


def _rag_tables(context: Context[RagConfig, _RagPlan]) -> Outputs:
    sources, view = context.sources, RunView.of(context.run)
    ranking = list(sources.static.ranking) if sources.static else None
    summary = rag_summary(view, context.config, context.plan.grid.skip_note(), ranking)
    return Outputs().add(RESULTS_FILE, view.results()).add("rag.md", summary)


def _check_rag(config: RagConfig) -> None:
    rag_arms(config)  # unknown strategies first
    config.check()


RAG = Experiment("rag", _rag_plan, _rag_work, _rag_tables, check=_check_rag)


def run_rag(config: RagConfig, out: str | Path, **options: Unpack[RunOptions]) -> RunDir:
    """Answer every question under every (strategy, k) into ``out``; finished ones are skipped. A question's
    strategies share one prefill of its prompt; ``batch_size`` questions per call, ``batch_size`` answers decoding
    together (``rag.loop.answer_questions``; the records equal batch 1's)."""
    return run_experiment(RAG, config, out, **options)


@dataclass(frozen=True)
class _RagAnswerer:
    """The work of ``run_jobs``: answer a batch of (sample, arm) jobs, one record each."""

    lm: LoadedModel
    config: RagConfig
    task: Task
    ranking: list | None  # the static list's scored heads (when a strategy needs them)
    predict_top: HeadPredictor | None
    settings: RagSettings
    rows_together: int  # answers decoding together (1: each alone, records identical to running it by itself)

    def selector(self, sample: Sample, arm: RagArm) -> tuple[HeadSelector, int | None]:
        """The arm's head selector and the k it uses: only scored static heads, never filler."""
        ranking, k = self.ranking, arm.k
        used_k = min(k, len(ranking)) if ranking is not None and arm.needs_static and k else k
        selector = HeadSelector(
            arm.name,
            k=used_k or 1,
            num_layers=self.lm.num_layers,
            num_heads=self.lm.num_heads,
            rng=derive_seed(self.config.seed, sample.sample_id, arm.name, k),
            static_ranking=ranking,
            predict_top=self.predict_top,
        )
        return selector, used_k

    def __call__(self, batch: list[tuple]) -> list[Finished]:
        """The batch's answers decoded together (``answer_questions``), one record each."""
        config, selectors, shown, used = self.config, [], [], []
        for sample, arm in batch:
            selector, used_k = self.selector(sample, arm)
            selectors.append(selector)
            given = arm.strategy.visibility == "given"  # the windows re-ranking shows
            reranked = _rerank(self.lm, sample, config.rerank_top, config.rerank_tokens) if given else {}
            used.append((used_k, reranked))
            shown.append(used[-1][1].get("shown", ()))
        samples = [item[0] for item in batch]
        answers = answer_questions(self.lm, samples, selectors, self.settings, shown, self.rows_together)
        return [
            Finished(_answer_record(self.task, sample, arm.name, arm.k, used_k, reranked, result))
            for (sample, arm), (used_k, reranked), result in zip(batch, used, answers, strict=True)
        ]


def _answer_record(
    task, sample, strategy: str, k: int | None, used_k: int | None, reranked: dict, answer: RagAnswer
) -> dict:
    return {
        **reranked,
        "sample_id": _record_id(sample.sample_id, strategy, k),
        "question_id": sample.sample_id,
        "strategy": strategy,
        "k": k,
        "question": sample.question,
        "answer": sample.answer,
        "type": getattr(sample, "type", None),  # HotpotQA's bridge / comparison; none for your own records
        "generated": answer.text,
        "metrics": task.score(sample, answer.text),
        "retrievals": answer.retrievals,
        "visible_tokens": answer.visible_tokens,
        "windows": answer.windows,
        "heads": answer.heads,
        "retrieval_recall": answer.retrieval_recall,
        "context_tokens": sample.context_span[1] - sample.context_span[0],
        "record_id": sample.record_id,
        "heads_used": used_k,
        "meta": {
            key: sample.meta[key]
            for key in (candidates.CANDIDATES, candidates.GOLD_RANK, candidates.DEPTHS)
            if key in sample.meta
        },
    }


def _rerank(lm: LoadedModel, sample, top: int, tokens: int | None) -> dict:
    """Re-rank then answer: ICR's ranking of the sample's paragraphs (every head, calibrated) and the token
    windows it shows (the ``top`` first, or ``tokens`` tokens in rank order); what the record keeps about them."""
    from dynheads.rag.rerank import icr_ranking, sample_prompt, shown_spans

    if top < 1:
        raise DynheadsError(f"--rerank-top must be >= 1, got {top}")
    prompt = sample_prompt(lm.tokenizer, sample)
    order, seconds = icr_ranking(lm, prompt)
    titles = sample.meta["paragraph_titles"]
    gold = {title for title, _ in sample.supporting_facts}
    shown = shown_spans(prompt.spans, order, top, tokens)
    chosen = order[: len(shown)]
    return {
        "shown": shown,
        "ranking": [titles[i] for i in order],
        "gold_shown": len(gold & {titles[i] for i in chosen}) / len(gold),
        "rerank_seconds": seconds,
    }


def _record_id(sample_id: str, strategy: str, k: int | None) -> str:
    return f"{sample_id}-{strategy}" + (f"-k{k}" if k is not None else "")


def _top_heads(source: PredictorSource) -> HeadPredictor:
    """The predictor as the strategies call it: ``(hidden, k) -> heads`` on a float32 hidden state."""
    return lambda hidden, k: source.top_heads(np.asarray(hidden, dtype=np.float32), k)
