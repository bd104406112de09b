"""What the report is made of: its parts (the report's own markdown text, a stage's blocks, figures, verdicts, the
verdict cards) and its sections. ``dynheads.report.sections`` says what each section holds, ``dynheads.report.render``
writes them as markdown and HTML."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from dynheads.report.claims import Verdict
from dynheads.report.headline import Headline
from dynheads.tables import Heading, Items, Table
from dynheads.tasks.registry import Task


@dataclass(frozen=True)
class Figure:
    path: Path
    caption: str


@dataclass(frozen=True)
class Cards:
    """The first screen: one card per verdict."""

    headlines: list[Headline]


@dataclass(frozen=True)
class Plain:
    """A paragraph of a stage's text: shown as it is (escaped in HTML), never read as markdown."""

    text: str


# the report's own markdown text, a stage's blocks (paragraph, heading, list, table), an image, a claim's verdict,
# the cards
Part = str | Plain | Heading | Items | Table | Figure | Verdict | Cards


@dataclass(frozen=True)
class Section:
    anchor: str
    title: str
    parts: list[Part]
    task: Task | None = None  # the task whose stages the section shows (its verdict cards set the paper beside it)
    card_figure: tuple[str, tuple[str, ...]] = ("", ())  # its verdict cards' figure (``ReportSection``)

    @property
    def verdicts(self) -> list[Verdict]:
        return [part for part in self.parts if isinstance(part, Verdict)]
