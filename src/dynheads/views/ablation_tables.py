"""The tables of the two grids of ``experiments.ablation`` (the matched grid, progressive ablation), from their
records: results.csv, cells.csv or progressive.csv, summary.md with the per-sample numbers Claim 2 reads, and the
heat maps."""

from __future__ import annotations

import math
from functools import partial

import pandas as pd

from dynheads.ablation.strategies import ABLATION_STRATEGIES, MATCHINGS
from dynheads.outputs import Outputs, Written, write_outputs
from dynheads.paper import PAPER_GRID, PAPER_MODEL, PAPER_PROGRESSIVE
from dynheads.plots.ablation import plot_ablation_cells, plot_progressive
from dynheads.runs import RESULTS_FILE, RunDir, RunView
from dynheads.tables import Summary, frame_table
from dynheads.tasks.registry import Task, grid_task
from dynheads.views.threshold_fit import fit_lines


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
            *fit_lines(view.manifest),
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
                *fit_lines(manifest),
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
