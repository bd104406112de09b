"""ROC curves of the hallucination detectors, one line per feature set, on the held-out samples."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

from dynheads.errors import DynheadsError
from dynheads.plots.png import save_png


def plot_roc(
    curves: Mapping[str, tuple[np.ndarray, np.ndarray, float]], path: str | Path, *, title: str | None = None
) -> Path:
    """``curves``: feature set -> (false positive rate, true positive rate, AUROC). Writes a PNG."""
    if not curves:
        raise DynheadsError("nothing to plot: no ROC curves")
    figure = Figure(figsize=(4.8, 4.4), layout="constrained")
    ax = figure.subplots()
    ax.plot([0, 1], [0, 1], color="#999999", linestyle=":", linewidth=1, label="chance")
    for name, (fpr, tpr, auroc) in curves.items():
        ax.plot(fpr, tpr, linewidth=1.6, label=f"{name} ({auroc:.3f})")
    ax.set_xlabel("false positive rate")
    ax.set_ylabel("true positive rate (hallucinated tokens)")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.01)
    ax.legend(loc="lower right", fontsize=8, title="feature set (AUROC)", title_fontsize=8)
    if title:
        ax.set_title(title, fontsize=9)
    return save_png(figure, path)
