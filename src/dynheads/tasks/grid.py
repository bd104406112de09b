"""What every task's grid builder returns (``TaskGrid``) and what question tasks share to build one.

Each task module has its grid builder (``niah.niah_grid``, ``hotpotqa.hotpotqa_grid``, ...). A builder takes the
command's config (read by attribute: ``NiahConfig``, ``HotpotConfig`` or any object with the same fields) and a
tokenizer, and returns a ``TaskGrid``. Question tasks read one named stream of their source (``split``,
``first``, ``questions``; ``dynheads.tasks.questions``): the grid records the stream and its question ids, so
runs that fit something (static reasoning heads, probes) can be checked against runs that evaluate it.
(question, cell) pairs whose gold paragraphs exceed the cell's length are skipped and counted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import product
from typing import Any

from dynheads.errors import DynheadsError
from dynheads.seeding import derive_seed
from dynheads.tasks.candidates import gold_rank_of
from dynheads.tasks.questions import QuestionStream
from dynheads.tasks.sample import Sample


@dataclass(frozen=True)
class TaskGrid:
    """The samples of a grid run; for question tasks the stream, its question ids and the skipped pairs."""

    samples: list[Sample]
    stream: QuestionStream | None = None  # None: the task has no question stream (NIAH)
    question_ids: list[str] = field(default_factory=list)  # record ids of the stream, in source order
    skipped: list[dict] = field(default_factory=list)  # {"record_id", "length", "depth", "reason"} per pair
    source: dict = field(default_factory=dict)  # where the questions come from (a packaged set: wheels, sha256)

    def skip_counts(self) -> dict:
        """Skipped pairs in total, by reason and by cell ("length/depth"): what outputs report."""
        return {
            "count": len(self.skipped),
            "by_reason": dict(Counter(item["reason"] for item in self.skipped)),
            "by_cell": dict(Counter(f"{item['length']}/{item['depth']:g}" for item in self.skipped)),
        }

    def manifest(self) -> dict:
        """The manifest entries of a question task: its questions (split, range, ids) and skips ({} for NIAH)."""
        if self.stream is None:
            return {}
        return {
            "questions": self.stream.describe(self.question_ids),
            "skipped": {**self.skip_counts(), "pairs": self.skipped},
            **({"source": self.source} if self.source else {}),
        }

    def skip_note(self) -> str:
        """One line for markdown and CLI output ('' when nothing was skipped)."""
        if not self.skipped:
            return ""
        reasons = "; ".join(f"{count} {reason}" for reason, count in self.skip_counts()["by_reason"].items())
        return f"{len(self.skipped)} (question, cell) pairs skipped ({reasons}); their cells count no sample"


def question_stream(config: Any) -> QuestionStream:
    """Questions ``first .. first + questions - 1`` of the config's data, named ``split``."""
    return QuestionStream(config.split, config.first, config.questions)


def grid_cells(config: Any) -> list[tuple[int, float]]:
    """The (length, depth) cells a question task spreads its stream over; an empty grid is an error."""
    cells = list(product(config.lengths, config.depths))
    if not cells:
        raise DynheadsError("the HotpotQA grid is empty: give at least one length and one depth")
    return cells


@dataclass(frozen=True)
class QuestionGrid:
    """A generated task's questions ``first .. first + questions - 1``, spread over the (length, depth) cells and
    seeded from ``seed`` (``generated_questions``)."""

    lengths: tuple[int, ...]
    depths: tuple[float, ...]
    seed: int
    questions: int
    first: int = 0


@dataclass(frozen=True)
class GeneratedQuestion:
    """Where a generated question of a stream goes and how it is drawn (``generated_questions``)."""

    length: int  # its cell's context length in tokens
    depth: float  # its cell's depth
    seed: int  # its own seed, from the index alone
    gold_rank: int  # where its gold fact stands among the same-form candidates (``candidates.gold_rank_of``)
    sample_id: str


def generated_questions(source: str, grid: QuestionGrid, candidates: int) -> list[GeneratedQuestion]:
    """The questions of ``grid`` for a generated task ``source`` (multihop, RULER's): question i goes to cell
    i mod (lengths x depths), as HotpotQA's grid, is seeded by i alone (so disjoint index ranges are disjoint
    questions) and has gold rank ``gold_rank_of(i, cells, candidates)``."""
    cells = list(product(grid.lengths, grid.depths))
    if not cells or grid.questions < 1:
        raise DynheadsError(f"the {source} grid is empty: give at least one length, one depth and questions >= 1")
    placed = []
    for index in range(grid.first, grid.first + grid.questions):
        length, depth = cells[index % len(cells)]
        placed.append(
            GeneratedQuestion(
                length=length,
                depth=depth,
                seed=derive_seed(source, grid.seed, index),
                gold_rank=gold_rank_of(index, len(cells), candidates),
                sample_id=f"q{index:04d}-len{length}-depth{depth:g}",
            )
        )
    return placed


def generated_task_grid(config: Any, samples_of: Callable[[QuestionGrid], list[Sample]]) -> TaskGrid:
    """A generated task's grid: the config's question stream over its cells, its samples built by ``samples_of``
    (``generated_questions`` refuses an empty grid, naming the task)."""
    stream = question_stream(config)
    grid = QuestionGrid(tuple(config.lengths), tuple(config.depths), config.seed, stream.count, stream.first)
    samples = samples_of(grid)
    return TaskGrid(samples, stream, [sample.record_id for sample in samples])
