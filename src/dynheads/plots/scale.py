"""Statistics against model size: one panel per statistic, one point per model with its interval (``dynheads
compare``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dynheads.plots.png import save_png

PANEL_COLUMNS = 3


@dataclass(frozen=True)
class Point:
    """One model's value of a statistic: ``effect`` with its interval ``[low, high]`` over ``n`` samples."""

    model: str
    parameters: int
    effect: float
    low: float
    high: float
    n: int


@dataclass(frozen=True)
class Panel:
    """One statistic: its points and the margin its verdict holds it to (drawn as a dashed line)."""

    title: str
    points: Sequence[Point]
    margin: float | None = None


def plot_by_size(panels: Sequence[Panel], path: Path) -> Path:
    """Panels in a grid, x = parameters (log scale), a point with its interval per model; written to ``path``."""
    from matplotlib.figure import Figure  # slow to import: only when a figure is drawn

    rows = max(1, math.ceil(len(panels) / PANEL_COLUMNS))
    columns = min(PANEL_COLUMNS, max(1, len(panels)))
    figure = Figure(figsize=(3.4 * columns, 2.5 * rows))
    for index, panel in enumerate(panels):
        axes = figure.add_subplot(rows, columns, index + 1)
        points = sorted(panel.points, key=lambda point: point.parameters)
        x = [point.parameters for point in points]
        y = [point.effect for point in points]
        below = [max(0.0, point.effect - point.low) if _finite(point.low) else 0.0 for point in points]
        above = [max(0.0, point.high - point.effect) if _finite(point.high) else 0.0 for point in points]
        axes.errorbar(x, y, yerr=[below, above], fmt="o-", color="#1d3f8f", capsize=3, markersize=4)
        for point in points:
            axes.annotate(
                f"n={point.n}", (point.parameters, point.effect), xytext=(3, 3), textcoords="offset points", fontsize=6
            )
        if panel.margin is not None:
            axes.axhline(panel.margin, color="#c0392b", linestyle="--", linewidth=0.8)
        axes.set_xscale("log")
        axes.minorticks_off()
        axes.set_xticks(sorted(set(x)), [size_label(count) for count in sorted(set(x))])
        axes.set_xlabel("parameters", fontsize=7)
        axes.set_title(panel.title, fontsize=7)
        axes.tick_params(labelsize=6)
    figure.tight_layout()
    return save_png(figure, path, dpi=110)


def size_label(count: int) -> str:
    """A parameter count as people write it: 135M, 1.5B."""
    return f"{count / 1e9:.3g}B" if count >= 1e9 else f"{count / 1e6:.3g}M"


def _finite(value: float) -> bool:
    return not math.isnan(value)
