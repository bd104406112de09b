"""KV-retention figures: accuracy against the resident KV per policy, and the length x depth grid at one budget."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from dynheads.kv.policies import is_budget_free, plot_style
from dynheads.plots.ablation import plot_heatmaps
from dynheads.plots.png import save_png


def pareto_front(resident: np.ndarray, accuracy: np.ndarray) -> np.ndarray:
    """Bool per point: no other point holds at most its resident KV with at least its accuracy, one of the two
    strictly (the accuracy-memory Pareto front; equal points are all on it)."""
    x, y = np.asarray(resident, dtype=float), np.asarray(accuracy, dtype=float)
    beaten = (
        (x[None, :] <= x[:, None])
        & (y[None, :] >= y[:, None])
        & ((x[None, :] < x[:, None]) | (y[None, :] > y[:, None]))
    )
    return np.asarray(~beaten.any(axis=1))


def dodge_ties(
    resident: np.ndarray, accuracy: np.ndarray, *, step: float = 0.04, within: float = float(np.log(1.01))
) -> np.ndarray:
    """Where to draw each point on a log resident axis: points that coincide (equal accuracy, resident KV within
    ``within`` in log space of each other: 1 % by default) are spread sideways by ``step`` in log space around their
    mean, in the order given, so that tied policies stay visible side by side; every other point keeps its own
    resident KV. Only the drawing moves: the table keeps the measured values."""
    x, y = np.asarray(resident, dtype=float), np.asarray(accuracy, dtype=float)
    drawn = x.copy()
    placed = np.zeros(len(x), dtype=bool)
    for index in range(len(x)):
        if placed[index]:
            continue
        tied = ~placed & (np.abs(np.log(x / x[index])) < within) & np.isclose(y, y[index])
        members = np.flatnonzero(tied)
        placed[members] = True
        if len(members) == 1:
            continue
        offsets = step * (np.arange(len(members)) - (len(members) - 1) / 2)
        drawn[members] = np.exp(np.log(x[members]).mean() + offsets)
    return drawn


def _draw_front(axes, table: pd.DataFrame) -> None:
    """The Pareto front of accuracy against resident KV, a wide grey step line."""
    on_front = table[pareto_front(table["kv_fraction"].to_numpy(), table["accuracy"].to_numpy())]
    on_front = on_front.sort_values("kv_fraction")
    axes.step(
        on_front["kv_fraction"],
        on_front["accuracy"],
        where="post",
        color="0.6",
        linewidth=6,
        alpha=0.35,
        label="Pareto front",
    )


# a marker (8 pt) is about 0.1 of the accuracy panel's log axis wide: points closer than that, at equal accuracy,
# would draw on top of each other (a press and a policy at almost the same resident KV), so they are spread this far
MARKER_WIDTH_LOG = 0.1


def plot_kv_accuracy(
    table: pd.DataFrame,
    path: str | Path,
    *,
    title: str | None = None,
    measure: str = "NIAH accuracy",
    front: bool = True,
) -> Path:
    """Left: accuracy (95 % interval bars) against the resident KV (fraction of the unmodified model's, log scale:
    2x, 4x, 8x, 16x compression are equally spaced) per policy, one point per budget, ``full`` and ``none`` as points
    too, and the Pareto front of all points (grey): a policy is judged by where it sits against it; points that would
    draw on top of each other (same accuracy, resident KV within a marker's width) are drawn a marker apart
    (:func:`dodge_ties`). Right, only where a dynamic policy ran: MB moved per decode step from the second tier
    against the resident KV (a static policy or a press moves nothing, so without a dynamic one there is no panel).
    ``table``: table.csv's columns; ``measure``: what its accuracy column holds (the task's first metric);
    ``front``: draw the Pareto front (not where the full cache is at chance: no row of it is evidence)."""
    dynamic = bool(table["offloaded_mb"].gt(0).any())
    figure = Figure(figsize=(10, 5) if dynamic else (6.5, 5), layout="constrained")
    axes = figure.subplots(1, 2 if dynamic else 1, squeeze=False)[0]
    accuracy_ax = axes[0]
    if front:
        _draw_front(accuracy_ax, table)
    drawn = dodge_ties(
        table["kv_fraction"].to_numpy(), table["accuracy"].to_numpy(), step=MARKER_WIDTH_LOG, within=MARKER_WIDTH_LOG
    )
    table = table.assign(drawn_fraction=drawn)
    for index, policy in enumerate(dict.fromkeys(table["policy"])):
        rows = table[table["policy"] == policy].sort_values("kv_fraction")
        # from the policy's registry entry: distinct markers and dashes, as equal accuracies draw on top of each other
        style = plot_style(policy, index)
        look = dict(
            marker=style.marker,
            linestyle=style.dashes,
            color=style.colour,
            label=policy,
            markerfacecolor="none",
            markersize=8,
        )
        accuracy = rows["accuracy"].to_numpy()
        errors = [accuracy - rows["accuracy_low"].to_numpy(), rows["accuracy_high"].to_numpy() - accuracy]
        accuracy_ax.errorbar(rows["drawn_fraction"].to_numpy(), accuracy, yerr=errors, capsize=3, **look)
        if dynamic and rows["offloaded_mb"].gt(0).any():
            axes[1].plot(rows["kv_fraction"].to_numpy(), rows["moved_mb_per_step"].to_numpy(), **look)
    _label_accuracy_axis(accuracy_ax, table, measure)
    if dynamic:
        _label_moved_axis(axes[1], table)
    figure.legend(
        *accuracy_ax.get_legend_handles_labels(), loc="outside lower center", ncols=5 if dynamic else 3, fontsize=8
    )
    if title:
        figure.suptitle(title, fontsize=10)  # a long model name still fits the narrow figure
    return save_png(figure, path)


def _label_accuracy_axis(axes, table: pd.DataFrame, measure: str) -> None:
    """Accuracy from 0 to 1 against the resident KV on a log axis ticked at 1/32 .. 1."""
    axes.set(
        xlabel="resident KV (fraction of the unmodified model's, log scale)",
        ylabel=measure,
        ylim=(-0.03, 1.03),
        xscale="log",
        xlim=(min(0.04, 0.8 * float(table["kv_fraction"].min())), 1.1),
    )
    ticks = [f for f in (1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1) if f >= axes.get_xlim()[0]]
    axes.set_xticks(ticks, [f"1/{round(1 / f)}" if f < 1 else "1" for f in ticks])
    axes.minorticks_off()


def _label_moved_axis(axes, table: pd.DataFrame) -> None:
    """MB moved per step from 0 to a little above the most any dynamic policy moved, with its own legend."""
    axes.set(
        xlabel="resident KV (fraction of the unmodified model's)",
        ylabel="MB moved per step (second tier)",
        xlim=(0, 1.03),
    )
    moved = table.loc[table["offloaded_mb"] > 0, "moved_mb_per_step"]
    axes.set_ylim(0, 1.15 * float(moved.max()) if moved.max() > 0 else 1.0)
    axes.legend(fontsize=8)


def plot_kv_grid(cells: pd.DataFrame, path: str | Path, *, title: str | None = None) -> Path:
    """One heat map (depth x context length) of accuracy per (policy, budget) of ``cells.csv``, titled with the
    policy and, on a line of its own, the budget or a press's compression ratio (a press's long name then still fits
    above its panel)."""
    panels = {}
    for (policy, budget), rows in cells.groupby(["policy", "budget"], sort=False):
        ratio = rows["ratio"].iloc[0] if "ratio" in rows else float("nan")
        size = f"b={budget:g}" if pd.isna(ratio) else f"ratio {ratio:g}"
        name = policy if is_budget_free(policy) else f"{policy}\n{size}"
        panels[name] = rows.pivot(index="depth", columns="context_tokens", values="accuracy")
    return plot_heatmaps(panels, path, label="accuracy", title=title)
