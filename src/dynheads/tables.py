"""Tables and stage summaries as data, and the one renderer that writes them as markdown and HTML.

A stage of ``dynheads reproduce`` describes its results as a ``Summary`` (a title, key numbers, and structured
blocks: paragraphs of plain text, ``Heading``, ``Items`` and ``Table``) and writes it with ``write_summary``: the
markdown file people read (``summary.md``, ``cca.md``, ...) and the same document as data in the folder's
``summary.json``, which the report reads (``read_summaries``) and renders block by block as markdown and HTML
(tables with the same ``to_markdown`` / ``to_html``); no stage text is ever parsed as markdown
(docs/formats.md, "summary.json").

``summary.json``::

    {"format": 2,
     "documents": {"cca.md": {"title": null, "numbers": {...},
                              "blocks": [{"text": "..."}, {"heading": "Table 1", "level": 2}, {"items": ["..."]},
                                         {"table": {"columns": [...], "rows": [[...]],
                                                    "formats": {"top-1": ".3f"}, "missing": ""}}]}}}

One file per folder, one document per markdown file it rendered (a run folder can hold ``dynamism.md`` and
``cca.md`` side by side).
"""

from __future__ import annotations

import html
import math
import numbers
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from pandas.api.types import is_float_dtype, is_integer_dtype

from dynheads.errors import DynheadsError
from dynheads.io import format_version, read_json, write_json, write_text

SUMMARY_FILE = "summary.json"
# 1: text blocks held markdown (headings and lists inside text); 2: headings and lists are blocks of their own
SUMMARY_FORMAT = 2
Cell = str | int | float | bool | None


@dataclass(frozen=True)
class Table:
    """``rows[i][j]`` is the cell of column ``columns[j]``: text as it is shown, or a number formatted with
    ``formats[column]`` (a ``format()`` spec; ints without one as ``str``, floats without one with
    ``float_format``). ``None`` and NaN cells show ``missing``."""

    columns: list[str]
    rows: Sequence[Sequence[Cell]]
    formats: dict[str, str] = field(default_factory=dict)
    float_format: str = ".3f"
    missing: str = ""

    def text(self, column: int, cell: Cell) -> str:
        """The cell as shown: formatted, before any escaping."""
        if cell is None or (isinstance(cell, numbers.Real) and math.isnan(cell)):
            return self.missing
        if isinstance(cell, str | bool):
            return str(cell)
        spec = self.formats.get(self.columns[column])
        if spec is None:  # numpy scalars count as the ints and floats they hold
            spec = "" if isinstance(cell, numbers.Integral) else self.float_format
        return format(cell, spec)

    def cells(self) -> list[list[str]]:
        return [[self.text(j, cell) for j, cell in enumerate(row)] for row in self.rows]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: numpy scalars as Python numbers, NaN as null."""
        data: dict[str, Any] = {"columns": list(self.columns), "rows": [[_plain(c) for c in r] for r in self.rows]}
        if self.formats:
            data["formats"] = dict(self.formats)
        if self.float_format != ".3f":
            data["float_format"] = self.float_format
        if self.missing:
            data["missing"] = self.missing
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Table:
        return cls(
            list(data["columns"]),
            [list(row) for row in data["rows"]],
            dict(data.get("formats", {})),
            data.get("float_format", ".3f"),
            data.get("missing", ""),
        )


def frame_table(frame: pd.DataFrame, columns: Mapping[str, str], float_format: str = ".3f") -> Table:
    """A table of ``frame``'s ``columns`` (name -> title): float columns as numbers shown with ``float_format``
    (NaN as "nan"), integer columns as ints, any other column as its text."""

    def column(name: str) -> list[Cell]:
        values = frame[name]
        if is_float_dtype(values):
            return [float(v) for v in values]
        return [int(v) for v in values] if is_integer_dtype(values) else [str(v) for v in values]

    cells = [column(name) for name in columns]
    return Table(
        list(columns.values()),
        [list(row) for row in zip(*cells, strict=True)],
        float_format=float_format,
        missing="nan",
    )


def to_markdown(table: Table) -> str:
    """A pipe table (no trailing newline); ``|`` in a cell is escaped, a newline becomes a space."""

    def line(cells: Sequence[str]) -> str:
        return "| " + " | ".join(cell.replace("|", "\\|").replace("\n", " ") for cell in cells) + " |"

    return "\n".join([line(table.columns), "|" + "---|" * len(table.columns), *map(line, table.cells())])


def to_html(table: Table) -> str:
    """An HTML ``<table>`` with a header row; every cell escaped (as element text: quotes stay as they are)."""

    def row(cells: Sequence[str], tag: str) -> str:
        return "<tr>" + "".join(f"<{tag}>{html.escape(cell, quote=False)}</{tag}>" for cell in cells) + "</tr>"

    return "<table>" + row(table.columns, "th") + "".join(row(cells, "td") for cells in table.cells()) + "</table>"


@dataclass(frozen=True)
class Heading:
    """A heading of ``level`` (1 = the document's title) over the blocks after it."""

    text: str
    level: int = 2


@dataclass(frozen=True)
class Items:
    """A bulleted list, one line of plain text per item."""

    items: list[str]


Block = str | Heading | Items | Table  # str: a paragraph of plain text (its line breaks are spaces)


def block_markdown(block: Block) -> str:
    """One block as markdown."""
    if isinstance(block, Table):
        return to_markdown(block)
    if isinstance(block, Heading):
        return f"{'#' * block.level} {block.text}"
    return "\n".join(f"- {item}" for item in block.items) if isinstance(block, Items) else block


def _block_dict(block: Block) -> dict[str, Any]:
    if isinstance(block, Table):
        return {"table": block.to_dict()}
    if isinstance(block, Heading):
        return {"heading": block.text, "level": block.level}
    return {"items": list(block.items)} if isinstance(block, Items) else {"text": block}


def _block_of(data: Mapping[str, Any], version: int) -> Block:
    if "table" in data:
        return Table.from_dict(data["table"])
    if "heading" in data:
        return Heading(str(data["heading"]), int(data.get("level", 2)))
    if "items" in data:
        return Items([str(item) for item in data["items"]])
    text = str(data["text"])
    heading = re.fullmatch(r"(#{1,6}) (.+)", text.strip()) if version == 1 else None  # a version 1 heading
    return Heading(heading[2], len(heading[1])) if heading else text


@dataclass(frozen=True)
class Summary:
    """A stage's results: ``blocks`` in reading order, ``numbers`` its key numbers for programs (JSON values)."""

    blocks: list[Block]
    numbers: dict[str, Any] = field(default_factory=dict)
    title: str | None = None

    def parts(self) -> list[Block]:
        """The blocks with the title as a level-1 heading first."""
        return ([Heading(self.title, 1)] if self.title else []) + list(self.blocks)

    def to_markdown(self) -> str:
        """Blocks separated by a blank line, ending with a newline."""
        return "\n\n".join(map(block_markdown, self.parts())) + "\n"

    def to_dict(self) -> dict[str, Any]:
        return {"title": self.title, "numbers": self.numbers, "blocks": [_block_dict(b) for b in self.blocks]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], version: int = SUMMARY_FORMAT) -> Summary:
        blocks = [_block_of(block, version) for block in data["blocks"]]
        return cls(blocks, dict(data.get("numbers") or {}), data.get("title"))


def write_summary(folder: str | Path, markdown_name: str, summary: Summary) -> Path:
    """Write ``folder/markdown_name`` and put the same document into ``folder/summary.json``; returns the
    markdown path. Other documents already in summary.json (other markdown files of the folder) are kept."""
    folder = Path(folder)
    path = folder / SUMMARY_FILE
    # documents an older version wrote are kept, rewritten in this version's blocks
    documents = {name: kept.to_dict() for name, kept in read_summaries(folder).items()} if path.is_file() else {}
    documents[markdown_name] = summary.to_dict()
    write_json(path, {"format": SUMMARY_FORMAT, "documents": documents})
    write_text(folder / markdown_name, summary.to_markdown())
    return folder / markdown_name


def read_summaries(folder: str | Path) -> dict[str, Summary]:
    """Markdown file name -> its ``Summary``, from ``folder/summary.json`` (sorted by name); ``{}`` when the
    folder has no markdown at all. A folder with markdown but no summary.json was written by a dynheads from
    before stages wrote their results as data: a ``DynheadsError`` says so."""
    folder = Path(folder)
    path = folder / SUMMARY_FILE
    if not path.is_file():
        old = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*.md"))
        if old:
            raise DynheadsError(
                f"{folder} has {', '.join(old)} but no {SUMMARY_FILE}: it was written by an older "
                "dynheads; re-run this stage to rebuild its results"
            )
        return {}
    try:
        version, documents = _documents(path)
        return {name: Summary.from_dict(data, version) for name, data in sorted(documents.items())}
    except (KeyError, TypeError, AttributeError) as error:
        raise DynheadsError(f"{path} is not a summary file ({type(error).__name__}: {error})") from None


def _documents(path: Path) -> tuple[int, dict[str, Any]]:
    """The file's format version and its documents."""
    try:
        data = read_json(path)
    except ValueError as error:
        raise DynheadsError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("documents"), dict):
        raise DynheadsError(f"{path} is not a summary file (no 'documents' object)")
    return format_version(data.get("format"), SUMMARY_FORMAT, "summary", path), data["documents"]


def _plain(cell: Any) -> Cell:
    """A numpy scalar as the Python number it holds; NaN as None (JSON has no NaN)."""
    if hasattr(cell, "item") and not isinstance(cell, str | bool | int | float):
        cell = cell.item()
    return None if isinstance(cell, float) and math.isnan(cell) else cell
