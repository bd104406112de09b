"""Claim 2 on a NIAH grid: per-step head ablation (Figure 2) and progressive ablation with compensation (Figure 3).

``run_ablation`` decodes every sample of a lengths x depths x runs grid once per strategy with
``dynheads.ablation.cascade.ablated_generate`` and writes, besides the run directory's records:

- ``cells.csv``: mean accuracy and ROUGE-L per strategy x length x depth, with the number of samples,
- ``summary.md``: the means per strategy, beside what the paper reports,
- ``plots/ablation-accuracy.png``, ``plots/ablation-rouge_l.png``: Figure 2's heat maps.

The un-ablated baseline ``none`` always runs too. How many heads ``static`` and ``random`` mask is the config's
``matching``: ``per_step`` (default) masks at step t exactly |D_t| heads, D_t from that step's clean pass of the
control run itself; ``mean`` (the paper's sentence) masks at every step as many heads as the dynamic run of the
same sample masked on average (rounded), so ``dynamic`` runs whenever they do, before them, and on resume the
count is read back from the saved dynamic record. Either way cells.csv counts, per cell, the samples that masked
no head at all (``zero_masked``) and the heads masked per step (``mean_masked``).

``run_progressive`` masks the first k dynamic heads of every step (ordered by their attention on the copied
position for Eq. 1, by their Eq. 2 score for ``reasoning``; k = 0 is the un-ablated run) and reports per k the
mean over samples of m_s = max_t |E_t ∩ static top-20| (E_t: the heads that copy only after masking) and the
task metrics, in ``progressive.csv``, ``summary.md`` and ``plots/progressive.png``.

Each (sample, strategy) or (sample, k) is one record, written atomically: an interrupted run resumes where it
stopped and reproduces the records it had not finished identically.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Unpack

from dynheads.ablation.cascade import (
    AblationResult,
    AblationSettings,
    matched_count,
)
from dynheads.ablation.jobs import cascade_jobs, cascade_work, result_record
from dynheads.ablation.strategies import ABLATION_STRATEGIES, MATCHINGS, counting_strategy
from dynheads.experiments.experiment import (
    Context,
    Experiment,
    GridPlan,
    Phase,
    Work,
    grid_manifest,
    grid_plan,
    run_experiment,
)
from dynheads.heads import Head, check_heads, parse_head
from dynheads.models import LoadedModel
from dynheads.resources import STATIC_HEADS, needs_of
from dynheads.runs import RunDir, RunOptions, RunView
from dynheads.seeding import derive_seed
from dynheads.settings import AblationConfig, ProgressiveConfig
from dynheads.tasks.registry import Task
from dynheads.views.ablation_tables import grid_tables, progressive_tables


# ---- the grid (Figure 2) -------------------------------------------------------------------------------------------
def _ablation_plan(config: AblationConfig, lm: LoadedModel) -> GridPlan:
    """The grid, the static list when a strategy reads it, and ``--heads`` checked against the model."""
    check_heads([parse_head(text) for text in config.heads], lm.num_layers, lm.num_heads, source="--heads")
    needs = needs_of(ABLATION_STRATEGIES.get(strategy) for strategy in config.run_strategies())
    return grid_plan(config, lm, needs, "this ablation run", fits_threshold=True)


def _ablation_work(context: Context[AblationConfig, GridPlan]) -> Work:
    """A sample's strategies in one call (one prefill), phase by phase: under mean matching the controls after the
    dynamic run, whose head counts they read (``_phases``)."""
    config, samples = context.config, context.plan.samples
    strategies, static = config.run_strategies(), context.sources.static_ranking
    fixed = tuple(parse_head(text) for text in config.heads)
    counts: dict[str, int | None] = {}  # matching="mean": per sample, heads per step from its dynamic run

    def settings(sample, strategy: str) -> AblationSettings:
        mean_count = MATCHINGS.get(config.matching).given_count and ABLATION_STRATEGIES.get(strategy).matched
        return AblationSettings(
            strategy=strategy,
            mode=config.ablation_mode(),
            static_ranking=static,
            fixed_heads=fixed,
            matching=config.matching,
            count=counts[sample.sample_id] if mean_count else None,
            seed=derive_seed(config.seed, "random-heads", sample.seed),
            score=config.score_kind(),
            threshold=context.plan.threshold(config.threshold),
            contrast=config.contrast,
        )

    def read_counts(records: list[dict]) -> None:  # this process's samples: it decodes them under every strategy
        counting = counting_strategy()
        counts.update({r["grid_sample_id"]: r["matched_count"] for r in records if r["strategy"] == counting})

    work = cascade_work(context.lm, config.task_entry(), config.max_new_tokens, context.batch_size, _ablation_record)
    phases = [
        Phase(
            cascade_jobs([(f"{s.sample_id}-{arm}", s, partial(settings, s, arm)) for s in samples for arm in phase]),
            work,
            f"ablate {', '.join(phase)}",
            then=read_counts,
        )
        for phase in _phases(strategies, config.matching)  # a sample's strategies share its prefill
    ]
    return Work(grid_manifest(context, {"strategies_run": list(strategies)}), phases)


ABLATION = Experiment(
    "ablation", _ablation_plan, _ablation_work, tables=lambda context: grid_tables(RunView.of(context.run))
)


def run_ablation(config: AblationConfig, out: str | Path, **options: Unpack[RunOptions]) -> RunDir:
    """Decode every grid sample with every strategy into ``out`` (resumable); write cells.csv, summary.md, plots.
    The matched grid: ``fractions`` are read by the dose-response (``experiments.dose``), not here.

    ``batch_size`` (sample, strategy) records are decoded together (``ablated_generate_batch``; 1 = the
    reference path, results equal up to fp32 rounding).
    """
    return run_experiment(ABLATION, config, out, **options)


def _phases(strategies: Sequence[str], matching: str) -> list[list[str]]:
    """The strategies in the order they can run: all at once, or, under a matching that reads the dynamic run's
    count, the strategies that need it after the others (the dynamic run among them)."""
    given = MATCHINGS.get(matching).given_count
    later = [s for s in strategies if given and ABLATION_STRATEGIES.get(s).matched]
    first = [s for s in strategies if s not in later]
    return [phase for phase in (first, later) if phase]


def _ablation_record(sample, settings: AblationSettings, result: AblationResult, task: Task) -> dict:
    """One (sample, strategy) record. ``matched_count``: under mean matching the static/random count (in the
    dynamic record: the value its siblings use); None under per-step matching, where ``masked_counts`` says it."""
    count = None
    if MATCHINGS.get(settings.matching).given_count:
        counting = ABLATION_STRATEGIES.get(settings.strategy).counts
        count = matched_count(result.dynamic_counts) if counting else settings.count
    return {
        **result_record(sample, result, task),
        "strategy": settings.strategy,
        "matching": settings.matching,
        "matched_count": count,
    }


# ---- progressive ablation (Figure 3) -------------------------------------------------------------------------------
def _progressive_work(context: Context[ProgressiveConfig, GridPlan]) -> Work:
    config = context.config
    top, ks = context.sources.static_ranking[: config.top_static], tuple(sorted(set(config.ks)))

    def settings(k: int) -> AblationSettings:
        return AblationSettings(
            strategy="dynamic",
            mode=config.ablation_mode(),
            max_dynamic=k,
            score=config.score_kind(),
            threshold=context.plan.threshold(config.threshold),
        )

    phase = Phase(
        cascade_jobs(
            [(f"{sample.sample_id}-k{k}", sample, partial(settings, k)) for sample in context.plan.samples for k in ks]
        ),
        cascade_work(
            context.lm,
            config.task_entry(),
            config.max_new_tokens,
            context.batch_size,
            partial(_progressive_record, top=top),
        ),
        "progressive",
    )
    return Work(grid_manifest(context, {}, config.top_static), [phase])


PROGRESSIVE = Experiment(
    "ablation-progressive",
    lambda config, lm: grid_plan(config, lm, {STATIC_HEADS}, "this ablation-progressive run", fits_threshold=True),
    _progressive_work,
    tables=lambda context: progressive_tables(RunView.of(context.run)),
)


def run_progressive(config: ProgressiveConfig, out: str | Path, **options: Unpack[RunOptions]) -> RunDir:
    """Mask the first k dynamic heads of every step, for every k and sample; write progressive.csv and the plot.
    ``batch_size``: (sample, k) records decoded together, as in ``run_ablation``."""
    return run_experiment(PROGRESSIVE, config, out, **options)


def _progressive_record(
    sample, settings: AblationSettings, result: AblationResult, task: Task, *, top: tuple[Head, ...]
) -> dict:
    counts = [len(compensated) for compensated in result.compensated]
    overlap = [len(set(compensated) & set(top)) for compensated in result.compensated]
    return {
        **result_record(sample, result, task),
        "k": settings.max_dynamic,
        "compensated_counts": counts,
        "max_compensated": max(counts, default=0),
        "static_overlap": overlap,
        "max_static_overlap": max(overlap, default=0),
    }
