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

import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, Unpack, cast

import numpy as np
import pandas as pd

from dynheads.ablation.cascade import (
    AblationResult,
    AblationSettings,
    ablated_generate_batch,
    matched_count,
)
from dynheads.ablation.strategies import ABLATION_STRATEGIES, MATCHINGS
from dynheads.config import pieces_of
from dynheads.engine.probe import ABLATION_MODES, AblationMode
from dynheads.errors import DynheadsError
from dynheads.experiments.experiment import (
    Context,
    Experiment,
    GridPlan,
    Phase,
    Work,
    grid_evaluated,
    grid_plan,
    run_experiment,
)
from dynheads.experiments.niah import NiahConfig
from dynheads.experiments.settings import (
    DOSE_METRICS,
    AblationFields,
    AblationGrid,
    ModelSettings,
    NiahGrid,
    ProgressiveFields,
    TaskGridChoice,
)
from dynheads.heads import Head, check_heads, head_key, parse_head
from dynheads.io import atomic_path
from dynheads.models import LoadedModel
from dynheads.paper import PAPER_GRID, PAPER_MODEL, PAPER_PROGRESSIVE
from dynheads.plots.ablation import plot_ablation_cells, plot_progressive
from dynheads.resources import STATIC_HEADS, Evaluated, needs_of
from dynheads.runs import Finished, Job, RunDir, RunOptions
from dynheads.seeding import derive_seed
from dynheads.tables import Summary, frame_table, write_summary
from dynheads.tasks.niah import NIAH
from dynheads.tasks.registry import Task, task_of
from dynheads.thresholds import ReasoningThreshold


class _GridConfig(AblationGrid, TaskGridChoice):
    """Settings shared by both experiments (``settings.AblationGrid``) and what they derive from them."""

    def niah_config(self) -> NiahConfig:
        """The NIAH grid whose samples are ablated (the ``analysis`` seed stream, as ``dynheads niah``)."""
        return NiahConfig(**pieces_of(self, NiahGrid, ModelSettings))

    def ablation_mode(self) -> AblationMode:
        """``mode``, which ``check`` accepts only from ``probe.ABLATION_MODES``."""
        return cast(AblationMode, self.mode)

    def check(self) -> None:
        if self.mode not in ABLATION_MODES:
            raise DynheadsError(f"unknown masking mode {self.mode!r}: use one of {', '.join(ABLATION_MODES)}")
        self.check_task()
        ReasoningThreshold.parse(self.threshold)  # a bad threshold fails before any work


@dataclass(frozen=True)
class AblationConfig(AblationFields, _GridConfig):
    def run_strategies(self) -> tuple[str, ...]:
        """The strategies to decode, in run order: none, dynamic (needed by static and random), the rest."""
        baselines = {entry.name for entry in ABLATION_STRATEGIES if entry.value.baseline}
        choices = ", ".join(name for name in ABLATION_STRATEGIES.names() if name not in baselines)
        unknown = [s for s in self.strategies if s not in ABLATION_STRATEGIES]
        if unknown:
            raise DynheadsError(f"unknown ablation strategy {', '.join(map(repr, unknown))}: use some of {choices}")
        if not self.strategies:
            raise DynheadsError(f"give at least one ablation strategy: {choices}")
        # mean-matched controls read their head count from the dynamic run
        controls = [s for s in self.strategies if ABLATION_STRATEGIES.get(s).matched]
        given = MATCHINGS.get(self.matching).given_count
        wanted = {*baselines, *self.strategies} | ({"dynamic"} if controls and given else set())
        return tuple(s for s in ABLATION_STRATEGIES.names() if s in wanted)

    def check(self) -> None:
        super().check()
        self.check_doses()
        if self.metric not in DOSE_METRICS:
            raise DynheadsError(f"unknown dose-response metric {self.metric!r}: use one of {', '.join(DOSE_METRICS)}")
        MATCHINGS.check([self.matching])
        strategies = [ABLATION_STRATEGIES.entry(s) for s in self.run_strategies()]
        for entry in strategies:
            if entry.value.needs_static and not self.static:
                raise DynheadsError(f"the {entry.name} strategy needs a static head list: pass --static FILE")
        given = [entry.name for entry in strategies if entry.value.needs_heads]
        if bool(given) != bool(self.heads):
            readers = given or [entry.name for entry in ABLATION_STRATEGIES if entry.value.needs_heads]
            raise DynheadsError(f"the {' / '.join(readers)} strategy and --heads go together: give both or neither")

    def check_doses(self) -> None:
        """Fractions in (0, 1] with 1 among them (the operating point), compensation above 1, no fixed doses."""
        if self.doses:
            raise DynheadsError(
                f"fixed doses (doses = {list(self.doses)}) are retired: past |D_t| the dynamic arm masks D_t plus "
                "inert heads while static masks D_t's backups, so k measures compensation; give fractions of each "
                "step's |D_t| (fractions = [0.25, 0.5, 0.75, 1.0], compensation = [1.5, 2.0]; docs/ablation.md)"
            )
        if self.fractions and not all(0 < f <= 1 for f in self.fractions):
            raise DynheadsError(f"dose fractions lie in (0, 1] (--fractions), got {list(self.fractions)}")
        if self.fractions and 1.0 not in self.fractions:
            raise DynheadsError(
                f"the fractions must hold 1 (mask exactly D_t: Claim 2's operating point), got {list(self.fractions)}"
            )
        if not all(f > 1 for f in self.compensation):
            raise DynheadsError(f"compensation fractions lie above 1 (--compensation), got {list(self.compensation)}")

    def dose_fractions(self) -> tuple[float, ...]:
        """Every fraction the dose-response runs, ascending: the doses, then the compensation part."""
        return tuple(sorted({float(f) for f in (*self.fractions, *self.compensation)}))


@dataclass(frozen=True)
class ProgressiveConfig(ProgressiveFields, _GridConfig):
    def check(self) -> None:
        super().check()
        if not self.ks or min(self.ks) < 0:
            raise DynheadsError(f"give one or more k >= 0 (--ks), got {list(self.ks)}")
        if not self.static:
            raise DynheadsError("progressive ablation compares with the static top heads: pass --static FILE")
        if self.top_static < 1:
            raise DynheadsError(f"top_static must be at least 1, got {self.top_static}")


# ---- the grid (Figure 2) -------------------------------------------------------------------------------------------
def _ablation_plan(config: AblationConfig, lm: LoadedModel) -> GridPlan:
    """The grid, the static list when a strategy reads it, and ``--heads`` checked against the model."""
    check_heads([parse_head(text) for text in config.heads], lm.num_layers, lm.num_heads, source="--heads")
    needs = needs_of(ABLATION_STRATEGIES.get(strategy) for strategy in config.run_strategies())
    return ablation_plan(config, lm, needs, "ablation")


def _ablation_work(context: Context[AblationConfig, GridPlan]) -> Work:
    """A sample's strategies in one call (one prefill), phase by phase: under mean matching the controls after the
    dynamic run, whose head counts they read (``_phases``)."""
    config, samples = context.config, context.plan.samples
    strategies, static = config.run_strategies(), ranking_of(context)
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
            score=config.task_entry().score_kind,
            threshold=config.threshold,
        )

    def read_counts(records: list[dict]) -> None:  # this process's samples: it decodes them under every strategy
        counts.update({r["grid_sample_id"]: r["matched_count"] for r in records if r["strategy"] == "dynamic"})

    phases = [
        ablation_phase(
            context,
            [(f"{s.sample_id}-{strategy}", s, partial(settings, s, strategy)) for s in samples for strategy in phase],
            _ablation_record,
            f"ablate {', '.join(phase)}",
            then=read_counts,
        )
        for phase in _phases(strategies, config.matching)  # a sample's strategies share its prefill
    ]
    return Work(grid_manifest(context, {"strategies_run": list(strategies)}), phases)


ABLATION = Experiment("ablation", _ablation_plan, _ablation_work, tables=lambda context: write_cells(context.run))


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
        count = matched_count(result.dynamic_counts) if settings.strategy == "dynamic" else settings.count
    return {
        **result_record(sample, result, task),
        "strategy": settings.strategy,
        "matching": settings.matching,
        "matched_count": count,
    }


def write_cells(run: RunDir) -> pd.DataFrame:
    """cells.csv, summary.md and the heat maps of a grid run, from its records."""
    frame = run.write_results()
    config = run.manifest()["config"]
    task = run_task_of(run)
    matching = config.get("matching", "mean")  # runs made before the option existed used the mean count
    frame["strategy"] = frame["strategy"].astype(pd.CategoricalDtype(ABLATION_STRATEGIES.names(), ordered=True))
    # a sample that masked no head at any step is the un-ablated run: counted apart, never read as "unharmed"
    frame["zero_masked"] = frame["masked_counts"].map(lambda counts: int(sum(counts) == 0))
    cells = _grid_cells(frame, task, run.manifest())
    cells["matching"] = matching
    with atomic_path(run.path / "cells.csv") as tmp:
        cells.to_csv(tmp, index=False)
    _write_ablation_summary(run, frame, cells, task, matching)
    plot_ablation_cells(
        cells,
        run.path / "plots",
        title=f"{run.manifest()['model']['name']}: per-step ablation ({task.label}, {matching} matching)",
        metrics=task.metrics,
        opacity=task.fade_sparse_cells,
    )
    return cells


def _grid_cells(frame: pd.DataFrame, task: Task, manifest: dict) -> pd.DataFrame:
    """Per (strategy, length, depth): each metric's mean, samples, heads masked per step, samples that masked
    none, and the cell's skipped samples."""
    means = {name: (f"metrics.{name}", "mean") for name in task.metrics}
    keys = ["strategy", "context_tokens", "depth"]
    # where a task records where its gold facts landed (meta.depth_realised), the cells keep their mean: the
    # heat maps label each asked depth with it
    realised = {"depth_realised": ("meta.depth_realised", "mean")} if "meta.depth_realised" in frame else {}
    cells = (
        frame.groupby(keys, observed=True)
        .agg(
            **means,
            samples=("sample_id", "size"),
            mean_masked=("mean_masked", "mean"),
            zero_masked=("zero_masked", "sum"),
            **realised,
        )
        .reset_index()
        .rename(columns={"context_tokens": "length"})
    )
    # samples traced as written (the custom task, --no-pad) lie off the configured lengths x depths: their own cells
    on_grid = task.check_data is None and manifest["config"].get("pad", True)
    return _with_skipped_cells(cells, manifest) if on_grid else cells.assign(skipped=0)


def _write_ablation_summary(run: RunDir, frame: pd.DataFrame, cells: pd.DataFrame, task: Task, matching: str) -> None:
    """summary.md: per strategy the means over all its records, and the per-sample metrics Claim 2 reads."""
    metrics = task.metrics
    summary = (
        frame.groupby("strategy", observed=True)
        .agg(
            records=("sample_id", "size"),
            **{name: (f"metrics.{name}", "mean") for name in metrics},
            mean_dynamic=("mean_dynamic", "mean"),
            masked_per_step=("mean_masked", "mean"),
            zero_masked=("zero_masked", "sum"),
        )
        .reset_index()
    )
    rule = MATCHINGS.help(matching)
    write_summary(
        run.path,
        "summary.md",
        Summary(
            [
                "Means over all records of each strategy. mean |D_t| = dynamic heads of the clean pass per step; "
                f"masked = heads removed per step (static and random, matching `{matching}`: {rule}); "
                f"no head = samples "
                "that masked no head at any step (their run is the un-ablated one).",
                frame_table(
                    summary,
                    {
                        "strategy": "strategy",
                        "records": "records",
                        **metrics,
                        "mean_dynamic": "mean |D_t|",
                        "masked_per_step": "masked",
                        "zero_masked": "no head",
                    },
                ),
                *_paper_line(task),
                *skip_line(run.manifest()),
            ],
            {
                "matching": matching,
                "records": int(summary["records"].sum()),
                "per_sample": {metric: per_sample_metric(run.records(), metric) for metric in metrics},
                "masking": masking_numbers(cells),
            },
            f"Per-step ablation: {run.manifest()['model']['name']}",
        ),
    )


def per_sample_metric(records: list[dict], metric: str) -> dict[str, list[float]]:
    """Claim 2's input: ``{strategy: [value per sample]}`` of ``metric`` over the samples every strategy has, in
    one sample order (a sample's value under each strategy sits at the same index)."""
    frame = pd.DataFrame(
        [
            {
                "sample": record.get("grid_sample_id", record["sample_id"]),
                "strategy": record["strategy"],
                "value": record["metrics"].get(metric, math.nan),
            }
            for record in records
        ]
    )
    if frame.empty:
        return {}
    table = frame.pivot_table(index="sample", columns="strategy", values="value", aggfunc="mean").dropna()
    return {str(strategy): [float(value) for value in table[strategy]] for strategy in table.columns}


def masking_numbers(cells: pd.DataFrame) -> dict:
    """What the grid masked, from its cells: the matching mode and, per strategy, the heads masked per step (mean
    over samples), the samples that masked no head at any step and the samples (Claim 2 reads them)."""
    cells = cells.assign(strategy=cells["strategy"].astype(str), masked_sum=cells["mean_masked"] * cells["samples"])
    groups = cells.groupby("strategy")
    samples = groups["samples"].sum()
    return {
        "matching": str(cells["matching"].iloc[0]),
        "masked": (groups["masked_sum"].sum() / samples).astype(float).to_dict(),
        "zero_masked": groups["zero_masked"].sum().astype(int).to_dict(),
        "samples": samples.astype(int).to_dict(),
    }


def _with_skipped_cells(cells: pd.DataFrame, manifest: dict) -> pd.DataFrame:
    """Every cell of the configured grid, for every strategy: cells whose questions were all skipped get
    samples 0 (blank in the heat maps: no valid sample), and ``skipped`` counts the skipped pairs per cell."""
    config = manifest["config"]
    skipped = manifest.get("skipped", {}).get("by_cell", {})
    grid = pd.MultiIndex.from_product(
        [cells["strategy"].unique(), config["lengths"], config["depths"]], names=["strategy", "length", "depth"]
    )
    full = cells.set_index(["strategy", "length", "depth"]).reindex(grid).reset_index()
    full["samples"] = full["samples"].fillna(0).astype(int)
    full["skipped"] = [
        skipped.get(f"{length}/{depth:g}", 0) for length, depth in zip(full["length"], full["depth"], strict=True)
    ]
    return full


def skip_line(manifest: dict) -> list[str]:
    """The summary's line on skipped (question, cell) pairs; none when nothing was skipped."""
    skipped = manifest.get("skipped", {})
    if not skipped.get("count"):
        return []
    reasons = "; ".join(f"{count} {reason}" for reason, count in skipped["by_reason"].items())
    return [
        f"Skipped (question, cell) pairs: {skipped['count']} ({reasons}); cells without a valid sample are "
        "blank in the heat maps, and cells.csv counts them in 'skipped'."
    ]


# ---- progressive ablation (Figure 3) -------------------------------------------------------------------------------
def _progressive_work(context: Context[ProgressiveConfig, GridPlan]) -> Work:
    config = context.config
    top, ks = ranking_of(context)[: config.top_static], tuple(sorted(set(config.ks)))

    def settings(k: int) -> AblationSettings:
        return AblationSettings(
            strategy="dynamic",
            mode=config.ablation_mode(),
            max_dynamic=k,
            score=config.task_entry().score_kind,
            threshold=config.threshold,
        )

    phase = ablation_phase(
        context,
        [(f"{sample.sample_id}-k{k}", sample, partial(settings, k)) for sample in context.plan.samples for k in ks],
        partial(_progressive_record, top=top),
        "progressive",
    )
    return Work(grid_manifest(context, {}, config.top_static), [phase])


PROGRESSIVE = Experiment(
    "ablation-progressive",
    lambda config, lm: ablation_plan(config, lm, {STATIC_HEADS}, "ablation-progressive"),
    _progressive_work,
    tables=lambda context: write_progressive(context.run),
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


def write_progressive(run: RunDir) -> pd.DataFrame:
    """progressive.csv (per k: samples, mean m_s, mean max_t |E_t|, metrics), summary.md and plots/progressive.png."""
    frame = run.write_results()
    metrics = run_task_of(run).metrics
    table = (
        frame.groupby("k")
        .agg(
            samples=("sample_id", "size"),
            static_overlap=("max_static_overlap", "mean"),
            compensated=("max_compensated", "mean"),
            **{m: (f"metrics.{m}", "mean") for m in metrics},
            masked_per_step=("mean_masked", "mean"),
        )
        .reset_index()
    )
    with atomic_path(run.path / "progressive.csv") as tmp:
        table.to_csv(tmp, index=False)
    manifest = run.manifest()
    model, top = manifest["model"]["name"], len(manifest["static_top"])
    write_summary(
        run.path,
        "summary.md",
        Summary(
            [
                f"Per k: the first k dynamic heads of every step masked; overlap = mean over samples of "
                f"max_t |E_t ∩ static top-{top}|; compensated = the same with all of E_t; "
                f"masked = heads removed per step "
                "(fewer than k when D_t is smaller).",
                frame_table(
                    table,
                    {
                        "k": "k",
                        "samples": "samples",
                        "static_overlap": "overlap",
                        "compensated": "compensated",
                        **metrics,
                        "masked_per_step": "masked",
                    },
                ),
                f"Paper ({PAPER_MODEL}): {PAPER_PROGRESSIVE}.",
                *skip_line(manifest),
            ],
            {"static_top": top},
            f"Progressive ablation: {model}",
        ),
    )
    plot_progressive(
        table,
        run.path / "plots" / "progressive.png",
        top_static=top,
        title=f"{model}: progressive ablation",
        metrics=metrics,
    )
    return table


# ---- shared ----------------------------------------------------------------------------------------------------------
def ablation_phase(
    context: Context[Any, GridPlan],
    jobs: Sequence[tuple[str, Any, Callable[[], AblationSettings]]],  # (record id, a task's sample, ...)
    to_record: Callable[[object, AblationSettings, AblationResult, Task], dict],
    desc: str,
    then: Callable[[list[dict]], object] | None = None,
) -> Phase:
    """The phase that decodes ``jobs`` (record id, sample, its settings when it is decoded), saved as
    ``to_record(sample, settings, result, task)``, one record per (sample, strategy or k); its ``grid_sample_id``
    names the sample. ``jobs`` come sample by sample: a sample's jobs are one call that prefills its prompt once
    (``ablated_generate_batch``), ``batch_size`` samples per call, ``batch_size`` rows decoding together (1: each
    row alone, records identical to running each arm by itself)."""
    lm, config, rows = context.lm, context.config, context.batch_size
    task = config.task_entry()

    def work(batch: list[tuple[Any, Callable[[], AblationSettings]]]) -> list[Finished]:
        settings = [settings_of() for _, settings_of in batch]
        samples = [sample for sample, _ in batch]
        results = ablated_generate_batch(lm, samples, settings, config.max_new_tokens, rows_together=rows)
        return [
            Finished(to_record(sample, these, result, task))
            for (sample, _), these, result in zip(batch, settings, results, strict=True)
        ]

    per_sample = Counter(sample.sample_id for _, sample, _ in jobs)  # a sample's jobs: one call, one prefill
    return Phase(
        [Job(record_id, (sample, settings_of), group=sample.sample_id) for record_id, sample, settings_of in jobs],
        work,
        desc,
        together=max(per_sample.values(), default=1),
        then=then,
    )


def ablation_plan(config: _GridConfig, lm: LoadedModel, needs: set[str], kind: str) -> GridPlan:
    """The grid's samples, checked to fit the model, and the static list's scored heads when ``needs`` asks for
    it (``resources``: refused where it was fitted on the evaluated questions, samples or stream)."""

    def evaluated(task: Task, task_config, samples) -> Evaluated:
        return grid_evaluated(task, getattr(task_config, "split", None), samples, f"this {kind} run")

    return grid_plan(config, lm, needs, evaluated)


def ranking_of(context: Context) -> tuple[Head, ...]:
    """The static list's scored heads, best first (() without a list)."""
    return context.sources.static.ranking if context.sources.static else ()


def grid_manifest(context: Context[Any, GridPlan], extra: dict, top: int = 20) -> dict:
    """What an ablation run's manifest records: the prompt, ``extra``, the grid, the static list's ``top`` heads and
    what fitted it."""
    plan, samples = context.plan, context.plan.samples
    return {
        "prompt": plan.task.prompt(plan.task_config),
        "prompt_template": samples[0].prompt_template,
        "chat_template_kwargs": samples[0].chat_template_kwargs,
        **extra,
        **plan.grid.manifest(),
        "static_top": [head_key(h) for h in ranking_of(context)[:top]],
        "static_source": context.sources.manifest()[STATIC_HEADS],  # the list, and what fitted it
    }


def run_task_of(run: RunDir) -> Task:
    """The task of a finished ablation run (runs written before the option existed ablated NIAH)."""
    config = run.manifest()["config"]
    return task_of(config.get("task", NIAH.name), config.get("data"))


def _paper_line(task: Task) -> list[str]:
    """What the paper reports for this grid (its Figure 2 or 6), or nothing for a task the paper does not have."""
    paper = PAPER_GRID.get(task.paper_name)
    return [f"Paper ({PAPER_MODEL}): {paper}."] if paper else []


def result_record(sample, result: AblationResult, task: Task) -> dict:
    """What every record holds: the sample's settings, the generation, its metrics and the per-step counts."""
    masked = [len(heads) for heads in result.masked]
    metrics = task.score(sample, result.text)
    return {
        **sample.describe(),
        "grid_sample_id": sample.sample_id,
        "generated": result.text,
        "stop_reason": result.stop_reason,
        "steps": len(result.masked),
        "metrics": metrics,
        "dynamic_counts": result.dynamic_counts,
        "mean_dynamic": result.mean_dynamic,
        "masked_counts": masked,
        "mean_masked": float(np.mean(masked)) if masked else 0.0,
    }
