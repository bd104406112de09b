"""Ranking metrics of re-rankers over questions with gold candidates, their paired intervals, and QRHead's head choice.

A ranking is a list of candidate indices, best first; ``gold`` the indices of the gold candidates. Metrics
(binary relevance): Recall@k (share of gold in the top k), MRR (1 / rank of the first gold candidate) and nDCG@10
(DCG of the gold ranks over the ideal DCG). Their intervals over questions are ``evidence.mean_interval``'s (the
re-rank summary's).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from dynheads.errors import DynheadsError
from dynheads.heads import Head

METRICS = ("recall@2", "recall@5", "mrr", "ndcg@10")


def _checked(ranking: Sequence[int], gold: Sequence[int]) -> tuple[list[int], set[int]]:
    ranking, gold_set = [int(i) for i in ranking], {int(i) for i in gold}
    if not gold_set:
        raise DynheadsError("a ranking metric needs at least one gold candidate")
    if len(set(ranking)) != len(ranking) or not gold_set <= set(ranking):
        raise DynheadsError(f"a ranking must list each candidate once and include the gold ones: {ranking}, {gold}")
    return ranking, gold_set


def recall_at(ranking: Sequence[int], gold: Sequence[int], k: int) -> float:
    ranking, gold_set = _checked(ranking, gold)
    return len(gold_set & set(ranking[:k])) / len(gold_set)


def reciprocal_rank(ranking: Sequence[int], gold: Sequence[int]) -> float:
    ranking, gold_set = _checked(ranking, gold)
    return 1.0 / (1 + next(rank for rank, index in enumerate(ranking) if index in gold_set))


def ndcg_at(ranking: Sequence[int], gold: Sequence[int], k: int = 10) -> float:
    ranking, gold_set = _checked(ranking, gold)
    dcg = sum(1.0 / np.log2(rank + 2) for rank, index in enumerate(ranking[:k]) if index in gold_set)
    ideal = sum(1.0 / np.log2(rank + 2) for rank in range(min(len(gold_set), k)))
    return float(dcg / ideal)


def ranking(scores: np.ndarray) -> list[int]:
    """Candidate indices, highest score first; ties keep prompt order (the order is shuffled per question, so a
    tie is broken at random with respect to which candidate is gold)."""
    return [int(i) for i in np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")]


def ranking_metrics(ranking: Sequence[int], gold: Sequence[int]) -> dict[str, float]:
    """Every metric of ``METRICS`` for one question."""
    return {
        "recall@2": recall_at(ranking, gold, 2),
        "recall@5": recall_at(ranking, gold, 5),
        "mrr": reciprocal_rank(ranking, gold),
        "ndcg@10": ndcg_at(ranking, gold, 10),
    }


def qrhead_scores(calibrated: Sequence[np.ndarray], gold: Sequence[Sequence[int]]) -> np.ndarray:
    """QRHead's score of every head, ``[L, H]``: the mean over fitting questions of its calibrated span score
    summed over that question's gold candidates (``calibrated[q]`` is ``[L, H, S]``)."""
    if not calibrated or len(calibrated) != len(gold):
        raise DynheadsError("QRHead's head choice needs one gold list per fitting question, and some questions")
    per_question = [np.asarray(scores)[:, :, list(g)].sum(axis=-1) for scores, g in zip(calibrated, gold, strict=True)]
    return np.mean(per_question, axis=0)


def check_head_count(k: int, num_heads: int) -> None:
    """Refuse ``k`` heads of a model that has ``num_heads`` (all layers) unless 1 <= k <= num_heads: one line."""
    if not 1 <= k <= num_heads:
        raise DynheadsError(f"k={k} heads asked, but the model has {num_heads} heads")


def top_heads(scores: np.ndarray, k: int) -> list[Head]:
    """The ``k`` heads of ``scores [L, H]`` with the highest value, best first (ties: layer, then head)."""
    layers, heads = scores.shape
    check_head_count(k, layers * heads)
    order = np.argsort(-scores.ravel(), kind="stable")[:k]
    return [(int(i) // heads, int(i) % heads) for i in order]
