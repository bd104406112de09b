"""What a head predictor must beat besides the frequency profile (``head_predictor``'s baseline), and how well it
ranks heads within one step.

- **Step-index profile** (Claim 3's position control): each head's training-split rate (binary) or mean score
  (continuous) at each step index of the answer, the whole-split profile past the longest training answer. It
  knows what every answer does at its t-th token (the UUID's first characters are copied at the same steps in every
  sample), which is what the CCA's shuffled pairing keeps too: both halves of Claim 3 then test what is specific to a
  sample beyond its position in the answer.
- **Within-step ranking** (Claim 1, which heads): at every step with a dynamic head, how well the predicted scores
  rank that step's heads (average precision over heads for D_t; Spearman's rank correlation for continuous scores),
  minus the same for the static frequency profile. Only the order of heads *within* a step counts, so a predictor
  that knows *when* retrieval happens (how many heads fire) but not *which* earns nothing: under a fixed static
  profile, where every step draws its heads from the same frequencies, the profile's order is the best any
  predictor can do. Per sample: the mean over its steps; NaN for a sample with no such step.
"""

from __future__ import annotations

import numpy as np
from scipy.stats import rankdata


def step_index_profile(targets: np.ndarray, steps: list[int]) -> np.ndarray:
    """``[max steps, W]``: the mean target at each step index over the samples (``steps``: their lengths, in row
    order of ``targets``) long enough to have it."""
    starts = np.cumsum([0, *steps])[:-1]
    longest = max(steps, default=0)
    totals, counts = np.zeros((longest, targets.shape[1])), np.zeros(longest)
    for start, length in zip(starts, steps, strict=True):
        totals[:length] += targets[start : start + length]
        counts[:length] += 1
    return totals / np.maximum(counts, 1)[:, None]


def step_index_baseline(profile: np.ndarray, fallback: np.ndarray, steps: list[int]) -> np.ndarray:
    """The step-index profile's prediction for rows of samples of lengths ``steps``: row t of a sample gets the
    profile at index t, or ``fallback`` (the whole-split profile) past the profile's length."""
    rows = []
    for length in steps:
        known = min(length, len(profile))
        rows.append(np.concatenate([profile[:known], np.broadcast_to(fallback, (length - known, len(fallback)))]))
    return np.concatenate(rows) if rows else np.zeros((0, len(fallback)))


def within_step_ranking(targets: np.ndarray, scores: np.ndarray, rows: list[np.ndarray]) -> np.ndarray:
    """Per sample (``rows``: its row indices): the mean over its steps with a positive target of how well ``scores``
    rank that step's heads: average precision for 0/1 targets, else Spearman's rank correlation (steps whose
    targets or scores are constant left out). NaN for a sample with no such step."""
    binary = bool(np.isin(targets, (0, 1)).all())
    per_row = _row_precision(targets, scores) if binary else _row_rank_correlation(targets, scores)
    return np.array([np.nanmean(per_row[r]) if np.isfinite(per_row[r]).any() else np.nan for r in rows])


def _row_precision(targets: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """sklearn's average precision of each row with a positive (``head_predictor.weighted_average_precision``
    over the row's heads sorted by score), NaN for the others."""
    out = np.full(len(targets), np.nan)
    scores = np.broadcast_to(scores, targets.shape)
    for i in np.flatnonzero(targets.any(axis=1)):
        order = np.argsort(scores[i], kind="stable")
        hits = targets[i, order].astype(np.float64)
        out[i] = weighted_average_precision(scores[i, order], hits, 1.0 - hits)
    return out


def _row_rank_correlation(targets: np.ndarray, scores: np.ndarray) -> np.ndarray:
    a, b = rankdata(targets, axis=1), rankdata(np.broadcast_to(scores, targets.shape), axis=1)
    a, b = a - a.mean(axis=1, keepdims=True), b - b.mean(axis=1, keepdims=True)
    norm = np.sqrt((a * a).sum(axis=1) * (b * b).sum(axis=1))
    valid = (norm > 0) & (targets > 0).any(axis=1)
    return np.where(valid, (a * b).sum(axis=1) / np.where(valid, norm, 1.0), np.nan)


def weighted_average_precision(scores: np.ndarray, positives: np.ndarray, negatives: np.ndarray) -> float:
    """sklearn's ``average_precision_score`` of groups of elements sorted by ascending score, group g holding
    ``positives[g]`` positive and ``negatives[g]`` negative elements of score ``scores[g]`` (whole-number weights,
    at least one element per group): the recall gained at each threshold (distinct score, highest first) times
    the precision there. sklearn's own arithmetic in its order (cumulative sums at the last element of each
    distinct score, the sum taken from the lowest threshold up), so the result is the same to the last bit, without
    its checks and sorting per call: a bootstrap calls it thousands of times (tests/test_head_predictor.py)."""
    scores, positives, negatives = scores[::-1], positives[::-1], negatives[::-1]
    ends = np.r_[np.flatnonzero(np.diff(scores)), len(scores) - 1]  # last group of each distinct score
    true_pos = np.cumsum(positives, dtype=np.float64)[ends]
    false_pos = np.cumsum(negatives, dtype=np.float64)[ends]
    precision = true_pos / (true_pos + false_pos)
    recall = true_pos / true_pos[-1]
    return float(-np.sum(np.diff(np.r_[recall[::-1], 0.0]) * precision[::-1]))
