"""KV-retention figures: accuracy against the KV budget per policy, and the length x depth grid at one budget."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from dynheads.plots.ablation import _save, plot_heatmaps

# Distinct markers and dashes: policies with equal accuracy draw on top of each other.
_STYLE = {"probe": ("C0", "o", "-"), "static": ("C1", "s", "--"), "random": ("C2", "^", ":"),
          "oracle": ("C3", "v", "-."), "true": ("C4", "D", (0, (1, 3)))}


def plot_kv_accuracy(table: pd.DataFrame, path: str | Path, *, title: str | None = None) -> Path:
    """Left: accuracy vs budget (fraction of full-KV query heads) per policy, ``full`` and ``none`` as lines.
    Right: the KV actually kept (fraction of the unmodified model's) vs budget. ``table``: table.csv's columns."""
    figure = Figure(figsize=(10, 4), layout="constrained")
    accuracy_ax, kv_ax = figure.subplots(1, 2)
    budgets = sorted(set(table["budget"]) - {0.0, 1.0})
    for policy, (colour, marker, dashes) in _STYLE.items():
        rows = table[table["policy"] == policy].sort_values("budget")
        for ax, column in ((accuracy_ax, "accuracy"), (kv_ax, "kv_fraction")):
            if len(rows):
                ax.plot(rows["budget"], rows[column], marker=marker, linestyle=dashes, color=colour, label=policy,
                        markerfacecolor="none", markersize=8)
    for policy, style in (("full", "k--"), ("none", "k:")):
        rows = table[table["policy"] == policy]
        if len(rows):
            accuracy_ax.axhline(float(rows["accuracy"].iloc[0]), linestyle=style[1:], color="k",
                                label=f"{policy} (KV kept {float(rows['kv_fraction'].iloc[0]):.2f})")
    accuracy_ax.set(xscale="log", xlabel="budget (fraction of query heads with full KV)", ylabel="NIAH accuracy",
                    ylim=(-0.03, 1.03))
    kv_ax.set(xscale="log", xlabel="budget (fraction of query heads with full KV)",
              ylabel="KV kept (fraction of full, per KV head)", ylim=(0, 1.03))
    for ax in (accuracy_ax, kv_ax):
        ax.set_xticks(budgets, [f"{b:.0%}" for b in budgets])
        ax.minorticks_off()
    accuracy_ax.legend(fontsize=8)
    if title:
        figure.suptitle(title)
    return _save(figure, path)


def plot_kv_grid(cells: pd.DataFrame, path: str | Path, *, title: str | None = None) -> Path:
    """One heat map (depth x context length) of accuracy per (policy, budget) of ``cells.csv``."""
    panels = {}
    for (policy, budget), rows in cells.groupby(["policy", "budget"], sort=False):
        name = policy if policy in ("full", "none") else f"{policy} b={budget:g}"
        panels[name] = rows.pivot(index="depth", columns="context_tokens", values="accuracy")
    return plot_heatmaps(panels, path, label="accuracy", title=title)
