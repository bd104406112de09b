"""Chance levels of Claim 1's statistics: what a set of heads drawn at random, of the observed size, scores.

Several of Table 1's statistics have a range that the set size fixes: with mean |D_t| = m and a top-20 list,
the entropy of head use is at least ln m, the containment in the top-20 at most 20/m and the Jaccard with the
top-20 at most min(m, 20)/max(m, 20) (notes/algorithms.md, "Claim 1 - rules that can fail at every set size").
A verdict read on them can be decided by m alone. Each statistic is therefore shown beside its chance level at
the observed sizes, and the verdict reads its **share above chance**: (value - chance) / (ceiling - chance),
0 for a random set of the same size and 1 for the most the sizes allow, a range m does not fix.

- ``expected_jaccard(a, b, H)``: the mean Jaccard of a uniformly random a-subset of H heads with a fixed b-subset,
  exact (the overlap is hypergeometric), so no simulation noise.
- ``chance_entropy(sizes, H, seed)``: the entropy of head use when every step draws a random set of its own size
  (seeded simulation, the mean over ``draws`` draws).
- ``cross_sample_jaccard``: the Jaccard of step t of one sample with step t of another (a seeded derangement of
  the samples): what the steps of different answers share, the null for what adjacent steps of one answer share.
- ``static_profile_jaccard``: the adjacent-step Jaccard when every step draws its own number of heads from one
  fixed profile (the heads' frequencies over all steps): the turnover a rotation within a fixed pool gives, which
  Table 1's "Adj. Jaccard" cannot tell from dynamic heads by itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from functools import lru_cache

import numpy as np
from scipy.stats import entropy, hypergeom

from dynheads.analysis.cca import shuffled_pairing  # the same seeded derangement as the CCA's shuffled control

CHANCE_DRAWS = 8  # random draws averaged for the chance entropy
_BLOCK = 4096  # steps per block of the entropy simulation (bounds its memory)


@lru_cache(maxsize=65536)
def expected_jaccard(size: int, other: int, total: int) -> float:
    """E[J(A, B)] for A a uniformly random ``size``-subset of ``total`` heads and B a fixed ``other``-subset;
    NaN when both are empty (no Jaccard)."""
    if size + other == 0:
        return math.nan
    overlaps = np.arange(max(0, size + other - total), min(size, other) + 1)
    weights = hypergeom.pmf(overlaps, total, other, size)
    return float((weights * overlaps / (size + other - overlaps)).sum())


def expected_jaccards(sizes: np.ndarray, others: np.ndarray, total: int) -> np.ndarray:
    """``expected_jaccard`` element-wise over two integer arrays of set sizes."""
    return np.array([expected_jaccard(int(a), int(b), total) for a, b in zip(sizes, others, strict=True)], dtype=float)


def jaccard_ceiling(sizes: np.ndarray, others: np.ndarray) -> np.ndarray:
    """The largest Jaccard two sets of these sizes can have: min / max (NaN when both are empty)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.minimum(sizes, others) / np.maximum(sizes, others)


def share_above_chance(value: np.ndarray, chance: np.ndarray, ceiling: np.ndarray) -> np.ndarray:
    """(value - chance) / (ceiling - chance): 0 at chance, 1 at the ceiling; NaN where the ceiling does not lie
    above chance (nothing to measure, e.g. an empty set)."""
    value, chance, ceiling = (np.asarray(x, dtype=float) for x in (value, chance, ceiling))
    room = ceiling - chance
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(room > 1e-12, (value - chance) / np.where(room > 1e-12, room, 1.0), np.nan)


def chance_entropy(sizes: np.ndarray, total: int, seed: int = 0, draws: int = CHANCE_DRAWS) -> float:
    """Entropy (nats) of head use when step t draws ``sizes[t]`` heads of ``total`` at random (seeded); NaN when
    no step has a head."""
    sizes = np.asarray(sizes, dtype=int)
    if not sizes.sum():
        return math.nan
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(draws):
        counts = np.zeros(total)
        for start in range(0, len(sizes), _BLOCK):
            block = sizes[start : start + _BLOCK]
            ranks = rng.random((len(block), total)).argsort(axis=1).argsort(axis=1)
            counts += (ranks < block[:, None]).sum(axis=0)
        values.append(float(entropy(counts)))
    return float(np.mean(values))


def cross_sample_jaccard(samples: Sequence[np.ndarray], seed: int = 0) -> float:
    """Mean Jaccard of step t of sample i with step t of sample ``perm[i]`` (``[step, L*H]`` bool arrays; ``perm``
    a seeded derangement; the longer sample is cut to the shorter), pairs of two empty sets skipped; NaN with
    fewer than two samples or no pair."""
    if len(samples) < 2:
        return math.nan
    pairs = shuffled_pairing([(sample, sample) for sample in samples], seed)
    inter = np.concatenate([(a & b).sum(axis=1) for a, b in pairs])
    union = np.concatenate([(a | b).sum(axis=1) for a, b in pairs])
    kept = union > 0
    return float((inter[kept] / union[kept]).mean()) if kept.any() else math.nan


def static_profile_jaccard(
    first: np.ndarray, second: np.ndarray, counts: np.ndarray, seed: int = 0, draws: int = CHANCE_DRAWS
) -> float:
    """Mean Jaccard of two sets of sizes ``first[i]`` and ``second[i]`` drawn without replacement with probabilities
    proportional to ``counts`` (each head's steps in D_t), over the pairs and ``draws`` seeded draws; a pair with one
    empty set scores 0 (as Table 1 counts it), two empty sets are skipped. NaN with no pair or no head used.
    Weighted draws without replacement by the Gumbel top-k trick (the k largest of log p + Gumbel noise)."""
    first, second = np.asarray(first, dtype=int), np.asarray(second, dtype=int)
    kept = (first + second) > 0
    counts = np.asarray(counts, dtype=float)
    support = int((counts > 0).sum())
    if not kept.any() or not support:
        return math.nan
    first, second = np.minimum(first[kept], support), np.minimum(second[kept], support)
    log_p = np.log(np.where(counts > 0, counts / counts.sum(), 1.0))
    log_p[counts <= 0] = -np.inf
    rng = np.random.default_rng(seed)
    values = []
    for _ in range(draws):
        for start in range(0, len(first), _BLOCK):
            a, b = first[start : start + _BLOCK], second[start : start + _BLOCK]
            one, two = _weighted_sets(log_p, a, rng), _weighted_sets(log_p, b, rng)
            inter, union = (one & two).sum(axis=1), (one | two).sum(axis=1)
            values.append(inter / np.maximum(union, 1))
    return float(np.concatenate(values).mean())


def _weighted_sets(log_p: np.ndarray, sizes: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``[len(sizes), H]`` bool: row i holds ``sizes[i]`` heads drawn without replacement, probability ~ exp(log_p)."""
    keys = log_p[None, :] + rng.gumbel(size=(len(sizes), len(log_p)))
    ranks = (-keys).argsort(axis=1).argsort(axis=1)
    return ranks < sizes[:, None]
