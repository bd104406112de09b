"""Chance level and failure modes of a task whose answer is one of several same-form candidates in the context.

A sample of such a task records its candidates (``meta["candidates"]``: the gold value and every distractor value
of the same form, in the order they appear in the context) and its gold answer. From those alone:

- **chance** with the context visible: an answer drawn at random from the sample's candidates is right with
  probability 1 / (number of candidates); the expected EM of that guesser is the mean over samples.
- **fact order**: "answer the first candidate" / "answer the last candidate" in the context; their EM is the share
  of samples whose gold value is the first / last candidate: 1 / candidates *by construction* once fact order is
  balanced (``gold_rank_of``), so they can no longer find a shortcut.
- **position heuristics that could work** (``HEURISTICS``), from each candidate's position in the context
  (``meta["candidate_depths"]``, a share of the context, in context order): the last candidate in the first half,
  the first in the second half, the one nearest the middle, the most isolated one. A task that places its gold
  fact somewhere particular (the first half, say) lets one of them beat chance; ``balanced_positions`` places
  every candidate so that none can.
- **gold position**: accuracy by the third of the context the gold candidate sits in (``by_gold_third``).
- **distractor share**: of the wrong answers, the share whose extracted answer equals a distractor's value (the
  model retrieved the wrong fact rather than nothing or noise).

Every task with candidates scores ``is_distractor`` into its per-sample metrics (``metrics.distractor``) and
every table of such a task reads ``summarise`` (one place, tested on constructed samples).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from dynheads.errors import DynheadsError

CANDIDATES = "candidates"  # the ``meta`` key: same-form values in the context, in context order
GOLD_RANK = "gold_rank"  # the ``meta`` key: the gold value's index among them (fact order)
DEPTHS = "candidate_depths"  # the ``meta`` key: each candidate's position over the context (0..1), context order
THIRDS = ("first", "middle", "last")  # the thirds of the context, in order


def gold_rank_of(index: int, cells: int, candidates: int) -> int:
    """Question ``index``'s gold rank: (cell + round) mod candidates, where question i sits in cell i mod cells
    of round i div cells. Within a round consecutive cells take consecutive ranks, and each cell steps through
    every rank over consecutive rounds, so neither the stream nor a cell leans to one fact order."""
    cells = max(cells, 1)
    return (index % cells + index // cells) % candidates


def balanced_positions(rng: random.Random, count: int, rank: int) -> list[float]:
    """Positions (shares of the context, 0..1) of ``count`` candidates, the gold one first, then the others in the
    order they appear: ``count`` uniform draws, sorted, the gold one taking the ``rank``-th. The positions are
    exchangeable, so no rule on positions alone finds the gold one more often than 1 / count, and with ranks
    cycling (``gold_rank_of``) the gold position is uniform over the whole context (a mixture of the order
    statistics of uniforms is uniform)."""
    if not 0 <= rank < count:
        raise DynheadsError(f"gold rank must be in 0..{count - 1}, got {rank}")
    drawn = sorted(rng.random() for _ in range(count))
    return [drawn[rank], *drawn[:rank], *drawn[rank + 1 :]]


def _last_in_first_half(depths: Sequence[float]) -> int:
    early = [i for i, d in enumerate(depths) if d < 0.5]
    return early[-1] if early else 0


def _first_in_second_half(depths: Sequence[float]) -> int:
    late = [i for i, d in enumerate(depths) if d >= 0.5]
    return late[0] if late else len(depths) - 1


def _nearest_middle(depths: Sequence[float]) -> int:
    return int(np.argmin([abs(d - 0.5) for d in depths]))


def _most_isolated(depths: Sequence[float]) -> int:
    edges = [0.0, *depths, 1.0]
    return int(np.argmax([min(edges[i + 1] - edges[i], edges[i + 2] - edges[i + 1]) for i in range(len(depths))]))


# name -> rule: candidate depths in context order -> the index of the candidate it answers
HEURISTICS: dict[str, Callable[[Sequence[float]], int]] = {
    "last candidate in the first half (else the first)": _last_in_first_half,
    "first candidate in the second half (else the last)": _first_in_second_half,
    "candidate nearest the middle": _nearest_middle,
    "most isolated candidate": _most_isolated,
}


def third_of(depth: float) -> str:
    """The third of the context a position (0..1) sits in."""
    return THIRDS[min(int(depth * 3), 2)]


def _with_depths(records: Sequence[Mapping]) -> list[Mapping]:
    return [r for r in records if (r.get("meta") or {}).get(DEPTHS)]


def heuristic_hits(records: Sequence[Mapping]) -> dict[str, np.ndarray]:
    """Per heuristic, whether it answers each record's gold value (1.0 / 0.0), over records with candidate depths."""
    rows = _with_depths(records)
    return {
        name: np.array([float(r["meta"][CANDIDATES][rule(r["meta"][DEPTHS])] == r["answer"]) for r in rows])
        for name, rule in HEURISTICS.items()
    }


def heuristic_rates(records: Sequence[Mapping]) -> dict[str, float]:
    """Each position heuristic's EM over the records with candidate depths (empty when none has them)."""
    return {name: float(hits.mean()) for name, hits in heuristic_hits(records).items() if hits.size}


def by_gold_third(records: Sequence[Mapping], metric: str = "em") -> dict[str, tuple[int, float]]:
    """Gold position: the third of the context the gold candidate sits in -> (samples, mean ``metric``)."""
    groups: dict[str, list[float]] = {third: [] for third in THIRDS}
    for r in _with_depths(records):
        meta = r["meta"]
        groups[third_of(meta[DEPTHS][meta[CANDIDATES].index(r["answer"])])].append(float(r["metrics"][metric]))
    return {third: (len(v), float(np.mean(v)) if v else float("nan")) for third, v in groups.items()}


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
    """Per-sample paired differences of the model against each baseline (model - chance, - first, - last, and -
    each position heuristic over the samples with candidate depths): the per-sample values whose mean the summary's
    intervals are of."""
    rows = [r for r in records if (r.get("meta") or {}).get(CANDIDATES)]
    model = np.array([float(r["metrics"][metric]) for r in rows])
    cands = [r["meta"][CANDIDATES] for r in rows]
    placed = _with_depths(rows)
    placed_model = np.array([float(r["metrics"][metric]) for r in placed])
    return {
        "chance": model - np.array([1.0 / len(c) for c in cands]),
        "first": model - np.array([float(c[0] == r["answer"]) for r, c in zip(rows, cands, strict=True)]),
        "last": model - np.array([float(c[-1] == r["answer"]) for r, c in zip(rows, cands, strict=True)]),
        **{name: placed_model - hits for name, hits in heuristic_hits(placed).items() if hits.size},
    }
