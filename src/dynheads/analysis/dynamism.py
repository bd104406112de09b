"""Claim 1 statistics (the paper's Table 1 and Table 5) over all steps of all samples.

Input: one boolean array ``[step, layer, head]`` per sample, the dynamic sets D_t (Eq. 1 copy scores, or Eq. 2
scores through ``binarize``), and the static ranking (best first). Steps of all samples are pooled:

- Mean ± Std of |D_t| (population std, ddof=0).
- Unique / Total: |∪_t D_t| and L·H.
- Jaccard w/ Static: mean over steps of J(D_t, S_k), S_k = static top-k (Table 1: k=20; Table 5: 20, 50, 100).
- Adj. Jaccard: mean over consecutive steps of one sample of J(D_t, D_{t+1}); a pair of two empty sets has
  no Jaccard index and is skipped (and counted). One empty set against a non-empty one scores 0, as Table 1
  counts it. Beside it, the same under a static profile (``chance.static_profile_jaccard``: each step draws its
  own number of heads from the heads' frequencies), the turnover a rotation within a fixed pool gives.
- Entropy: S = -Σ_h p_h ln p_h, p_h = number of steps with h ∈ D_t, normalised to sum 1 (baseline ln 20).

Jaccard with the static top-20 is at most |D_t| / 20 when |D_t| <= 20, so with a few dynamic heads per step a low
value says nothing about dynamism. Beside it, over the steps with a non-empty D_t (``per_sample_dynamism`` gives
them per sample, for intervals over samples):

- Containment: |D_t ∩ S_k| / |D_t|, the share of a step's dynamic heads that are static top-k heads (1 when the
  dynamic sets never leave the static list).
- Size-matched Jaccard: J(D_t, S_|D_t|), against the static list cut to the step's own size (ceiling 1).
- Jaccard ceiling: the mean of min(|D_t|, k) / max(|D_t|, k), the largest Jaccard with S_k the sizes allow.

Each of these is printed beside its chance level, what a random set of heads of the step's size scores
(``dynheads.analysis.chance``), because the sizes alone bound several of them. Claim 1's verdict reads three
statistics whose range the set size does not fix, each as its share above chance, (value - chance) /
(ceiling - chance), per step (or pair), then averaged:

- Static containment: |D_t ∩ S_K| / |D_t| with K = max(20, |D_t|) (the top-20, or the static list of the step's
  own size when D_t is larger), chance K/(L·H), ceiling min(1, K/|D_t|) = 1: sets confined to the static list
  score 1 at every size.
- Adjacent share: J(D_t, D_{t+1}) against the Jaccard of random sets of the two sizes, ceiling min/max of the
  sizes: a set that stays put scores 1 at every size. Beside it (printed, not decided on): the Jaccard of step t
  of one sample with step t of another (``cross_sample_jaccard``), what any two answers share.
- Entropy share: (S - ln m) / (S_chance - ln m), m the mean |D_t| over all steps (S >= ln m always; a fixed set of
  m heads scores 0), S_chance the entropy when every step draws a random set of its size (seeded simulation).

The static ranking holds scored heads only (``headlists.scored_heads``): k beyond them is NaN (Table 5 shows
"n/a"), never zero-score filler.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.stats import entropy

from dynheads.analysis.chance import (
    chance_entropy,
    cross_sample_jaccard,
    expected_jaccards,
    jaccard_ceiling,
    share_above_chance,
    static_profile_jaccard,
)
from dynheads.errors import DynheadsError
from dynheads.heads import Head, check_heads, flat_index
from dynheads.paper import ENTROPY_BASELINE
from dynheads.tables import Heading, Table, to_markdown

DEFAULT_KS = (20, 50, 100)


@dataclass(frozen=True)
class DynamismStats:
    """Table 1 / Table 5 numbers for one model. NaN marks a statistic with nothing to average."""

    num_samples: int
    num_steps: int
    total_heads: int  # L * H
    mean_size: float  # mean of |D_t| over all steps
    std_size: float  # population standard deviation (ddof=0) of |D_t|
    unique_heads: int  # |∪_t D_t|
    jaccard_static: dict[int, float]  # k -> mean_t J(D_t, S_k); NaN if the static list has fewer than k heads
    adjacent_jaccard: float  # mean J(D_t, D_{t+1}) over the pairs not skipped; NaN if all were skipped
    adjacent_pairs: int  # pairs averaged
    adjacent_skipped: int  # pairs of two empty sets
    entropy: float  # nats; NaN if no head was ever in a dynamic set
    empty_steps: int  # steps with D_t = ∅
    empty_samples: int = 0  # samples with no generated step (EOS first), left out of every statistic
    containment_k20: float = math.nan  # mean over non-empty steps of |D_t ∩ S_20| / |D_t|
    matched_jaccard: float = math.nan  # mean over non-empty steps of J(D_t, S_|D_t|)
    jaccard_ceiling_k20: float = math.nan  # mean over steps of min(|D_t|, 20) / max(|D_t|, 20)
    static_heads: int = 0  # scored heads in the static ranking
    chance: dict[str, float] = field(default_factory=dict)  # statistic -> its chance level (``chance_levels``)
    static_containment: float = math.nan  # mean over non-empty steps of |D_t ∩ S_max(20,|D_t|)| / |D_t|
    static_containment_share: float = math.nan  # its mean share above chance (Claim 1, rule a)
    adjacent_share: float = math.nan  # mean share above chance of J(D_t, D_{t+1}) (Claim 1, rule b)
    cross_sample_jaccard: float = math.nan  # mean J of step t of one sample with step t of another
    static_profile_jaccard: float = (
        math.nan
    )  # adjacent-step J when each step draws its size from the heads' frequencies
    entropy_floor: float = math.nan  # ln(mean |D_t|): the entropy of a fixed set of that size
    entropy_share: float = math.nan  # (entropy - floor) / (chance entropy - floor) (Claim 1, rule c)

    def to_dict(self) -> dict[str, float | int]:
        """Flat, JSON-ready; Jaccard w/ static appears as ``jaccard_static_k{k}``."""
        return {
            "num_samples": self.num_samples,
            "num_steps": self.num_steps,
            "mean_size": self.mean_size,
            "std_size": self.std_size,
            "unique_heads": self.unique_heads,
            "total_heads": self.total_heads,
            **{f"jaccard_static_k{k}": value for k, value in self.jaccard_static.items()},
            "adjacent_jaccard": self.adjacent_jaccard,
            "adjacent_pairs": self.adjacent_pairs,
            "adjacent_skipped": self.adjacent_skipped,
            "entropy": self.entropy,
            "entropy_baseline": ENTROPY_BASELINE,
            "empty_steps": self.empty_steps,
            "empty_samples": self.empty_samples,
            "containment_k20": self.containment_k20,
            "matched_jaccard": self.matched_jaccard,
            "jaccard_ceiling_k20": self.jaccard_ceiling_k20,
            "static_heads": self.static_heads,
            **{f"{name}_chance": value for name, value in self.chance.items()},
            "static_containment": self.static_containment,
            "static_containment_share": self.static_containment_share,
            "adjacent_share": self.adjacent_share,
            "cross_sample_jaccard": self.cross_sample_jaccard,
            "static_profile_jaccard": self.static_profile_jaccard,
            "entropy_floor": self.entropy_floor,
            "entropy_share": self.entropy_share,
        }


def binarize(scores: np.ndarray, threshold: float = 0.1) -> np.ndarray:
    """Continuous ``[step, layer, head]`` scores (Eq. 2) to dynamic sets: True where score > threshold (a number;
    anything else is refused in one line)."""
    if isinstance(threshold, bool) or not isinstance(threshold, int | float | np.number):
        raise DynheadsError(f"binarize takes a numeric threshold such as 0.1, got {threshold!r}")
    return np.asarray(scores) > threshold


def dynamism_stats(
    dynamic_sets: Sequence[np.ndarray], static_ranking: Sequence[Head], *, ks: Sequence[int] = DEFAULT_KS
) -> DynamismStats:
    """Pool the steps of all samples (each a bool ``[step, layer, head]`` array) and compute Table 1 / 5.

    Samples with no step (EOS first) are left out and counted in ``empty_samples``.
    """
    layers, heads = _check_sets(dynamic_sets)
    check_heads(list(static_ranking), layers, heads, source="static head list")
    flat = [sample.reshape(sample.shape[0], layers * heads) for sample in dynamic_sets if sample.shape[0]]
    if not flat:
        raise DynheadsError(f"the {len(dynamic_sets)} sample(s) have no generated steps: nothing to measure")
    steps = np.concatenate(flat)  # [step, L*H] over all samples
    sizes = steps.sum(axis=1)
    pairs = _adjacent_pairs(flat, layers * heads)
    kept = pairs["union"] > 0
    overlap = _static_overlap(steps, static_ranking, heads)
    nonempty = sizes > 0
    counts = steps.sum(axis=0)
    floor = math.log(sizes.mean()) if sizes.any() else math.nan
    chance = {
        **{key: _nan_mean(overlap[f"{key}_chance"][nonempty]) for key in ("containment_k20", "matched_jaccard")},
        "jaccard_static_k20": _nan_mean(overlap["jaccard_static_k20_chance"]),
        "static_containment": _nan_mean(overlap["static_containment_chance"][nonempty]),
        "adjacent_jaccard": _nan_mean(pairs["chance"][kept]),
        "entropy": chance_entropy(sizes, layers * heads),
    }
    return DynamismStats(
        num_samples=len(flat),
        num_steps=int(steps.shape[0]),
        total_heads=layers * heads,
        mean_size=float(sizes.mean()),
        std_size=float(sizes.std()),
        unique_heads=int(steps.any(axis=0).sum()),
        jaccard_static={k: _jaccard_with_static(steps, static_ranking, k, heads) for k in ks},
        adjacent_jaccard=float(pairs["jaccard"][kept].mean()) if kept.any() else math.nan,
        adjacent_pairs=int(kept.sum()),
        adjacent_skipped=int((~kept).sum()),
        entropy=float(entropy(counts)),  # scipy normalises the counts; NaN if they are all 0
        empty_steps=int((sizes == 0).sum()),
        empty_samples=len(dynamic_sets) - len(flat),
        containment_k20=_nan_mean(overlap["containment_k20"][nonempty]),
        matched_jaccard=_nan_mean(overlap["matched_jaccard"][nonempty]),
        jaccard_ceiling_k20=float((np.minimum(sizes, 20) / np.maximum(sizes, 20)).mean()),
        static_heads=len(static_ranking),
        chance=chance,
        cross_sample_jaccard=cross_sample_jaccard(flat),
        static_profile_jaccard=static_profile_jaccard(pairs["first"], pairs["second"], counts),
        static_containment=_nan_mean(overlap["static_containment"][nonempty]),
        static_containment_share=_nan_mean(overlap["static_containment_share"][nonempty]),
        adjacent_share=_nan_mean(pairs["share"]),
        entropy_floor=floor,
        entropy_share=entropy_share(float(entropy(counts)), floor, chance["entropy"]),
    )


def entropy_share(value: float, floor: float, chance: float) -> float:
    """(entropy - ln m) / (chance entropy - ln m): 0 for a fixed set of m heads, 1 for random sets of the sizes."""
    return float(share_above_chance(np.array(value), np.array(floor), np.array(chance)))


def set_overlap(first: Sequence[np.ndarray], second: Sequence[np.ndarray]) -> dict[str, float]:
    """How two scores' per-step sets of the same traces meet (bool ``[step, layer, head]`` per sample, e.g. W_t
    beside D_t): mean sizes; |A ∩ B| / |A| over steps where A is not empty and |A ∩ B| / |B| where B is not; the
    steps where A has heads and B none (and the reverse); the Jaccard of the steps where either has one."""
    a = np.concatenate([s.reshape(s.shape[0], -1) for s in first]) if first else np.zeros((0, 0), bool)
    b = np.concatenate([s.reshape(s.shape[0], -1) for s in second]) if second else np.zeros((0, 0), bool)
    if a.shape != b.shape:
        raise DynheadsError(f"the two scores' sets differ in shape: {a.shape} and {b.shape}")
    both, size_a, size_b = (a & b).sum(axis=1), a.sum(axis=1), b.sum(axis=1)
    either = (a | b).sum(axis=1)
    return {
        "steps": int(a.shape[0]),
        "mean_size_first": _nan_mean(size_a.astype(float)),
        "mean_size_second": _nan_mean(size_b.astype(float)),
        "first_in_second": _nan_mean(np.where(size_a > 0, both / np.maximum(size_a, 1), np.nan)),
        "second_in_first": _nan_mean(np.where(size_b > 0, both / np.maximum(size_b, 1), np.nan)),
        "first_only_steps": int(((size_a > 0) & (size_b == 0)).sum()),
        "second_only_steps": int(((size_b > 0) & (size_a == 0)).sum()),
        "jaccard": _nan_mean(np.where(either > 0, both / np.maximum(either, 1), np.nan)),
    }


def per_sample_dynamism(dynamic_sets: Sequence[np.ndarray], static_ranking: Sequence[Head]) -> dict[str, list]:
    """Per sample (samples with no step left out): the mean containment in S_20 and size-matched Jaccard over its
    non-empty steps (None when every step is empty), and ``head_counts`` [L*H], the steps each head was in D_t.
    The unit that intervals resample: Claim 1's verdict reads these from dynamism.json."""
    layers, heads = _check_sets(dynamic_sets)
    keys = ("containment_k20", "matched_jaccard", "static_containment_share", "adjacent_share")
    rows: dict[str, list] = {key: [] for key in (*keys, "head_counts", "steps")}
    for sample in dynamic_sets:
        if not sample.shape[0]:
            continue
        steps = sample.reshape(sample.shape[0], layers * heads)
        overlap = _static_overlap(steps, static_ranking, heads)
        overlap["adjacent_share"] = _adjacent_pairs([steps], layers * heads)["share"]
        nonempty = steps.any(axis=1)
        for key in keys:
            value = _nan_mean(overlap[key] if key == "adjacent_share" else overlap[key][nonempty])
            rows[key].append(None if math.isnan(value) else value)
        rows["head_counts"].append(steps.sum(axis=0).astype(int).tolist())
        rows["steps"].append(int(steps.shape[0]))
    return rows


def _static_overlap(steps: np.ndarray, ranking: Sequence[Head], num_heads: int) -> dict[str, np.ndarray]:
    """Per step of ``[step, L*H]`` (NaN for empty steps), each with its chance level (``<key>_chance``): containment
    |D_t ∩ S_k| / |D_t| with k = min(20, scored heads); J(D_t, S_|D_t|) (the static list cut to the step's size, or
    all of it when shorter); the static containment in S_max(20, |D_t|) and its share above chance; and the chance
    Jaccard of the step's set with S_20 (NaN when the list is shorter than 20)."""
    total = steps.shape[1]
    order = np.full(total, np.iinfo(np.int64).max)  # rank of each head in the static list
    order[[flat_index(head, num_heads) for head in ranking]] = np.arange(len(ranking))
    sizes = steps.sum(axis=1)
    top = min(20, len(ranking))
    matched = np.minimum(sizes, len(ranking))  # |S_|D_t||
    wide = np.minimum(np.maximum(sizes, 20), len(ranking))  # |S_max(20, |D_t|)|
    with np.errstate(invalid="ignore", divide="ignore"):
        containment = (steps & (order < top)).sum(axis=1) / sizes
        inter = (steps & (order[None, :] < matched[:, None])).sum(axis=1)
        jaccard = inter / (sizes + matched - inter)
        static = (steps & (order[None, :] < wide[:, None])).sum(axis=1) / sizes
        static_ceiling = np.minimum(1.0, wide / sizes)
    empty = sizes == 0
    return {
        "containment_k20": np.where(empty, np.nan, containment),
        "containment_k20_chance": np.where(empty, np.nan, top / total),
        "matched_jaccard": np.where(empty, np.nan, jaccard),
        "matched_jaccard_chance": np.where(empty, np.nan, expected_jaccards(sizes, matched, total)),
        "static_containment": np.where(empty, np.nan, static),
        "static_containment_chance": np.where(empty, np.nan, wide / total),
        "static_containment_share": share_above_chance(static, wide / total, static_ceiling),
        "jaccard_static_k20_chance": (
            expected_jaccards(sizes, np.full_like(sizes, 20), total)
            if len(ranking) >= 20
            else np.full(len(sizes), np.nan)
        ),
    }


def _nan_mean(values: np.ndarray) -> float:
    values = values[~np.isnan(values)]
    return float(values.mean()) if len(values) else math.nan


def table1(rows: Mapping[str, Mapping[str, float]]) -> Table:
    """Table 1's columns; ``rows`` maps a model name to ``to_dict()`` (or a paper row)."""
    lines = [
        [
            name,
            f"{_fmt(row, 'mean_size', '.2f')} ± {_fmt(row, 'std_size', '.2f')}",
            f"{_fmt(row, 'unique_heads', '.0f')} / {_fmt(row, 'total_heads', '.0f')}",
            _fmt(row, "jaccard_static_k20", ".4f"),
            _fmt(row, "adjacent_jaccard", ".4f"),
            _fmt(row, "entropy", ".4f"),
        ]
        for name, row in rows.items()
    ]
    return Table(["Model", "Mean ± Std", "Unique / Total", "Jaccard w/ Static", "Adj. Jaccard", "Entropy"], lines)


def chance_table(stats: DynamismStats) -> Table:
    """Every Claim 1 statistic beside its chance level (a random set of heads of each step's size), the ceiling
    the sizes allow where they bound it, and the share above chance the verdict reads."""
    chance, size = stats.chance, stats.mean_size
    rows: list[list] = [
        [
            "Jaccard w/ static top-20",
            stats.jaccard_static.get(20, math.nan),
            chance.get("jaccard_static_k20"),
            stats.jaccard_ceiling_k20,
            None,
        ],
        [
            "containment in the top-20",
            stats.containment_k20,
            chance.get("containment_k20"),
            min(1.0, 20 / size) if size else math.nan,
            None,
        ],
        ["size-matched Jaccard", stats.matched_jaccard, chance.get("matched_jaccard"), 1.0, None],
        [
            "containment in the top-max(20, |D_t|) (rule a)",
            stats.static_containment,
            chance.get("static_containment"),
            1.0,
            stats.static_containment_share,
        ],
        [
            "adjacent-step Jaccard (rule b)",
            stats.adjacent_jaccard,
            chance.get("adjacent_jaccard"),
            1.0,
            stats.adjacent_share,
        ],
        ["step t of another sample (null of rule b)", stats.cross_sample_jaccard, None, 1.0, None],
        [
            "adjacent steps under a static profile (each step draws its size from the heads' frequencies)",
            stats.static_profile_jaccard,
            None,
            1.0,
            None,
        ],
        [
            "entropy, nats (rule c; floor ln(mean |D_t|))",
            stats.entropy,
            chance.get("entropy"),
            stats.entropy_floor,
            stats.entropy_share,
        ],
    ]
    return Table(
        ["statistic", "ours", "chance", "ceiling (entropy: floor)", "share above chance"],
        rows,
        float_format=".4f",
        missing="–",
    )


def chance_blocks(stats: DynamismStats) -> list:
    """The summary's section on chance levels: a heading, what chance means here, and ``chance_table``."""
    return [
        Heading("Claim 1 statistics beside their chance level"),
        "Chance: a random set of heads of each step's size (Jaccard exact, entropy by seeded simulation). "
        "Share above chance = (ours - chance) / (ceiling - chance); the verdict reads rules a-c.",
        chance_table(stats),
    ]


def table5(rows: Mapping[str, Mapping[str, float]], ks: Sequence[int] = DEFAULT_KS) -> Table:
    """Table 5's columns: Jaccard with the static top-k for each k."""
    return Table(
        ["Model", *(f"Jaccard (k={k})" for k in ks)],
        [[name, *(_fmt(row, f"jaccard_static_k{k}", ".4f") for k in ks)] for name, row in rows.items()],
    )


def table1_markdown(rows: Mapping[str, Mapping[str, float]]) -> str:
    """Markdown table in Table 1's columns; ``rows`` maps a model name to ``to_dict()`` (or a paper row)."""
    return to_markdown(table1(rows)) + "\n"


def table5_markdown(rows: Mapping[str, Mapping[str, float]], ks: Sequence[int] = DEFAULT_KS) -> str:
    """Markdown table in Table 5's columns: Jaccard with the static top-k for each k."""
    return to_markdown(table5(rows, ks)) + "\n"


def dynamism_csv(rows: Mapping[str, Mapping[str, float]]) -> str:
    """One CSV line per model with every key of the rows (empty where a row lacks it)."""
    return pd.DataFrame.from_dict(dict(rows), orient="index").to_csv(index_label="model")


def _check_sets(dynamic_sets: Sequence[np.ndarray]) -> tuple[int, int]:
    """Every sample must be a bool ``[step, layer, head]`` array of one model; returns (layers, heads)."""
    if not dynamic_sets:
        raise DynheadsError("no samples given: dynamism needs at least one traced sample")
    shapes = {sample.shape[1:] for sample in dynamic_sets if sample.ndim == 3}
    if len(shapes) != 1 or any(sample.ndim != 3 for sample in dynamic_sets):
        raise DynheadsError(
            f"dynamic sets must be [step, layer, head] arrays of one model; got (layer, head) shapes {sorted(shapes)}"
        )
    if any(sample.dtype != np.bool_ for sample in dynamic_sets):
        raise DynheadsError("dynamic sets must be boolean; turn continuous scores into sets with binarize()")
    layers, heads = shapes.pop()
    return int(layers), int(heads)


def _adjacent_pairs(flat: Sequence[np.ndarray], total: int) -> dict[str, np.ndarray]:
    """Every consecutive pair within each sample, concatenated: ``union`` |D_t ∪ D_{t+1}| (0 for two empty sets,
    which have no Jaccard), and over the other pairs ``jaccard``, ``chance`` (random sets of the two sizes) and
    ``share`` above chance (NaN where one set is empty: the ceiling is 0)."""
    pairs = [(sample[:-1], sample[1:]) for sample in flat if sample.shape[0] > 1]
    if not pairs:
        return {key: np.zeros(0) for key in ("union", "jaccard", "chance", "share", "first", "second")}
    inter = np.concatenate([(a & b).sum(axis=1) for a, b in pairs])
    union = np.concatenate([(a | b).sum(axis=1) for a, b in pairs])
    first = np.concatenate([a.sum(axis=1) for a, _ in pairs])
    second = np.concatenate([b.sum(axis=1) for _, b in pairs])
    kept = union > 0
    jaccard = np.divide(inter, union, out=np.full(len(union), np.nan), where=kept)
    chance = np.full(len(union), np.nan)
    chance[kept] = expected_jaccards(first[kept], second[kept], total)
    share = share_above_chance(jaccard, chance, jaccard_ceiling(first, second))
    return {
        "union": union,
        "jaccard": jaccard,
        "chance": chance,
        "share": share[kept],
        "first": first,
        "second": second,
    }


def _jaccard_with_static(steps: np.ndarray, ranking: Sequence[Head], k: int, num_heads: int) -> float:
    """Mean over ``[step, L*H]`` sets of J(D_t, S_k); the union is never empty since |S_k| = k > 0."""
    if k <= 0:
        raise ValueError(f"k must be positive, got {k}")
    if len(ranking) < k:
        return math.nan
    static = np.zeros(steps.shape[1], dtype=bool)
    static[[flat_index(head, num_heads) for head in ranking[:k]]] = True
    return float(((steps & static).sum(axis=1) / (steps | static).sum(axis=1)).mean())


def _fmt(row: Mapping[str, float], key: str, spec: str) -> str:
    value = row.get(key, math.nan)
    return "n/a" if math.isnan(value) else format(value, spec)
