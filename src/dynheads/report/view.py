"""``dynheads view RUN_DIR``: the report's interactive per-step view of any traced run, as one HTML page.

The page is the one ``reproduce``'s report embeds (``dynheads.report.stepview``): pick a sample, click a generated
token, and read which heads retrieved at that step and where in the input each one looked. The task, its label and
its score (Eq. 1 copies or Eq. 2 above the dynamism threshold) come from the run's manifest.
"""

from __future__ import annotations

import html
from pathlib import Path

from dynheads.io import write_text
from dynheads.report.stepview import REASONING_THRESHOLD, step_page, step_view
from dynheads.runs import RunDir
from dynheads.tasks.registry import task_of_manifest

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
