"""A stage folder as report parts: its settings, the results of its ``summary.json``, its figures and the paper's
notes its results lack; and the parts of the static list and of a task run (NIAH, HotpotQA) built on them."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from dynheads import stages
from dynheads.io import read_json_if_any
from dynheads.report.parts import Figure, Part, Plain
from dynheads.runs import RunDir
from dynheads.tables import SUMMARY_FILE, Block, Cell, Heading, Summary, Table, read_summaries

STAGE_NOT_RUN = "stage not run"
MAX_FIGURES = 8  # per stage folder: Figure 1 alone can have one heat map per sample
SETTING_KEYS = (
    *("kind", "score", "task", "threshold", "ks", "static_file", "epochs_run", "train_seconds", "seed"),
    *("fractions", "compensation"),  # the dose-response: fractions of each step's |D_t|, and past it
    *("multiples", "mean_size", "fit_steps", "doses"),  # an older run's fixed doses (and dose_fit.json's fit)
)


def stage_parts(root: Path, name: str, figure: str, notes: Iterable[str] = ()) -> list[Part]:
    """Settings, the results of ``root/name/summary.json`` and every ``*.png`` under it, then the paper notes
    its results lack.

    A note is left out when the stage's results already contain its text after the first ": ".
    """
    folder = root / name
    if not folder.is_dir():
        return [f"### Stage `{name}/`", f"*`{name}/`: {STAGE_NOT_RUN}.*"]
    documents = read_summaries(folder)
    figures = sorted(folder.rglob("*.png"))
    parts: list[Part] = [f"### Stage `{name}/`", _settings(folder, root)]
    for markdown_name, summary in documents.items():
        parts += [f"From `{(folder / markdown_name).relative_to(root).as_posix()}`:", *_demoted(summary)]
    parts += [Figure(path, f"{figure}: {path.relative_to(root).as_posix()}") for path in figures[:MAX_FIGURES]]
    if len(figures) > MAX_FIGURES:
        parts.append(f"{len(figures) - MAX_FIGURES} more figures in `{name}/` are not shown.")
    texts = [summary.to_markdown() for summary in documents.values()]
    return parts + [f"Paper: {note}" for note in notes if not any(note.split(": ", 1)[-1] in text for text in texts)]


def static_parts(root: Path) -> list[Part]:
    parts = stage_parts(
        root,
        stages.STATIC,
        "Static heads",
        [
            "heads scored as Wu et al. (copy steps / answer tokens, over "
            "tests whose ROUGE-1 recall > 0.5); dynamic sets are compared "
            "with the static top-20 (and top-50, top-100 in Table 5)."
        ],
    )
    summary = read_json_if_any(root / stages.STATIC / "static_summary.json")
    if summary:
        parts.insert(
            2,
            f"Pass rate {summary['pass_rate']:.2f} ({summary['num_counted']} of {summary['num_tests']} "
            f"tests counted); top-20{_scored_note(summary['top20'])}: {', '.join(summary['top20'])}.",
        )
    return parts


def _scored_note(top20: list[str]) -> str:
    """What a static top-20 of fewer than 20 heads means (the others score 0)."""
    return "" if len(top20) >= 20 else f" (only {len(top20)} heads score above 0)"


def task_run_parts(root: Path, stage: str) -> list[Part]:
    parts = stage_parts(root, stage, "Figure")
    records = RunDir(root / stage).records() if (root / stage).is_dir() else []
    if records:
        frame = pd.json_normalize(records)
        if "context_tokens" not in frame:
            frame["context_tokens"] = "all"
        columns = [c for c in frame.columns if c.startswith("metrics.")]
        grouped = frame.groupby("context_tokens")
        means, counts = grouped[columns].mean(), grouped.size()
        rows: list[list[Cell]] = [
            [str(i), int(counts[i]), *(float(value) for value in means.loc[i])] for i in means.index
        ]
        steps = f"; {frame['steps'].mean():.1f} generated tokens per sample" if "steps" in frame else ""
        parts[2:2] = [
            f"{len(records)} samples{steps}. Mean metrics by context length:",
            Table(["context tokens", "samples", *(c.removeprefix("metrics.") for c in columns)], rows, missing="nan"),
        ]
    skipped = (read_json_if_any(root / stage / "manifest.json") or {}).get("skipped", {})
    if skipped.get("count"):  # (question, cell) pairs with no valid sample, e.g. gold paragraphs too long
        parts.insert(
            4 if records else 3,
            f"Skipped (question, cell) pairs: {skipped['count']} ("
            + "; ".join(f"{n} {why}" for why, n in skipped["by_reason"].items())
            + ").",
        )
    return parts


def _settings(folder: Path, root: Path) -> str:
    """One line per JSON file of the folder: its ``config`` and the known setting keys."""
    lines = []
    for path in sorted(folder.glob("*.json")):
        data = read_json_if_any(path) if path.name != SUMMARY_FILE else None  # results, shown as such
        if not isinstance(data, dict):
            continue
        config = data.get("config")
        values = {
            **(config if isinstance(config, dict) else {}),
            **{key: data[key] for key in SETTING_KEYS if key in data},
        }
        model = data.get("model")
        values |= {"model": model.get("name") if isinstance(model, dict) else model} if model else {}
        shown = [f"`{key}={setting_value(value)}`" for key, value in values.items() if _short(value)]
        if shown:
            lines.append(f"- `{path.relative_to(root).as_posix()}`: " + ", ".join(shown))
    return "Settings:\n\n" + "\n".join(lines) if lines else "No settings recorded."


def _short(value: Any) -> bool:
    scalar = (str, int, float, bool, type(None))
    return isinstance(value, scalar) or (
        isinstance(value, list | tuple) and len(value) <= 12 and all(isinstance(item, scalar) for item in value)
    )


def setting_value(value: Any) -> str:
    """A setting as the report shows it: text as it is, anything else as JSON; cut to 100 characters."""
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 100 else text[:97] + "..."


def _demoted(summary: Summary, by: int = 3) -> list[Part]:
    """A stage's results as report parts, its headings below the report's own (its title, level 1, at level 4)."""

    def part(block: Block) -> Part:
        if isinstance(block, Heading):
            return Heading(block.text, min(block.level + by, 6))
        return Plain(block.strip()) if isinstance(block, str) else block

    return [part(block) for block in summary.parts()]
