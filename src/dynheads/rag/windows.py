"""Algorithm 2's position selection: from the selected heads' attention over the context to visible windows.

Given ``scores [C]``, the selected heads' attention averaged over heads at the context's ``C`` positions
(context position ``i`` is absolute position ``offset + i``):

1. take the ``top_n`` highest-scoring positions (ties: earlier position first);
2. cluster them: ``"gap"`` sorts them and splits where neighbours are more than ``gap`` positions apart;
   ``"dbscan"`` runs scikit-learn's DBSCAN(eps=gap + 0.5, min_samples=1), the same clusters in one dimension;
3. pick each cluster's representative: its highest-scoring position (``"max"``) or its lower median (``"median"``);
4. expand a window of ``window`` tokens around it, ``[rep - window // 2, rep - window // 2 + window)``, clipped
   to the context;
5. merge overlapping or touching windows; the visible mask is their union.

Windows are ``(start, stop)`` half-open intervals of absolute positions.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike

from dynheads.config import setting
from dynheads.errors import DynheadsError

ClusterMethod = Literal["gap", "dbscan"]
Representative = Literal["max", "median"]
Window = tuple[int, int]


@dataclass(frozen=True)
class RetrievalConfig:
    top_n: int = setting(
        10,
        "How many top-attended context positions to cluster (the paper's TopKIndices; it "
        "gives no value, 10 is our choice: about one position per supporting sentence and a "
        "few spares).",
    )
    cluster: ClusterMethod = setting(
        "gap",
        "'gap': split sorted positions where neighbours are more than `gap` "
        "apart; 'dbscan': scikit-learn DBSCAN with eps=gap+0.5, min_samples=1 "
        "(same clusters in 1-D).",
    )
    gap: int = setting(8, "Largest distance in tokens between neighbouring positions of one cluster (our choice).")
    representative: Representative = setting(
        "max",
        "Position a window is centred on: the cluster's "
        "highest-scoring position ('max') or its lower median "
        "position ('median').",
    )
    window: int = setting(
        64,
        "Window size in tokens around each representative, half before and half after (our "
        "choice: a HotpotQA supporting sentence is about 30 tokens, whichever of its tokens "
        "is the peak).",
    )

    def __post_init__(self) -> None:
        if self.top_n < 1 or self.window < 1 or self.gap < 0:
            raise DynheadsError(
                f"retrieval needs top_n >= 1, window >= 1 and gap >= 0, got top_n={self.top_n}, "
                f"window={self.window}, gap={self.gap}"
            )
        if self.cluster not in ("gap", "dbscan"):
            raise DynheadsError(f"unknown clustering {self.cluster!r}: expected 'gap' or 'dbscan'")
        if self.representative not in ("max", "median"):
            raise DynheadsError(f"unknown representative {self.representative!r}: expected 'max' or 'median'")


@dataclass(frozen=True, eq=False)
class RetrievedWindows:
    """What one retrieval made visible. All positions are absolute."""

    windows: tuple[Window, ...]  # merged, sorted, half-open
    mask: np.ndarray  # [C] bool over context positions (index i is absolute offset + i), True where visible
    top_positions: tuple[int, ...]  # in decreasing score
    clusters: tuple[tuple[int, ...], ...]  # sorted positions of each cluster
    representatives: tuple[int, ...]  # one per cluster


def select_windows(scores: ArrayLike, config: RetrievalConfig | None = None, *, offset: int = 0) -> RetrievedWindows:
    """Algorithm 2 from ``AverageAttention`` on: ``scores [C]`` (numpy or CPU float tensor) to visible windows."""
    config = config or RetrievalConfig()
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 1 or not np.all(np.isfinite(scores)):
        raise DynheadsError(f"retrieval scores must be a finite [C] vector over the context, got shape {scores.shape}")
    length = scores.shape[0]
    if length == 0:
        return RetrievedWindows((), np.zeros(0, dtype=bool), (), (), ())

    top = np.argsort(-scores, kind="stable")[: config.top_n]
    clusters = cluster_positions(top, config.gap, config.cluster)
    representatives = [_representative(c, scores, config.representative) for c in clusters]
    start = [rep - config.window // 2 for rep in representatives]
    windows = merge_windows((max(a, 0), min(a + config.window, length)) for a in start)  # clipped, not shifted
    mask = windows_to_mask(windows, length)
    return RetrievedWindows(
        windows=tuple((a + offset, b + offset) for a, b in windows),
        mask=mask,
        top_positions=tuple(int(p) + offset for p in top),
        clusters=tuple(tuple(int(p) + offset for p in c) for c in clusters),
        representatives=tuple(int(r) + offset for r in representatives),
    )


def cluster_positions(positions: ArrayLike, gap: int, method: ClusterMethod = "gap") -> list[np.ndarray]:
    """Split positions into clusters of neighbours at most ``gap`` apart; each cluster sorted, clusters in order."""
    positions = np.sort(np.asarray(positions, dtype=np.int64))
    if positions.size == 0:
        return []
    if method == "gap":
        return np.split(positions, np.flatnonzero(np.diff(positions) > gap) + 1)
    if method == "dbscan":
        from sklearn.cluster import DBSCAN  # only this option needs scikit-learn

        # integer positions at most gap apart are within gap + 0.5; the half keeps eps > 0 (DBSCAN's rule) at gap 0
        labels = DBSCAN(eps=gap + 0.5, min_samples=1).fit_predict(positions.reshape(-1, 1).astype(np.float64))
        clusters = [positions[labels == label] for label in np.unique(labels)]
        return sorted(clusters, key=lambda c: c[0])
    raise DynheadsError(f"unknown clustering {method!r}: expected 'gap' or 'dbscan'")


def _representative(cluster: np.ndarray, scores: np.ndarray, how: Representative) -> int:
    if how == "median":
        return int(cluster[(len(cluster) - 1) // 2])  # lower median: always a member position
    return int(cluster[np.argmax(scores[cluster])])  # ties: the earlier position


def merge_windows(windows: Iterable[Window]) -> list[Window]:
    """Union of half-open intervals as sorted, disjoint, non-touching intervals (empty ones dropped)."""
    merged: list[Window] = []
    for a, b in sorted(w for w in windows if w[1] > w[0]):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def windows_to_mask(windows: Iterable[Window], length: int, offset: int = 0) -> np.ndarray:
    """``[length]`` bool mask over the context ``[offset, offset + length)``, True inside the windows."""
    mask = np.zeros(length, dtype=bool)
    for a, b in windows:
        mask[max(a - offset, 0) : max(b - offset, 0)] = True
    return mask


def windows_to_positions(windows: Iterable[Window]) -> np.ndarray:
    """Sorted unique absolute positions covered by the windows, ``[P]`` int64."""
    ranges = [np.arange(a, b, dtype=np.int64) for a, b in windows]
    return np.unique(np.concatenate(ranges)) if ranges else np.zeros(0, dtype=np.int64)


def retrieval_recall(windows: Iterable[Window], supporting_positions: ArrayLike) -> float:
    """Fraction of the (distinct, absolute) supporting-fact positions that the windows make visible."""
    support = np.unique(np.asarray(supporting_positions, dtype=np.int64))
    if support.size == 0:
        raise DynheadsError("retrieval recall needs at least one supporting-fact position")
    return float(np.isin(support, windows_to_positions(windows)).mean())
