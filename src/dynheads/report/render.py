"""How the report is written: its sections as markdown (report.md) and as one self-contained HTML page (report.html:
figures as base64 PNG data URIs, the per-step view's data as JSON)."""

from __future__ import annotations

import base64
import html
import itertools
import re
from pathlib import Path
from typing import Any

from dynheads.report.claims import Verdict
from dynheads.report.headline import Headline
from dynheads.report.parts import Cards, Figure, Part, Plain, Section
from dynheads.report.stepview import step_page
from dynheads.tables import Heading, Items, Table, block_markdown, to_html, to_markdown

COLLAPSE_ROWS = 8  # HTML: a longer table (CCA per offset x method, say) opens on a click


def report_markdown(title: str, sections: list[Section], run: Section, root: Path) -> str:
    """report.md: the sections, a pointer to the per-step view of report.html, then the run's section."""

    def part(item: Part) -> str:
        if isinstance(item, Figure):
            return f"![{item.caption}]({item.path.relative_to(root).as_posix()})"
        if isinstance(item, Cards):
            return "\n\n".join(_card_markdown(card, root) for card in item.headlines)
        if isinstance(item, Table | Heading | Items):
            return block_markdown(item)
        if isinstance(item, Plain):
            return item.text
        return f"**Verdict:** {item.sentence()}" if isinstance(item, Verdict) else item

    def section(s: Section) -> str:
        return f"## {s.title}\n\n" + "".join(part(p) + "\n\n" for p in s.parts)

    body, tail = "".join(map(section, sections)), section(run).rstrip() + "\n"
    return f"# {title}\n\n{body}## Per-step view\n\nInteractive: open report.html next to this file.\n\n{tail}"


def _card_markdown(card: Headline, root: Path) -> str:
    figure = (
        f"![{card.verdict.claim}, {card.verdict.task}]({card.figure.relative_to(root).as_posix()})\n\n"
        if card.figure is not None
        else ""
    )
    rows = to_markdown(_card_table(card)) if card.rows else f"*{card.no_numbers}*"
    return f"### {card.verdict.claim}, {card.verdict.task}: {card.verdict.status}\n\n{figure}{rows}"


def _card_html(card: Headline) -> str:
    verdict = card.verdict
    status = verdict.status.replace(" ", "-")
    if card.figure is None:
        figure = f'<div class="card-nofig">{html.escape(card.missing)}</div>'
    else:
        png = card.figure.read_bytes()
        alt = html.escape(f"{verdict.claim}, {verdict.task}")
        figure = (
            f'<a href="#{card.anchor}"><img src="data:image/png;base64,{base64.b64encode(png).decode()}" '
            f'alt="{alt}"></a>'
        )
    return (
        f'<div class="card {status}" title="{html.escape(verdict.sentence())}">'
        f'<div class="card-head"><span class="badge">{html.escape(verdict.status)}</span> '
        f'<a href="#{card.anchor}">{html.escape(verdict.claim)}, {html.escape(verdict.task)}</a></div>'
        f"{figure}{to_html(_card_table(card)) if card.rows else f'<p>{html.escape(card.no_numbers)}</p>'}</div>"
    )


def _card_table(card: Headline) -> Table:
    return Table(["", "ours", "paper"], [list(row) for row in card.rows])


def report_html(title: str, sections: list[Section], run: Section, step_data: dict[str, Any]) -> str:
    """report.html: the first section, the table of contents, the other sections, then the per-step view (its data
    ``step_data``) and the run's section."""

    def part(item: Part) -> str:
        if isinstance(item, Figure):
            data = base64.b64encode(item.path.read_bytes()).decode("ascii")
            caption = html.escape(item.caption)
            return (
                f'<figure><img src="data:image/png;base64,{data}" alt="{caption}">'
                f"<figcaption>{caption}</figcaption></figure>"
            )
        if isinstance(item, Cards):
            return '<div class="cards">' + "".join(map(_card_html, item.headlines)) + "</div>"
        if isinstance(item, Table):
            return _table_html(item)
        if isinstance(item, Verdict):
            return (
                f'<p class="verdict {item.status.replace(" ", "-")}"><strong>Verdict:</strong> '
                f"{html.escape(item.sentence())}</p>"
            )
        return _block_html(item) if isinstance(item, Plain | Heading | Items) else markdown_html(item)

    def section(s: Section) -> str:
        return (
            f'\n<section id="{s.anchor}">\n<h2>{html.escape(s.title)}</h2>\n'
            + "\n".join(map(part, s.parts))
            + "\n</section>"
        )

    nav = "".join(f'<li><a href="#{s.anchor}">{html.escape(s.title)}</a></li>' for s in sections[1:])
    nav += f'<li><a href="#per-step-view">Per-step view</a></li><li><a href="#{run.anchor}">{run.title}</a></li>'
    body = f"<h1>{html.escape(title)}</h1>" + section(sections[0]) + f"\n<nav><ul>{nav}</ul></nav>"
    body += "".join(map(section, sections[1:]))
    return step_page(title, body, section(run), step_data)


def _table_html(table: Table) -> str:
    """A table longer than COLLAPSE_ROWS opens on a click."""
    if len(table.rows) <= COLLAPSE_ROWS:
        return to_html(table)
    return f"<details><summary>Table of {len(table.rows)} rows (click to show)</summary>{to_html(table)}</details>"


def _block_html(block: Plain | Heading | Items) -> str:
    """A stage's paragraph, heading or list as HTML: its text escaped, nothing in it read as markup."""
    if isinstance(block, Heading):
        return f"<h{block.level}>{html.escape(block.text, quote=False)}</h{block.level}>"
    if isinstance(block, Items):
        return "<ul>" + "".join(f"<li>{html.escape(item, quote=False)}</li>" for item in block.items) + "</ul>"
    return f"<p>{html.escape(' '.join(block.text.splitlines()), quote=False)}</p>"


def markdown_html(text: str) -> str:
    """The report's own markdown text as HTML (headings, pipe tables, lists, paragraphs, **bold**, *italic*, `code`):
    its section lines, settings and notes. A stage's text never comes here: its blocks are rendered as they are."""
    out = []
    for kind, group in itertools.groupby(text.splitlines(), key=_line_kind):
        lines = list(group)
        if kind == "heading":
            matches = [re.match(r"(#+) (.*)", line.strip()) for line in lines]
            out += [f"<h{len(m[1])}>{_inline(m[2])}</h{len(m[1])}>" for m in matches if m]
        elif kind == "table":
            rows = [_cells(line) for line in lines]
            has_header = len(rows) > 1 and all(re.fullmatch(r":?-+:?", cell) for cell in rows[1])
            out.append(_table_html(Table(rows[0], rows[2:] if has_header else rows[1:])))
        elif kind == "list":
            out.append("<ul>" + "".join(f"<li>{_inline(line.lstrip()[2:])}</li>" for line in lines) + "</ul>")
        elif kind == "text":
            out.append(f"<p>{_inline(' '.join(lines))}</p>")
    return "\n".join(out)


def _line_kind(line: str) -> str:
    stripped = line.strip()
    if not stripped:
        return "blank"
    if re.match(r"#{1,6} ", stripped):
        return "heading"
    return "table" if stripped.startswith("|") else "list" if stripped.startswith(("- ", "* ")) else "text"


def _cells(line: str) -> list[str]:
    row = line.strip().removeprefix("|")
    row = row[:-1] if row.endswith("|") and not row.endswith("\\|") else row
    return [cell.strip().replace("\\|", "|") for cell in re.split(r"(?<!\\)\|", row)]


def _inline(text: str) -> str:
    text = html.escape(text, quote=False)
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", text)
    return re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"<em>\1</em>", text)
