"""Data of the report's interactive per-step view: which heads retrieved at each generated token, and from where.

For up to ``max_samples`` samples of a traced run (spread evenly over its records), one JSON-ready dict each:

- ``id``, ``question`` (a question task's; empty for NIAH), ``metrics``, ``answer``, ``generated``,
  ``prompt_length``, ``layers``, ``heads``;
- ``spans``: ``[start, stop)`` prompt-token ranges of the needle (NIAH) or supporting facts (HotpotQA);
- ``steps``: one entry per generated token (the first ``max_steps``): ``tok`` (its text), ``n`` (heads active at
  that step) and ``h``: ``[layer, head, argmax_pos, score]`` for at most ``max_heads`` of them, best score first.

Active heads: NIAH (``copy``) = Eq. 1 copy score 1, score = attention weight on the copied position
(``max_prob``); HotpotQA (``reasoning``) = Eq. 2 score above ``threshold``, score = the Eq. 2 score.
``argmax_pos`` is the absolute key position the head attended most (a prompt token, or a generated one when it
is at least ``prompt_length``).
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Sequence
from importlib.resources import files
from pathlib import Path
from typing import Any

import numpy as np

from dynheads.runs import RunDir
from dynheads.scores import DEFAULT_REASONING_THRESHOLD, ScoreKind, ScoreSpec
from dynheads.traces import Trace

REASONING_THRESHOLD = DEFAULT_REASONING_THRESHOLD  # Eq. 2 threshold of a retrieving head (the dynamism default)


def step_view(
    run_dir: str | Path,
    label: str,
    score: ScoreKind,
    *,
    threshold: str | float = REASONING_THRESHOLD,
    max_samples: int = 40,
    max_steps: int = 64,
    max_heads: int = 24,
) -> dict[str, Any]:
    """The per-step view of one traced run: ``{"label", "score", "threshold", "total_samples", "samples"}``."""
    run = RunDir(run_dir)
    records = [r for r in run.records() if run.trace_path(r["sample_id"]).is_file()]
    chosen = [(record, run.load_trace(record["sample_id"])) for record in _spread(records, max_samples)]
    view = traces_view(chosen, label, score, threshold=threshold, max_steps=max_steps, max_heads=max_heads)
    return {**view, "total_samples": len(records)}


def traces_view(
    traced: Sequence[tuple[dict, Trace]],
    label: str,
    score: ScoreKind,
    *,
    threshold: str | float = REASONING_THRESHOLD,
    max_steps: int = 64,
    max_heads: int = 24,
) -> dict[str, Any]:
    """``step_view`` of (record, trace) pairs held in memory: a record needs ``sample_id`` and may give
    ``question``, ``answer``, ``needle_positions`` and ``metrics`` (``Sample.describe()`` gives them)."""
    return {
        "label": label,
        "score": score,
        "threshold": None if ScoreSpec(score).score.binary else str(threshold),
        "total_samples": len(traced),
        "samples": [_sample(record, trace, score, threshold, max_steps, max_heads) for record, trace in traced],
    }


def _spread(records: Sequence[dict], count: int) -> list[dict]:
    """At most ``count`` records, evenly spaced (the grid's lengths and depths stay represented)."""
    if len(records) <= count:
        return list(records)
    return [records[i] for i in np.unique(np.linspace(0, len(records) - 1, count).round().astype(int))]


def _sample(
    record: dict, trace: Trace, score: ScoreKind, threshold: str | float, max_steps: int, max_heads: int
) -> dict[str, Any]:
    layers, heads = trace.shape
    # NaN scores (an empty Eq. 2 denominator) are never active
    spec = ScoreSpec(score, str(threshold))
    active = spec.active(trace.scores, trace.chance)
    values = np.nan_to_num(trace.max_prob if spec.score.binary else spec.trace_scores(trace.scores))
    steps = []
    for step in range(min(trace.num_steps, max_steps)):
        found = np.argwhere(active[step])  # [n, 2] (layer, head)
        ranked = found[np.argsort(-values[step][active[step]], kind="stable")][:max_heads]
        steps.append(
            {
                "tok": trace.token_texts[step],
                "n": len(found),
                "h": [
                    [
                        int(layer),
                        int(head),
                        int(trace.argmax_pos[step, layer, head]),
                        round(float(values[step, layer, head]), 3),
                    ]
                    for layer, head in ranked
                ],
            }
        )
    metrics = {name: _finite(value) for name, value in record.get("metrics", {}).items()}
    return {
        "id": record["sample_id"],
        "question": str(record.get("question") or ""),
        "metrics": metrics,
        "answer": record.get("answer", ""),
        "generated": record.get("generated", trace.text),
        "prompt_length": trace.prompt_length,
        "spans": spans(record.get("needle_positions", [])),
        "layers": layers,
        "heads": heads,
        "total_steps": trace.num_steps,
        "steps": steps,
    }


def _finite(value: Any) -> float | None:
    """A metric as JSON allows it: a finite number, else None."""
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def spans(positions: Sequence[int]) -> list[list[int]]:
    """Sorted token positions as ``[start, stop)`` runs of consecutive positions."""
    runs: list[list[int]] = []
    for position in sorted(set(positions)):
        if runs and position == runs[-1][1]:
            runs[-1][1] += 1
        else:
            runs.append([position, position + 1])
    return runs


def step_page(title: str, body: str, tail: str, step_data: dict[str, Any]) -> str:
    """The HTML page of the view: ``body`` (HTML) above the per-step view of ``step_data`` (``{"runs": [...]}``),
    ``tail`` (HTML) below it; one file, no network."""
    data = json.dumps(step_data, separators=(",", ":"), allow_nan=False).replace("<", "\\u003c")
    page = resource("template.html")
    for marker, value in (
        ("TITLE", html.escape(title)),
        ("STYLE", resource("stepview.css")),
        ("DATA", data),
        ("SCRIPT", resource("stepview.js")),
        ("RUN", tail),
        ("BODY", body),
    ):  # RUN and BODY last: they hold any text
        page = page.replace(f"<!--{marker}-->", value, 1)
    return page


def resource(name: str) -> str:
    """A file of this package (the page template, its style and script)."""
    return files("dynheads.report").joinpath(name).read_text(encoding="utf-8")
