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


def dodge_ties(resident: np.ndarray, accuracy: np.ndarray, *, step: float = 0.04) -> np.ndarray:
    """Where to draw each point on a log resident axis: points that coincide (equal accuracy, resident KV within 1 %
    of each other) are spread sideways by ``step`` in log space around their mean, in the order given, so that tied
    policies stay visible side by side; every other point keeps its own resident KV. Only the drawing moves: the
    table keeps the measured values."""
    x, y = np.asarray(resident, dtype=float), np.asarray(accuracy, dtype=float)
    drawn = x.copy()
    placed = np.zeros(len(x), dtype=bool)
    for index in range(len(x)):
        if placed[index]:
            continue
        tied = ~placed & (np.abs(np.log(x / x[index])) < np.log(1.01)) & np.isclose(y, y[index])
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
    too, and the Pareto front of all points (grey): a policy is judged by where it sits against it; points that tie
    (same accuracy, resident KV within 1 %) are drawn a little apart (:func:`dodge_ties`). Right: MB moved
    per decode step from the second tier against the resident KV (dynamic policies; a static policy moves nothing).
    ``table``: table.csv's columns; ``measure``: what its accuracy column holds (the task's first metric);
    ``front``: draw the Pareto front (not where the full cache is at chance: no row of it is evidence)."""
    figure = Figure(figsize=(10, 5), layout="constrained")
    accuracy_ax, moved_ax = figure.subplots(1, 2)
    if front:
        _draw_front(accuracy_ax, table)
    table = table.assign(drawn_fraction=dodge_ties(table["kv_fraction"].to_numpy(), table["accuracy"].to_numpy()))
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
        x, accuracy = rows["kv_fraction"].to_numpy(), rows["accuracy"].to_numpy()
        errors = [accuracy - rows["accuracy_low"].to_numpy(), rows["accuracy_high"].to_numpy() - accuracy]
        accuracy_ax.errorbar(rows["drawn_fraction"].to_numpy(), accuracy, yerr=errors, capsize=3, **look)
        if rows["offloaded_mb"].gt(0).any():
            moved_ax.plot(x, rows["moved_mb_per_step"].to_numpy(), **look)
    accuracy_ax.set(
        xlabel="resident KV (fraction of the unmodified model's, log scale)",
        ylabel=measure,
        ylim=(-0.03, 1.03),
        xscale="log",
        xlim=(min(0.04, 0.8 * float(table["kv_fraction"].min())), 1.1),
    )
    ticks = [f for f in (1 / 32, 1 / 16, 1 / 8, 1 / 4, 1 / 2, 1) if f >= accuracy_ax.get_xlim()[0]]
    accuracy_ax.set_xticks(ticks, [f"1/{round(1 / f)}" if f < 1 else "1" for f in ticks])
    accuracy_ax.minorticks_off()
    moved_ax.set(
        xlabel="resident KV (fraction of the unmodified model's)",
        ylabel="MB moved per step (second tier)",
        xlim=(0, 1.03),
    )
    moved = table.loc[table["offloaded_mb"] > 0, "moved_mb_per_step"]
    moved_ax.set_ylim(0, 1.15 * float(moved.max()) if len(moved) and moved.max() > 0 else 1.0)
    figure.legend(*accuracy_ax.get_legend_handles_labels(), loc="outside lower center", ncols=5, fontsize=8)
    if moved_ax.lines:
        moved_ax.legend(fontsize=8)
    if title:
        figure.suptitle(title)
    return save_png(figure, path)


def plot_kv_grid(cells: pd.DataFrame, path: str | Path, *, title: str | None = None) -> Path:
    """One heat map (depth x context length) of accuracy per (policy, budget) of ``cells.csv``."""
    panels = {}
    for (policy, budget), rows in cells.groupby(["policy", "budget"], sort=False):
        name = policy if is_budget_free(policy) else f"{policy} b={budget:g}"
        panels[name] = rows.pivot(index="depth", columns="context_tokens", values="accuracy")
    return plot_heatmaps(panels, path, label="accuracy", title=title)
