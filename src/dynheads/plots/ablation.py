"""Figure 2 (heat maps of a metric per ablation strategy), Figure 3 (progressive ablation, two y-axes) and the
dose-response of every arm (Figure 3's curve, one line per arm with intervals)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from dynheads.ablation.strategies import ABLATION_STRATEGIES, panel_order
from dynheads.errors import DynheadsError
from dynheads.plots.png import save_png

METRIC_LABELS = {"accuracy": "accuracy", "rouge_l": "ROUGE-L"}
_CMAP = matplotlib.colormaps["RdYlGn"].with_extremes(bad="white")  # red = fails, green = retrieves


def heatmap_figure(
    panels: Mapping[str, pd.DataFrame],
    *,
    label: str,
    counts: Mapping[str, pd.DataFrame] | None = None,
    title: str | None = None,
    realised: Mapping[float, float] | None = None,
) -> Figure:
    """Heat maps side by side on one colour scale, 0..1: x = context length, y = depth, each cell annotated.

    ``panels`` maps a panel title to a table of values (index = depth in 0..1, columns = context length).
    ``counts`` (same titles and shape) gives the valid samples of each cell: a cell's opacity is its count over
    the largest count, and cells with none stay blank. NaN values are blank too. ``realised``: asked depth ->
    mean depth where the gold facts landed; the depth axis then shows both.
    """
    if not panels:
        raise DynheadsError("nothing to plot: no heat-map panels given")
    first = next(iter(panels.values()))
    depths, lengths = list(first.index), list(first.columns)
    largest = max(float(np.nanmax(c.to_numpy(dtype=float))) for c in counts.values()) if counts else 1.0
    widths = [max(0.8 + 0.8 * len(lengths), _title_width(name)) for name in panels]
    figure = Figure(figsize=(1.0 + sum(widths), 1.6 + 0.5 * len(depths)), layout="constrained")
    axes = figure.subplots(1, len(panels), sharey=True, squeeze=False, width_ratios=widths)[0]
    for ax, (name, table) in zip(axes, panels.items(), strict=True):
        values = table.reindex(index=depths, columns=lengths).to_numpy(dtype=float)
        alpha = np.ones_like(values)
        if counts:
            alpha = np.nan_to_num(counts[name].reindex(index=depths, columns=lengths).to_numpy(dtype=float)) / largest
            values = np.where(alpha > 0, values, np.nan)
        image = ax.imshow(values, cmap=_CMAP, vmin=0.0, vmax=1.0, alpha=alpha, aspect="auto", interpolation="nearest")
        for (row, column), value in np.ndenumerate(values):
            if not np.isnan(value):
                ax.text(
                    column,
                    row,
                    f"{value:.2f}",
                    ha="center",
                    va="center",
                    fontsize=10,
                    color=_text_colour(value, alpha[row, column]),
                )
        ax.set_title(name, fontsize=11)
        ax.set_xticks(range(len(lengths)), [str(length) for length in lengths], fontsize=9)
        ax.set_yticks(
            range(len(depths)),
            [
                f"{depth:.0%}" + (f" (at {realised[depth]:.0%})" if realised and depth in realised else "")
                for depth in depths
            ],
            fontsize=9,
        )
    # one x label under all the panels: a label per panel runs into its neighbours' under narrow panels
    figure.supxlabel("context length (tokens)", fontsize=10)
    axes[0].set_ylabel("needle depth (asked, at = realised mean)" if realised else "needle depth", fontsize=10)
    figure.colorbar(image, ax=list(axes), label=label, fraction=0.03, pad=0.02)
    if title:
        figure.suptitle(title, fontsize=12)
    return figure


def _title_width(title: str, fontsize: float = 11) -> float:
    """Inches a panel needs so that its title's longest line (about 0.6 em a character) fits above it."""
    longest = max(len(line) for line in title.splitlines()) if title else 0
    return 0.6 * fontsize / 72 * longest + 0.3


def plot_heatmaps(
    panels: Mapping[str, pd.DataFrame],
    path: str | Path,
    *,
    label: str,
    counts: Mapping[str, pd.DataFrame] | None = None,
    title: str | None = None,
    realised: Mapping[float, float] | None = None,
) -> Path:
    """Write ``heatmap_figure`` as a PNG at ``path`` (atomically)."""
    return save_png(heatmap_figure(panels, label=label, counts=counts, title=title, realised=realised), path)


def plot_ablation_cells(
    cells: pd.DataFrame,
    out_dir: str | Path,
    *,
    title: str | None = None,
    metrics: Mapping[str, str] = METRIC_LABELS,
    opacity: bool = False,
) -> list[Path]:
    """Figure 2 from ``cells.csv`` (strategy, length, depth, samples and the ``metrics`` columns): one
    ``ablation-<metric>.png`` per metric. ``opacity``: cells fade with fewer samples (the HotpotQA figures)."""
    # every strategy of the cells gets a panel, its title from its registry entry (the baseline last)
    present = set(cells["strategy"])
    strategies = [s for s in panel_order() if s in present] + sorted(present - set(ABLATION_STRATEGIES.names()))
    titles = {
        s: ABLATION_STRATEGIES.get(s).title if s in ABLATION_STRATEGIES else f"{s} heads masked" for s in strategies
    }

    def pivot(strategy: str, column: str) -> pd.DataFrame:
        return cells[cells["strategy"] == strategy].pivot(index="depth", columns="length", values=column)

    counts = {titles[s]: pivot(s, "samples") for s in strategies} if opacity else None
    realised = (
        cells.dropna(subset=["depth_realised"]).groupby("depth")["depth_realised"].mean().to_dict()
        if "depth_realised" in cells
        else None
    )
    paths = []
    for metric, label in metrics.items():
        panels = {titles[s]: pivot(s, metric) for s in strategies}
        paths.append(
            plot_heatmaps(
                panels,
                Path(out_dir) / f"ablation-{metric}.png",
                label=label,
                counts=counts,
                title=f"{title} ({label})" if title else None,
                realised=realised,
            )
        )
    return paths


def progressive_figure(
    table: pd.DataFrame, *, top_static: int = 20, title: str | None = None, metrics: Mapping[str, str] = METRIC_LABELS
) -> Figure:
    """Figure 3: overlap of the compensating heads with the static top heads (left axis, blue) and the task
    metrics (right axis, red) against k, from ``progressive.csv`` (k, static_overlap, accuracy, rouge_l)."""
    if table.empty:
        raise DynheadsError("nothing to plot: the progressive table has no rows")
    figure = Figure(figsize=(6.0, 4.0), layout="constrained")
    left = figure.add_subplot()
    right = left.twinx()
    left.plot(
        table["k"],
        table["static_overlap"],
        color="#1d3f8f",
        marker="o",
        markersize=7,
        label=f"overlap with static top-{top_static} (mean $m_s$)",
    )
    for (metric, label), marker, style in zip(metrics.items(), "s^", ("-", "--"), strict=False):
        right.plot(table["k"], table[metric], color="#c0392b", marker=marker, linestyle=style, label=label)
    left.set_xlabel("k (dynamic heads masked per step)")
    left.set_ylabel(f"compensating heads in static top-{top_static}", color="#1d3f8f")
    right.set_ylabel(" / ".join(metrics.values()), color="#c0392b")
    left.set_xticks(list(table["k"]))
    left.set_ylim(0, max(1.0, 1.2 * float(table["static_overlap"].max())))
    right.set_ylim(0, 1.05)
    left.grid(alpha=0.3)
    left.set_zorder(right.get_zorder() + 1)  # the overlap line stays visible where the lines meet (e.g. at 0)
    left.patch.set_visible(False)
    handles = left.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
    left.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.18), ncols=3, frameon=False, fontsize=8)
    if title:
        left.set_title(title, fontsize=11)
    return figure


def plot_progressive(
    table: pd.DataFrame,
    path: str | Path,
    *,
    top_static: int = 20,
    title: str | None = None,
    metrics: Mapping[str, str] = METRIC_LABELS,
) -> Path:
    """Write ``progressive_figure`` as a PNG at ``path`` (atomically)."""
    return save_png(progressive_figure(table, top_static=top_static, title=title, metrics=metrics), path)


def dose_figure(table: pd.DataFrame, panels: Mapping[str, str], *, title: str | None = None) -> Figure:
    """The dose-response: one panel per metric of ``panels`` (name -> axis label), x = the fraction f of each step's
    |D_t| every arm masks (ceil(f |D_t|) heads at step t), one line per arm with its 95 % interval shaded, from the
    rows of ``dose.csv`` (metric, arm, fraction, mean, low, high; an arm ``none``, when present, is drawn as a flat
    reference line)."""
    rows = table[table["metric"].isin(list(panels))]
    if rows.empty:
        raise DynheadsError("nothing to plot: the dose table has no rows for " + ", ".join(panels))
    figure = Figure(figsize=(5.2 * len(panels), 4.0), layout="constrained")
    axes = figure.subplots(1, len(panels), squeeze=False)[0]
    for axis, (metric, label) in zip(axes, panels.items(), strict=True):
        for arm, curve in rows[rows["metric"] == metric].groupby("arm", sort=False):
            curve = curve.sort_values("fraction")
            if arm == "none":
                axis.axhline(float(curve["mean"].iloc[0]), color="black", linestyle=":", label="no masking")
                continue
            title_of = ABLATION_STRATEGIES.get(str(arm)).title if arm in ABLATION_STRATEGIES else str(arm)
            line = axis.plot(curve["fraction"], curve["mean"], marker="o", label=title_of)[0]
            axis.fill_between(curve["fraction"], curve["low"], curve["high"], color=line.get_color(), alpha=0.18)
        axis.set_xlabel("fraction f of each step's |D_t| (ceil(f |D_t|) heads masked)")
        axis.set_ylabel(label)
        axis.set_xticks(sorted(rows[rows["arm"] != "none"]["fraction"].unique()))
        axis.grid(alpha=0.3)
    axes[0].legend(fontsize=8, frameon=False)
    if title:
        figure.suptitle(title, fontsize=11)
    return figure


def plot_doses(table: pd.DataFrame, path: str | Path, panels: Mapping[str, str], *, title: str | None = None) -> Path:
    """Write ``dose_figure`` as a PNG at ``path`` (atomically)."""
    return save_png(dose_figure(table, panels, title=title), path)


def _text_colour(value: float, alpha: float) -> str:
    """Black or white, whichever reads better on the cell's colour blended with the white background."""
    red, green, blue, _ = _CMAP(value)
    blend = [alpha * channel + (1.0 - alpha) for channel in (red, green, blue)]
    return "white" if 0.299 * blend[0] + 0.587 * blend[1] + 0.114 * blend[2] < 0.5 else "black"
