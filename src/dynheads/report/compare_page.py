"""compare.md and compare.html: the verdict matrix first, then Table 1 beside the paper's rows, the statistics
against model size, and each model's task accuracy (docs/compare.md). The HTML embeds its figure (opens offline)."""

from __future__ import annotations

import base64
import html
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynheads.errors import DynheadsError
from dynheads.io import write_json, write_text
from dynheads.paper import PAPER_DYNAMISM
from dynheads.plots.scale import Panel, Point, plot_by_size, size_label
from dynheads.report import claims
from dynheads.report.claims import Verdict
from dynheads.report.compare import RESULTS_FILE, ModelResults, collect, results_to_dict
from dynheads.report.rule_paper import paper_reading
from dynheads.tables import Cell, Table, to_html, to_markdown

CLAIM_ORDER = (claims.CLAIM1, claims.CLAIM2, claims.CLAIM3, claims.RAG)
NOT_RUN = "not run"
FIGURE = "compare-by-size.png"
STYLE = """body{font-family:system-ui,sans-serif;margin:1.2em;max-width:1400px}table{border-collapse:collapse;
font-size:12px}td,th{border:1px solid #ccc;padding:3px 6px;vertical-align:top}th{background:#f3f3f3}
td.supported{background:#e3f4e1}td.not-supported{background:#fbe3e1}td.inconclusive{background:#f6f1dc}
td.not-run{background:#f3f3f3}td small{display:block;color:#444}img{max-width:100%}"""


def write_compare(folders: Sequence[str | Path], out: str | Path, *, by_study: bool = False) -> tuple[Path, Path]:
    """Compare the studies and runs of ``folders``; write and return ``out/compare.md`` and ``out/compare.html``
    (and ``out/compare.json``, what was collected of each model, which a later comparison can take instead of the
    folders). ``by_study``: one column per study folder (``compare.collect``), for studies of one model."""
    models = collect(folders, by_study=by_study)
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise DynheadsError(f"--out {out} is a file, not a folder")
    out.mkdir(parents=True, exist_ok=True)
    panels = size_panels(models)
    figure = plot_by_size(panels, out / FIGURE) if panels else None
    title = "Retrieval Heads are Dynamic: " + ", ".join(model.name for model in models)
    sections = _sections(models, figure)
    md_path, html_path = out / "compare.md", out / "compare.html"
    write_text(md_path, f"# {title}\n\n" + "".join(_section_markdown(s, out) for s in sections))
    write_text(html_path, _html(title, sections))
    write_json(out / RESULTS_FILE, results_to_dict(models))
    return md_path, html_path


# ---- contents ------------------------------------------------------------------------------------------------------
PAPER_COLUMN = "the paper's rows, same rule"


def matrix(models: Sequence[ModelResults]) -> Table:
    """Claims x models: each cell the verdict, its tested effects with interval and n (``not run`` where none); the
    last column what the deciding rule says of the paper's own rows (``rule_paper.paper_reading``)."""
    rows_seen: list[tuple[str, str]] = []
    for model in models:
        rows_seen += [(v.claim, v.task) for v in model.verdicts if (v.claim, v.task) not in rows_seen]
    ordered = sorted(rows_seen, key=lambda row: (_claim_rank(row[0]), rows_seen.index(row)))
    rows: list[list[Cell]] = [
        [claim, task, *(_cell(model.verdict(claim, task)) for model in models), paper_reading(claim)]
        for claim, task in ordered
    ]
    return Table(["claim", "task", *(model.name for model in models), PAPER_COLUMN], rows)


def _claim_rank(claim: str) -> int:
    return CLAIM_ORDER.index(claim) if claim in CLAIM_ORDER else len(CLAIM_ORDER)


def _cell(verdict: Verdict | None) -> str:
    if verdict is None:
        return NOT_RUN
    effects = "; ".join(f"{e.name} {e.interval.text()}, rule {e.rule}" for e in verdict.effects)
    detail = effects if effects else verdict.reason
    return f"{verdict.status}: {detail}" if detail else verdict.status


def table1(models: Sequence[ModelResults]) -> Table:
    """Table 1 with one row per model and task, the paper's rows below; heads per step also as a share of L x H."""
    columns = [
        "model",
        "parameters",
        "task",
        "heads (L x H)",
        "mean ± std |D_t|",
        "share of heads",
        "unique / total",
        "Jaccard w/ static top-20",
        "containment in top-20",
        "size-matched Jaccard",
        "adjacent Jaccard",
        "entropy",
    ]
    rows: list[list[Cell]] = []
    for model in models:
        for task, stats in model.dynamism.items():
            rows.append([model.name, _parameters(model.parameters), task, *_stat_cells(stats, model.heads)])
    for name, stats in PAPER_DYNAMISM.items():
        rows.append([f"{name} (paper)", "", "NIAH", *_stat_cells(stats, int(stats["total_heads"]))])
    return Table(columns, rows, missing="–")


def _stat_cells(stats: dict[str, Any], heads: int) -> list[Cell]:
    mean, std = _value(stats.get("mean_size")), _value(stats.get("std_size"))
    total = int(_value(stats.get("total_heads")) or heads or 0)
    share = mean / total if total and not math.isnan(mean) else math.nan
    return [
        total,
        f"{mean:.2f} ± {std:.2f}",
        f"{share:.3f}",
        f"{_value(stats.get('unique_heads')):.0f} / {total}",
        *(
            _value(stats.get(key))
            for key in ("jaccard_static_k20", "containment_k20", "matched_jaccard", "adjacent_jaccard", "entropy")
        ),
    ]


def _value(value: Any) -> float:
    return math.nan if value is None else float(value)


def _parameters(count: int | None) -> str:
    return "not recorded" if count is None else size_label(count)


def accuracy_table(models: Sequence[ModelResults]) -> Table:
    """Task x metric rows, one column per model: the mean with its interval and n (``not run`` where none)."""
    keys: list[tuple[str, str]] = []
    for model in models:
        keys += [(a.task, a.metric) for a in model.accuracy if (a.task, a.metric) not in keys]

    def cell(model: ModelResults, task: str, metric: str) -> str:
        found = [a for a in model.accuracy if (a.task, a.metric) == (task, metric)]
        return "; ".join(a.interval.text() for a in found) or NOT_RUN

    rows: list[list[Cell]] = [[task, metric, *(cell(m, task, metric) for m in models)] for task, metric in keys]
    return Table(["task", "metric", *(model.name for model in models)], rows)


def size_panels(models: Sequence[ModelResults]) -> list[Panel]:
    """One panel per tested effect (claim, task, effect) that at least one model with a known size has defined."""
    panels: dict[str, tuple[float, list[Point]]] = {}
    for model in models:
        if model.parameters is None:
            continue
        for verdict in sorted(model.verdicts, key=lambda v: _claim_rank(v.claim)):
            for effect in verdict.effects:
                if math.isnan(effect.interval.effect):
                    continue
                title = f"{verdict.claim.split(' (')[0]}, {verdict.task}: {effect.name} ({effect.rule})"
                found = effect.interval
                point = Point(model.name, model.parameters, found.effect, found.low, found.high, found.n)
                panels.setdefault(title, (effect.margin, []))[1].append(point)
    return [Panel(title, points, margin) for title, (margin, points) in panels.items()]


# ---- rendering -----------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Matrix:
    """The verdict matrix: rendered with each cell coloured by its verdict in the HTML."""

    table: Table


Part = str | Table | Matrix | Path  # markdown text, a table, the verdict matrix, a figure
Section = tuple[str, str, list[Part]]  # (anchor, title, parts)


def _sections(models: Sequence[ModelResults], figure: Path | None) -> list[Section]:
    unsized = [model.name for model in models if model.parameters is None]
    by_size: list[Part] = [
        "Each tested effect against the model's parameter count, with its 95 % interval and n; the dashed line is "
        "the margin its verdict holds it to."
    ]
    if unsized:
        by_size.append(f"Not on the figure (parameter count not recorded by an older dynheads): {', '.join(unsized)}.")
    by_size.append(figure if figure is not None else "No effect with a known model size to draw.")
    sources = [
        f"{model.name}: "
        + ", ".join(f"`{folder}`" for folder in model.folders)
        + (f" (study, preset `{model.preset}`)" if model.preset else "")
        + (f", as saved in `{model.saved_in}`" if model.saved_in is not None else "")
        for model in models
    ]
    return [
        (
            "verdicts",
            "Verdicts by model",
            [
                "Each cell: the verdict on the claim for that model and task, each tested effect with its 95 % "
                "interval, n and rule.",
                Matrix(matrix(models)),
                f"Rules (docs/report.md): {claims.RULES}.",
            ],
        ),
        (
            "table1",
            "Table 1 beside the paper",
            [
                "Dynamic heads per step (|D_t|) also as a share of the model's L x H heads; the paper's five rows "
                "are NIAH with llama-family, Qwen3 and Phi models (containment and size-matched Jaccard: not "
                "stated in the paper).",
                table1(models),
            ],
        ),
        ("by-size", "Statistics against model size", by_size),
        (
            "accuracy",
            "Task accuracy",
            [
                "How well each model does the task itself (un-ablated runs; mean over samples, 95 % interval, n): "
                "a verdict on a task the model fails says little about its heads.",
                accuracy_table(models),
            ],
        ),
        ("sources", "Sources", ["\n".join(f"- {line}" for line in sources)]),
    ]


def _section_markdown(section: Section, out: Path) -> str:
    _, title, parts = section

    def part(item: Part) -> str:
        if isinstance(item, Table | Matrix):
            return to_markdown(item if isinstance(item, Table) else item.table)
        return f"![{title}]({item.relative_to(out).as_posix()})" if isinstance(item, Path) else item

    return f"## {title}\n\n" + "".join(part(item) + "\n\n" for item in parts)


def _html(title: str, sections: list[Section]) -> str:
    def part(item: Part) -> str:
        if isinstance(item, Path):
            data = base64.b64encode(item.read_bytes()).decode("ascii")
            return f'<figure><img src="data:image/png;base64,{data}" alt="{html.escape(title)}"></figure>'
        if isinstance(item, Matrix):
            return _matrix_html(item.table)
        if isinstance(item, Table):
            return to_html(item)
        lines = [line.removeprefix("- ") for line in item.splitlines()]
        if len(lines) > 1 or item.startswith("- "):
            return "<ul>" + "".join(f"<li>{html.escape(line.replace('`', ''))}</li>" for line in lines) + "</ul>"
        return f"<p>{html.escape(item.replace('`', ''))}</p>"

    body = "".join(
        f'<section id="{anchor}"><h2>{html.escape(heading)}</h2>{"".join(map(part, parts))}</section>'
        for anchor, heading, parts in sections
    )
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{body}</body></html>\n"
    )


def _matrix_html(table: Table) -> str:
    """The verdict matrix: each cell coloured by its verdict, the status first and each effect on its own line."""

    def cell(text: str) -> str:
        status, _, detail = text.partition(": ")
        lines = "".join(f"<small>{html.escape(line)}</small>" for line in detail.split("; ") if line)
        return f'<td class="{status.replace(" ", "-")}"><strong>{html.escape(status)}</strong>{lines}</td>'

    head = "<tr>" + "".join(f"<th>{html.escape(column)}</th>" for column in table.columns) + "</tr>"
    rows = "".join(
        "<tr>"
        + "".join(f"<td>{html.escape(str(c))}</td>" for c in row[:2])
        + "".join(cell(str(c)) for c in row[2:])
        + "</tr>"
        for row in table.rows
    )
    return f'<table class="matrix">{head}{rows}</table>'
