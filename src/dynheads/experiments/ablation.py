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
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Unpack

import pandas as pd

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
from dynheads.outputs import Outputs, Written, write_outputs
from dynheads.paper import PAPER_GRID, PAPER_MODEL, PAPER_PROGRESSIVE
from dynheads.plots.ablation import plot_ablation_cells, plot_progressive
from dynheads.resources import STATIC_HEADS, needs_of
from dynheads.runs import RESULTS_FILE, RunDir, RunOptions, RunView
from dynheads.seeding import derive_seed
from dynheads.settings import AblationConfig, ProgressiveConfig
from dynheads.tables import Summary, frame_table
from dynheads.tasks.registry import Task, grid_task


# ---- the grid (Figure 2) -------------------------------------------------------------------------------------------
def _ablation_plan(config: AblationConfig, lm: LoadedModel) -> GridPlan:
    """The grid, the static list when a strategy reads it, and ``--heads`` checked against the model."""
    check_heads([parse_head(text) for text in config.heads], lm.num_layers, lm.num_heads, source="--heads")
    needs = needs_of(ABLATION_STRATEGIES.get(strategy) for strategy in config.run_strategies())
    return grid_plan(config, lm, needs, "this ablation run")


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
            score=config.task_entry().score_kind,
            threshold=config.threshold,
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


def grid_tables(view: RunView) -> Outputs:
    """results.csv, cells.csv, summary.md and the heat maps of a grid run, from its records."""
    frame, manifest = view.results(), view.manifest
    outputs = Outputs().add(RESULTS_FILE, frame.copy())
    task = grid_task(manifest)
    matching = manifest["config"].get("matching", "mean")  # runs made before the option existed used the mean count
    frame["strategy"] = frame["strategy"].astype(pd.CategoricalDtype(ABLATION_STRATEGIES.names(), ordered=True))
    # a sample that masked no head at any step is the un-ablated run: counted apart, never read as "unharmed"
    frame["zero_masked"] = frame["masked_counts"].map(lambda counts: int(sum(counts) == 0))
    cells = _grid_cells(frame, task, manifest)
    cells["matching"] = matching
    title = f"{manifest['model']['name']}: per-step ablation ({task.label}, {matching} matching)"
    heat_maps = partial(plot_ablation_cells, cells, title=title, metrics=task.metrics, opacity=task.fade_sparse_cells)
    return (
        outputs.add("cells.csv", cells)
        .add("summary.md", _ablation_summary(view, frame, cells, task, matching))
        .add("plots", Written(heat_maps))
    )


def write_cells(run: RunDir) -> pd.DataFrame:
    """``grid_tables`` written into the run's folder; returns cells.csv's frame."""
    outputs = grid_tables(RunView.of(run))
    write_outputs(run.path, outputs)
    return outputs.files["cells.csv"]


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


def _ablation_summary(view: RunView, frame: pd.DataFrame, cells: pd.DataFrame, task: Task, matching: str) -> Summary:
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
    return Summary(
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
            *skip_line(view.manifest),
        ],
        {
            "matching": matching,
            "records": int(summary["records"].sum()),
            "per_sample": {metric: per_sample_metric(view.records, metric) for metric in metrics},
            "masking": masking_numbers(cells),
        },
        f"Per-step ablation: {view.manifest['model']['name']}",
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
    top, ks = context.sources.static_ranking[: config.top_static], tuple(sorted(set(config.ks)))

    def settings(k: int) -> AblationSettings:
        return AblationSettings(
            strategy="dynamic",
            mode=config.ablation_mode(),
            max_dynamic=k,
            score=config.task_entry().score_kind,
            threshold=config.threshold,
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
    lambda config, lm: grid_plan(config, lm, {STATIC_HEADS}, "this ablation-progressive run"),
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


def progressive_tables(view: RunView) -> Outputs:
    """results.csv, progressive.csv (per k: samples, mean m_s, mean max_t |E_t|, metrics), summary.md and
    plots/progressive.png."""
    frame, manifest = view.results(), view.manifest
    outputs = Outputs().add(RESULTS_FILE, frame.copy())
    metrics = grid_task(manifest).metrics
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
    model, top = manifest["model"]["name"], len(manifest["static_top"])
    outputs.add("progressive.csv", table)
    outputs.add(
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
    title = f"{model}: progressive ablation"
    figure = Written(partial(plot_progressive, table, top_static=top, title=title, metrics=metrics))
    return outputs.add("plots/progressive.png", figure)


# ---- shared ----------------------------------------------------------------------------------------------------------
def _paper_line(task: Task) -> list[str]:
    """What the paper reports for this grid (its Figure 2 or 6), or nothing for a task the paper does not have."""
    paper = PAPER_GRID.get(task.paper_name)
    return [f"Paper ({PAPER_MODEL}): {paper}."] if paper else []
