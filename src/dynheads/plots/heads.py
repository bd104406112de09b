"""Figure 1: per-step retrieval scores of the heads whose score varies most over one generation."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.colors import ListedColormap
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from dynheads.errors import DynheadsError
from dynheads.heads import Head, head_label
from dynheads.plots.png import save_png

_BINARY_COLOURS = ("#eeeeee", "#1d3f8f")  # score 0, score 1 (dark = retrieves, as in the paper)
_STEP_INCHES = 0.26  # width of one step's column: fits a rotated 8 pt label
_MAX_WIDTH = 40.0  # inches; beyond this, only every n-th step is labelled
_MAX_LABEL_CHARS = 12
_VISIBLE = {" ": "␣", "\n": "\\n", "\t": "\\t", "\r": "\\r", "$": r"\$"}  # "$" would start mathtext


def most_varying_heads(scores: np.ndarray, top: int) -> list[Head]:
    """The ``top`` heads of ``[step, layer, head]`` scores with the largest variance over steps.

    Ties are broken by (layer, head) ascending.
    """
    steps, _, num_heads = scores.shape
    variance = scores.reshape(steps, -1).astype(np.float64).var(axis=0)
    order = np.argsort(-variance, kind="stable")[:top]  # stable: tied heads stay in layer-major order
    return [(int(i // num_heads), int(i % num_heads)) for i in order]


def token_label(token: str) -> str:
    """A generated token as an axis label: whitespace made visible, long tokens shortened."""
    text = "".join(_VISIBLE.get(char, char) for char in token) or "∅"
    return text if len(text) <= _MAX_LABEL_CHARS else text[: _MAX_LABEL_CHARS - 1] + "…"


def plot_head_dynamics(
    scores: np.ndarray,
    token_labels: Sequence[str],
    path: str | Path,
    *,
    top: int = 10,
    binary: bool | None = None,
    title: str | None = None,
    scale_label: str = "retrieval score",
) -> list[Head]:
    """Write Figure 1 for one generation as a PNG at ``path`` (atomically); returns the heads shown.

    See ``head_dynamics_figure`` for the arguments.
    """
    figure, heads = head_dynamics_figure(
        scores, token_labels, top=top, binary=binary, title=title, scale_label=scale_label
    )
    save_png(figure, path)
    return heads


def check_figure_inputs(scores: Any, token_labels: Any) -> None:
    """Name the argument a Figure 1 call got wrong (a trace, token ids) before numpy or matplotlib would."""
    if hasattr(scores, "token_texts"):
        raise DynheadsError(
            "plot_head_dynamics(scores, token_labels, path) takes a [step, layer, head] array, not a trace: "
            "pass trace.copy_scores and trace.token_texts"
        )
    if isinstance(token_labels, str) or not all(isinstance(label, str) for label in token_labels):
        kind = type(token_labels).__name__ if isinstance(token_labels, str) else "token ids or other non-text"
        raise DynheadsError(
            f"plot_head_dynamics's token_labels are the generated tokens' texts (trace.token_texts), got {kind}: "
            "pass trace.token_texts, not trace.tokens"
        )


def head_dynamics_figure(
    scores: np.ndarray,
    token_labels: Sequence[str],
    *,
    top: int = 10,
    binary: bool | None = None,
    title: str | None = None,
    scale_label: str = "retrieval score",
) -> tuple[Figure, list[Head]]:
    """Heat map of ``scores`` ``[step, layer, head]`` for the ``top`` most varying heads.

    Rows are the chosen heads in (layer, head) order, columns the steps, labelled with ``token_labels`` (the
    generated tokens). ``binary=None`` treats bool or 0/1-only scores (Eq. 1) as binary (two colours and a
    legend); anything else (Eq. 2) gets a continuous colour scale and a colour bar, diverging around 0 where a
    score is negative (the write score, in logits). ``scale_label`` names the score on the legend or colour bar.
    """
    check_figure_inputs(scores, token_labels)
    scores = np.asarray(scores)
    if scores.ndim != 3 or scores.shape[0] == 0:
        raise DynheadsError(
            f"need [step, layer, head] scores with at least one step (e.g. trace.copy_scores), got shape {scores.shape}"
        )
    steps = scores.shape[0]
    if top < 1:
        raise DynheadsError(f"top must be at least 1, got {top}")
    if len(token_labels) != steps:
        raise DynheadsError(f"{len(token_labels)} token labels for {steps} steps")
    if binary is None:
        binary = scores.dtype == np.bool_ or bool(np.isin(scores, (0, 1)).all())
    heads = sorted(most_varying_heads(scores, top))
    matrix = np.stack([scores[:, layer, head] for layer, head in heads]).astype(np.float64)  # [row, step]

    width = min(max(6.0, 3.0 + _STEP_INCHES * steps), _MAX_WIDTH)
    figure = Figure(figsize=(width, 2.2 + 0.32 * len(heads)), layout="constrained")
    axes = figure.add_subplot()
    if binary:
        axes.imshow(
            matrix, cmap=ListedColormap(_BINARY_COLOURS), vmin=0, vmax=1, aspect="auto", interpolation="nearest"
        )
        legend = [
            Patch(facecolor=_BINARY_COLOURS[1], edgecolor="#888888", label="1: retrieval head at this step"),
            Patch(facecolor=_BINARY_COLOURS[0], edgecolor="#888888", label="0"),
        ]
        axes.legend(
            handles=legend,
            title=scale_label,
            loc="upper left",
            bbox_to_anchor=(1.01, 1.0),
            frameon=False,
            fontsize=8,
            title_fontsize=8,
        )
    else:
        bound = float(np.abs(matrix).max()) or 1.0
        signed = {"cmap": "RdBu_r", "vmin": -bound, "vmax": bound} if (matrix < 0).any() else {"cmap": "Blues"}
        image = axes.imshow(matrix, aspect="auto", interpolation="nearest", **signed)
        figure.colorbar(image, ax=axes, label=scale_label, fraction=0.04, pad=0.01)

    # Label every step while the labels fit; past that, every n-th step.
    stride = math.ceil(steps * _STEP_INCHES / (width - 3.0)) if width == _MAX_WIDTH else 1
    ticks = np.arange(0, steps, stride)
    axes.set_xticks(ticks, [token_label(token_labels[i]) for i in ticks], rotation=90, fontsize=8)
    axes.set_yticks(np.arange(len(heads)), [head_label(head) for head in heads], fontsize=9)
    # Thin white lines between cells so neighbouring equal cells stay countable.
    axes.set_xticks(np.arange(-0.5, steps, 1), minor=True)
    axes.set_yticks(np.arange(-0.5, len(heads), 1), minor=True)
    axes.grid(which="minor", color="white", linewidth=0.6)
    axes.tick_params(which="minor", length=0)
    axes.set_xlabel("generation step (token generated at that step)")
    axes.set_ylabel("head")
    if title:
        axes.set_title(title)
    return figure, heads
