"""Figure 4: canonical correlation against the temporal offset k, one panel per measurement."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from dynheads.errors import DynheadsError
from dynheads.plots.png import save_png

_PANELS = {
    "in_sample": "in-sample (the paper's measure)",
    "held_out": "held-out (split by sample)",
    "shuffled": "shuffled pairing (held-out)",
}
_LINES = (  # column, label, colour, marker, line style
    ("top1", "top-1", "#1d3f8f", "o", "-"),
    ("top10_mean", "top-10 mean", "#d1603d", "s", "--"),
    ("top50_mean", "top-50 mean", "#3b8f4a", "^", ":"),
)


def plot_cca(
    table: pd.DataFrame,
    path: str | Path,
    *,
    title: str | None = None,
    paper: Mapping[int, float] | None = None,
    paper_label: str = "paper top-1",
) -> Path:
    """Plot ``cca_offsets`` output: x = offset k, lines = top-1 / top-10 / top-50 means, one panel per method.

    ``paper`` (offset -> published top-1) is drawn as crosses on the in-sample panel.
    """
    methods = [m for m in _PANELS if m in set(table["method"])]
    if table.empty or not methods:
        raise DynheadsError("nothing to plot: the CCA table has no in_sample/held_out/shuffled rows")
    values = table[[column for column, *_ in _LINES]].to_numpy()
    low = min(0.0, float(values.min())) - 0.05  # held-out values can be negative: keep them visible
    figure = Figure(figsize=(4.2 * len(methods), 3.8), layout="constrained")
    axes = figure.subplots(1, len(methods), sharey=True, squeeze=False)[0]
    for ax, method in zip(axes, methods, strict=True):
        rows = table[table["method"] == method].sort_values("offset")
        for column, label, colour, marker, style in _LINES:
            ax.plot(rows["offset"], rows[column], color=colour, marker=marker, linestyle=style, label=label)
        if paper and method == "in_sample":
            ax.plot(list(paper), list(paper.values()), "kx", markersize=9, mew=2, label=paper_label)
        ax.axhline(0.0, color="#999999", linewidth=0.8)
        ax.set_title(_PANELS[method], fontsize=11)
        ax.set_xlabel("offset k (scores at step n + k)")
        ax.set_xticks(sorted(set(table["offset"])))
        ax.set_ylim(low, 1.02)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("canonical correlation")
    handles, labels = axes[0].get_legend_handles_labels()  # one legend for all panels, below them
    figure.legend(handles, labels, loc="outside lower center", ncols=len(labels), frameon=False)
    if title:
        figure.suptitle(title)
    return save_png(figure, path)
