"""Head scores fused with BM25: reciprocal-rank fusion and a score interpolation whose weight is fitted.

A head strategy's scores over one question's candidates and BM25's over the same candidates become one ranking:

- ``rrf``: reciprocal-rank fusion (Cormack, Clarke and Büttcher, 2009): each candidate scores
  sum over the two rankings of 1 / (``RRF_K`` + its rank), rank 1 the best; ``RRF_K`` = 60, their constant. It needs
  no fitting and ignores the scores' scales.
- ``mix``: ``weight x head + (1 - weight) x bm25`` after each score vector is min-max scaled to [0, 1] per question
  (a constant vector scales to 0). ``weight`` is chosen on the fitting stream only (``fit_weight``: the grid
  0, 0.05, ..., 1, the best mean Recall@2, ties broken by MRR, then by the smaller weight, i.e. toward BM25).

Pure numpy: the re-ranking runner (``experiments.rerank``) calls it with stored scores.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dynheads.analysis.ranking import ranking, ranking_metrics
from dynheads.errors import DynheadsError

FUSIONS = ("rrf", "mix")
RRF_K = 60
WEIGHT_GRID = tuple(round(0.05 * i, 2) for i in range(21))


def ranks(scores: np.ndarray) -> np.ndarray:
    """1-based rank of every candidate, highest score first; ties keep candidate order (``ranking``'s)."""
    order = ranking(scores)
    ranked = np.empty(len(order), dtype=np.int64)
    ranked[order] = np.arange(1, len(order) + 1)
    return ranked


def reciprocal_rank_fusion(head: np.ndarray, bm25: np.ndarray) -> np.ndarray:
    """Per candidate, 1 / (RRF_K + rank under the head scores) + 1 / (RRF_K + rank under BM25)."""
    return 1.0 / (RRF_K + ranks(head)) + 1.0 / (RRF_K + ranks(bm25))


def min_max(scores: np.ndarray) -> np.ndarray:
    """``scores`` scaled to [0, 1] (the lowest 0, the highest 1); a constant vector is all 0."""
    scores = np.asarray(scores, dtype=np.float64)
    spread = float(np.ptp(scores)) if scores.size else 0.0
    return np.zeros_like(scores) if spread == 0 else (scores - scores.min()) / spread


def interpolate(head: np.ndarray, bm25: np.ndarray, weight: float) -> np.ndarray:
    """``weight`` x the scaled head scores + (1 - ``weight``) x the scaled BM25 scores."""
    if not 0.0 <= weight <= 1.0:
        raise DynheadsError(f"a fusion weight lies in [0, 1], got {weight}")
    return weight * min_max(head) + (1.0 - weight) * min_max(bm25)


def fuse(fusion: str, head: np.ndarray, bm25: np.ndarray, weight: float | None = None) -> np.ndarray:
    """The fused scores of one question (``mix`` needs its fitted ``weight``)."""
    if len(head) != len(bm25):
        raise DynheadsError(f"{len(head)} head scores and {len(bm25)} BM25 scores for one question's candidates")
    if fusion == "rrf":
        return reciprocal_rank_fusion(head, bm25)
    if fusion == "mix":
        if weight is None:
            raise DynheadsError("the 'mix' fusion needs its weight, fitted on the fitting stream")
        return interpolate(head, bm25, weight)
    raise DynheadsError(f"unknown fusion {fusion!r}: use one of {', '.join(FUSIONS)}")


def fit_weight(
    heads: Sequence[np.ndarray], bm25: Sequence[np.ndarray], gold: Sequence[Sequence[int]]
) -> tuple[float, list[dict[str, float]]]:
    """The ``mix`` weight from fitting questions (``heads[i]``, ``bm25[i]``, ``gold[i]`` of question i): the grid
    point with the best mean Recall@2, then MRR, then the smaller weight; and every grid point's two means."""
    if not heads or not len(heads) == len(bm25) == len(gold):
        raise DynheadsError(f"fitting a fusion weight needs questions: {len(heads)} head, {len(bm25)} BM25 score sets")
    table = []
    for weight in WEIGHT_GRID:
        metrics = [
            ranking_metrics(ranking(interpolate(h, b, weight)), g) for h, b, g in zip(heads, bm25, gold, strict=True)
        ]
        table.append(
            {
                "weight": weight,
                "recall@2": float(np.mean([m["recall@2"] for m in metrics])),
                "mrr": float(np.mean([m["mrr"] for m in metrics])),
            }
        )
    best = max(table, key=lambda row: (row["recall@2"], row["mrr"], -row["weight"]))
    return float(best["weight"]), table
