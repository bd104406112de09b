"""Read and write the published head-list files.

Two formats are read (``load_head_list`` tells them apart by the top-level JSON type):

- **Wu et al. scores** (a JSON object), as in their ``head_score/*.json``:
  ``{"<layer>-<head>": [score per counted test, ...], ...}``. Ranking = mean of each list, highest first.
  ``save_head_scores`` writes this format byte for byte as their code does: ``json.dump`` on one line, no
  trailing newline, a zero written ``0`` (their accumulator starts as the integer 0), other scores as floats.
  LOCOS's releases (arXiv 2607.01002, ``retrieval_heads/<model>.json``) use the same object, bare or inside an
  envelope ``{"meta": {...}, "scores": {"<layer>-<head>": [...]}}``; the envelope's ``meta`` is not read. Its
  write scores may be negative: ``scored_heads`` keeps the positive ones.
- **A ranked list** (a JSON array), best head first, as QRHead publishes its heads. Each entry is one of
  ``"layer-head"`` (also ``"L12-H3"``), ``[layer, head]`` (two integers), or ``["layer-head", score]``
  (the ``[head, score]`` pairs its detection script writes). Ranking = file order.

Heads are zero-based (layer, query head) everywhere.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from dynheads.errors import DynheadsError
from dynheads.heads import Head, check_heads, head_key, parse_head
from dynheads.io import write_text

HeadListFormat = Literal["wu", "ranked"]


@dataclass(frozen=True)
class RankedHeads:
    """Heads ranked best first, as read from a head-list file."""

    heads: tuple[Head, ...]
    scores: tuple[float, ...] | None  # one per head, same order; None when the file gives only the order
    test_scores: dict[Head, tuple[float, ...]] | None  # Wu format only: per counted test, in file order
    format: HeadListFormat
    source: str  # the file it came from

    def top(self, k: int) -> list[Head]:
        """The ``k`` best heads (all of them if the list is shorter)."""
        return list(self.heads[:k])


def scored_heads(ranked: RankedHeads) -> tuple[Head, ...]:
    """The ranking without its zero-score tail: heads whose score is positive (every head of a list that gives
    only the order). A zero-score head is not a static head; consumers must never use it as filler."""
    if ranked.scores is None:
        return ranked.heads
    return tuple(head for head, score in zip(ranked.heads, ranked.scores, strict=True) if score > 0)


def rank_by_score(scores: Mapping[Head, float]) -> tuple[Head, ...]:
    """Heads by score, highest first; ties broken by (layer, head) ascending so the order is deterministic."""
    return tuple(sorted(scores, key=lambda head: (-scores[head], head)))


def save_head_scores(path: str | Path, test_scores: Mapping[Head, Sequence[float]]) -> None:
    """Write Wu et al.'s format (heads in the mapping's order), atomically."""
    data = {head_key(head): [_published_number(value) for value in values] for head, values in test_scores.items()}
    write_text(path, json.dumps(data))


def load_head_list(path: str | Path, num_layers: int | None = None, num_heads: int | None = None) -> RankedHeads:
    """Read either head-list format; with the model's size given, refuse heads the model does not have."""
    if (num_layers is None) != (num_heads is None):
        raise ValueError("give both num_layers and num_heads, or neither")
    source = str(path)
    data = _read_json(source)
    if isinstance(data, dict) and isinstance(data.get("scores"), dict):  # LOCOS's envelope around Wu's object
        data = data["scores"]
    if isinstance(data, dict):
        ranked = _from_wu(data, source)
    elif isinstance(data, list):
        ranked = _from_ranked_list(data, source)
    else:
        raise DynheadsError(
            f"{source}: expected a JSON object (Wu et al. scores) or a list of heads, found {type(data).__name__}"
        )
    if num_layers is not None and num_heads is not None:
        check_heads(list(ranked.heads), num_layers, num_heads, source=source)
    return ranked


def _read_json(source: str) -> Any:
    try:
        text = Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise DynheadsError(f"cannot read head list {source}: {error}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as error:
        raise DynheadsError(
            f"{source} is not valid JSON: {error.msg} (line {error.lineno}, column {error.colno})"
        ) from None


def _from_wu(data: dict[str, Any], source: str) -> RankedHeads:
    if not data:
        raise DynheadsError(
            f"{source} lists no heads (an empty file is what a run writes when no test passed the success filter)"
        )
    test_scores: dict[Head, tuple[float, ...]] = {}
    for key, values in data.items():
        head = _parse(key, source)
        if not isinstance(values, list) or not values or not all(_is_number(v) for v in values):
            raise DynheadsError(f"{source}: head {key!r} needs a non-empty list of scores, found {values!r:.60}")
        if head in test_scores:
            raise DynheadsError(f"{source}: head {key!r} appears twice")
        test_scores[head] = tuple(float(v) for v in values)
    means = {head: float(np.mean(values)) for head, values in test_scores.items()}
    heads = rank_by_score(means)
    return RankedHeads(
        heads=heads, scores=tuple(means[h] for h in heads), test_scores=test_scores, format="wu", source=source
    )


def _from_ranked_list(data: list[Any], source: str) -> RankedHeads:
    if not data:
        raise DynheadsError(f"{source} lists no heads")
    heads, scores = [], []
    for entry in data:
        head, score = _ranked_entry(entry, source)
        heads.append(head)
        scores.append(score)
    duplicates = sorted(head for head, count in Counter(heads).items() if count > 1)
    if duplicates:
        raise DynheadsError(f"{source}: heads listed more than once: {', '.join(map(head_key, duplicates))}")
    given = [s for s in scores if s is not None]
    if given and len(given) < len(scores):
        raise DynheadsError(f"{source}: some entries have a score and some do not")
    return RankedHeads(
        heads=tuple(heads),
        scores=tuple(given) if len(given) == len(scores) else None,
        test_scores=None,
        format="ranked",
        source=source,
    )


def _ranked_entry(entry: Any, source: str) -> tuple[Head, float | None]:
    """``"l-h"`` -> (head, None); ``[l, h]`` -> (head, None); ``["l-h", score]`` -> (head, score)."""
    if isinstance(entry, str):
        return _parse(entry, source), None
    if isinstance(entry, list) and len(entry) == 2:
        first, second = entry
        if isinstance(first, str) and _is_number(second):
            return _parse(first, source), float(second)
        if type(first) is int and type(second) is int and first >= 0 and second >= 0:
            return (first, second), None
    raise DynheadsError(
        f'{source}: cannot read list entry {entry!r:.60}; expected "layer-head", [layer, head] or ["layer-head", score]'
    )


def _parse(text: str, source: str) -> Head:
    try:
        return parse_head(text)
    except DynheadsError as error:
        raise DynheadsError(f"{source}: {error}") from None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _published_number(value: float) -> int | float:
    """Zero as ``0`` and everything else as a float, as the reference code's accumulators come out."""
    return 0 if value == 0 else float(value)
