"""Chance level and failure modes of a task whose answer is one of several same-form candidates in the context.

A sample of such a task records its candidates (``meta["candidates"]``: the gold value and every distractor value
of the same form, in the order they appear in the context) and its gold answer. From those alone:

- **chance** with the context visible: an answer drawn at random from the sample's candidates is right with
  probability 1 / (number of candidates); the expected EM of that guesser is the mean over samples.
- **position heuristics**: "answer the first candidate" / "answer the last candidate" in the context; their EM
  is the share of samples whose gold value is the first / last candidate (1 / candidates when fact order is
  balanced).
- **distractor share**: of the wrong answers, the share whose extracted answer equals a distractor's value (the
  model retrieved the wrong fact rather than nothing or noise).

Every task with candidates scores ``is_distractor`` into its per-sample metrics (``metrics.distractor``) and
every table of such a task reads ``summarise`` (one place, tested on constructed samples).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

CANDIDATES = "candidates"  # the ``meta`` key: same-form values in the context, in context order
GOLD_RANK = "gold_rank"  # the ``meta`` key: the gold value's index among them (fact order)


def _identity(text: str) -> str:
    return text


def is_distractor(
    prediction: str, answer: str, candidates: Sequence[str], normalise: Callable[[str], str] = _identity
) -> float:
    """1.0 when ``prediction`` equals (after ``normalise``) a candidate that is not the gold answer, else 0.0."""
    guess, gold = normalise(prediction), normalise(answer)
    return float(guess != gold and any(guess == normalise(c) for c in candidates if normalise(c) != gold))


def chance_level(candidates: Iterable[Sequence[str]]) -> float:
    """Expected EM of an answer drawn uniformly from each sample's candidates: mean of 1 / len(candidates)."""
    sizes = [len(c) for c in candidates]
    if not sizes or min(sizes) < 1:
        return float("nan")
    return float(np.mean([1.0 / size for size in sizes]))


def summarise(records: Sequence[Mapping], metric: str = "em") -> dict[str, float | int]:
    """Chance, position heuristics and the distractor share of finished records (``answer``,
    ``meta.candidates``, ``metrics.<metric>``, ``metrics.distractor``). Records without candidates are left out
    (``n`` counts the rest); NaN where nothing is defined (no records, no wrong answers)."""
    rows = [r for r in records if (r.get("meta") or {}).get(CANDIDATES)]
    if not rows:
        return {
            "n": 0,
            "model": float("nan"),
            "chance": float("nan"),
            "first": float("nan"),
            "last": float("nan"),
            "wrong": 0,
            "distractor_share": float("nan"),
        }
    candidates = [r["meta"][CANDIDATES] for r in rows]
    correct = [float(r["metrics"][metric]) for r in rows]
    wrong = [r for r, ok in zip(rows, correct, strict=True) if ok < 1.0]
    return {
        "n": len(rows),
        "model": float(np.mean(correct)),
        "chance": chance_level(candidates),
        "first": float(np.mean([c[0] == r["answer"] for r, c in zip(rows, candidates, strict=True)])),
        "last": float(np.mean([c[-1] == r["answer"] for r, c in zip(rows, candidates, strict=True)])),
        "wrong": len(wrong),
        "distractor_share": (
            float(np.mean([float(r["metrics"].get("distractor", 0.0)) for r in wrong])) if wrong else float("nan")
        ),
    }


def by_gold_rank(records: Sequence[Mapping], metric: str = "em") -> dict[int, tuple[int, float]]:
    """Fact order: gold rank among the candidates -> (samples, mean ``metric``)."""
    groups: dict[int, list[float]] = {}
    for r in records:
        rank = (r.get("meta") or {}).get(GOLD_RANK)
        if rank is not None:
            groups.setdefault(int(rank), []).append(float(r["metrics"][metric]))
    return {rank: (len(v), float(np.mean(v))) for rank, v in sorted(groups.items())}


def gaps(records: Sequence[Mapping], metric: str = "em") -> dict[str, np.ndarray]:
    """Per-sample paired differences of the model against each baseline (model - chance, - first, - last): what
    ``interval`` bootstraps over whole samples."""
    rows = [r for r in records if (r.get("meta") or {}).get(CANDIDATES)]
    model = np.array([float(r["metrics"][metric]) for r in rows])
    cands = [r["meta"][CANDIDATES] for r in rows]
    return {
        "chance": model - np.array([1.0 / len(c) for c in cands]),
        "first": model - np.array([float(c[0] == r["answer"]) for r, c in zip(rows, cands, strict=True)]),
        "last": model - np.array([float(c[-1] == r["answer"]) for r, c in zip(rows, cands, strict=True)]),
    }


def interval(values: Sequence[float] | np.ndarray, seed: int = 0, resamples: int = 2000) -> tuple[float, float]:
    """95 % percentile bootstrap interval of the mean over whole samples (``scipy.stats.bootstrap``, seeded);
    NaNs below two samples; the value itself when every sample has the same value (nothing to resample)."""
    from scipy.stats import bootstrap

    data = np.asarray(values, dtype=float)
    if data.size < 2:
        return float("nan"), float("nan")
    if np.all(data == data[0]):
        return float(data[0]), float(data[0])
    result = bootstrap(
        (data,),
        np.mean,
        n_resamples=resamples,
        confidence_level=0.95,
        method="percentile",
        rng=np.random.default_rng(seed),
    )
    return float(result.confidence_interval.low), float(result.confidence_interval.high)
