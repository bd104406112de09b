"""``dynheads view RUN_DIR``: the report's interactive per-step view of any traced run, as one HTML page
(``write_view``), or of traces held in memory (``write_trace_view``).

The page is the one ``reproduce``'s report embeds (``dynheads.report.stepview``): pick a sample, click a generated
token, and read which heads retrieved at that step and where in the input each one looked. The task, its label and
its score (Eq. 1 copies or Eq. 2 above the dynamism threshold) come from the run's manifest.
"""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dynheads.errors import DynheadsError
from dynheads.io import write_text
from dynheads.report.stepview import REASONING_THRESHOLD, step_page, step_view, traces_view
from dynheads.runs import RunDir
from dynheads.scores import ScoreKind
from dynheads.tasks.registry import task_of_manifest
from dynheads.traces import Trace

VIEW_FILE = "view.html"


def write_view(
    run_dir: str | Path, out: str | Path | None = None, *, threshold: str = REASONING_THRESHOLD, max_samples: int = 40
) -> Path:
    """Write the per-step view of the traced run ``run_dir`` to ``out`` (default ``RUN_DIR/view.html``)."""
    run = RunDir(run_dir)
    manifest = run.manifest()
    task = task_of_manifest(manifest)
    label = task.label if task is not None else str(manifest.get("kind"))
    score = task.score_kind if task is not None else "copy"
    data = step_view(run.path, label, score, threshold=threshold, max_samples=max_samples)
    model = (manifest.get("model") or {}).get("name", "a model")
    title = f"{label}: per-step heads of {run.path.name}"
    body = (
        f"<h1>{html.escape(title)}</h1><p>{html.escape(model)}; {data['total_samples']} traced samples in "
        f"{html.escape(str(run.path))}.</p>"
    )
    target = Path(out) if out is not None else run.path / VIEW_FILE
    write_text(target, step_page(title, body, "", {"runs": [data]}))
    return target


def write_trace_view(
    traces: Sequence[Trace],
    out: str | Path,
    samples: Sequence[Any] | None = None,
    *,
    score: ScoreKind = "copy",
    threshold: str = REASONING_THRESHOLD,
    title: str = "Per-step heads",
) -> Path:
    """Write the per-step view of traces held in memory (``dynheads.trace``'s results) to the HTML file ``out``;
    ``samples`` (the traced ``Sample``s, same order) give each its id, question, answer and needle."""
    if isinstance(traces, Trace):
        traces = [traces]
    if not traces:
        raise DynheadsError("no traces to show: give the traces dynheads.trace returned")
    if samples is not None and len(samples) != len(traces):
        raise DynheadsError(f"{len(samples)} samples for {len(traces)} traces: give one sample per trace, or none")
    records = [s.describe() for s in samples] if samples is not None else [{} for _ in traces]
    traced = [
        ({"sample_id": f"trace {i}", **record}, trace)
        for i, (record, trace) in enumerate(zip(records, traces, strict=True))
    ]
    data = traces_view(traced, "Traces", score, threshold=threshold)
    body = f"<h1>{html.escape(title)}</h1><p>{len(traced)} traces.</p>"
    target = Path(out)
    if target.is_dir():
        raise DynheadsError(f"{target} is a folder: give the HTML file to write")
    write_text(target, step_page(title, body, "", {"runs": [data]}))
    return target
