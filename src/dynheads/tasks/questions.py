"""Disjoint question streams: each consumer of a question source takes its own named range of it.

A question source is an ordered list of records that carry an ``id`` (HotpotQA records, or any multi-hop task
that plugs into the same source). A ``QuestionStream`` is a named index range ``[first, first + count)`` of it.
Experiments that fit something (static reasoning heads, the probe) and experiments that evaluate it (ablation,
RAG) take different streams, so no question is both fitted on and evaluated on; ``disjoint_streams`` lays
ranges end to end, and ``refuse_overlap`` checks the recorded ids of two runs before one is used on the other.

A question is its source record's id: one question traced in several grid cells is one question.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from dynheads.errors import DynheadsError

Record = TypeVar("Record")  # a source's record (HaluEval's are plain dicts): ``take`` reads none of its fields


@dataclass(frozen=True)
class QuestionStream:
    """Questions ``first .. first + count - 1`` of a source, under a name (``analysis``, ``static``, ``rag``...)."""

    name: str
    first: int
    count: int

    def __post_init__(self) -> None:
        if self.first < 0 or self.count < 1:
            raise DynheadsError(
                f"question stream {self.name!r} needs first >= 0 and at least one question, "
                f"got first={self.first}, questions={self.count}"
            )

    @property
    def stop(self) -> int:
        return self.first + self.count

    def take(self, records: Sequence[Record], source: str) -> list[Record]:
        """This stream's records of ``records``; refuses a source too short to hold the whole range."""
        if len(records) < self.stop:
            raise DynheadsError(
                f"{source} holds {len(records)} questions, but stream {self.name!r} needs questions "
                f"{self.first}..{self.stop - 1} (first={self.first}, questions={self.count})"
            )
        return list(records[self.first : self.stop])

    def describe(self, ids: Sequence[str]) -> dict:
        """What a run's manifest records about the questions it used."""
        return {"split": self.name, "first": self.first, "count": self.count, "ids": list(ids)}


def disjoint_streams(sizes: Sequence[tuple[str, int]], first: int = 0) -> dict[str, QuestionStream]:
    """Named streams laid end to end from ``first``: disjoint by construction, in the given order."""
    streams: dict[str, QuestionStream] = {}
    for name, count in sizes:
        if name in streams:
            raise DynheadsError(f"question stream {name!r} is named twice")
        streams[name] = QuestionStream(name, first, count)
        first += count
    return streams


def overlap(first_ids: Iterable[str], second_ids: Iterable[str]) -> list[str]:
    """Ids in both, sorted."""
    return sorted(set(first_ids) & set(second_ids))


def refuse_overlap(
    fit_ids: Iterable[str], fit_what: str, eval_ids: Iterable[str], eval_what: str, shown: int = 5
) -> None:
    """One-line ``DynheadsError`` naming the first few shared question ids and their count, if any."""
    shared = overlap(fit_ids, eval_ids)
    if shared:
        more = f" and {len(shared) - shown} more" if len(shared) > shown else ""
        raise DynheadsError(
            f"{fit_what} was fitted on {len(shared)} of the questions {eval_what} evaluates "
            f"({', '.join(shared[:shown])}{more}): evaluate on a disjoint stream (e.g. --first past its questions) "
            "or refit it on other questions"
        )
