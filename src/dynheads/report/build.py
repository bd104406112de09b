"""The report of ``dynheads reproduce``: ``DIR/report.md`` and a self-contained ``DIR/report.html``.

Sections follow the paper. Each shows the settings of its stage folders (their manifests and JSON files), the
results each stage wrote as data (its ``summary.json``: paragraphs, headings, lists and tables, each rendered as the
block it is, never parsed as markdown), every figure (``*.png``), what the paper reports, and for the three claims
and the RAG comparison a verdict by the rules of ``dynheads.report.claims``, decided from the numbers the stages
published (``dynheads.stages``). A stage folder that is missing says "stage not run"; one that cannot be read says
why; neither stops the report. A study written before stages recorded summary.json is refused in one line.
The HTML embeds the figures as base64 PNG data URIs and the per-step view's data as JSON, so it opens offline
(docs/report.md).

This module writes the report and its first and last sections; ``dynheads.report.sections`` holds the sections in
between (what each says, its verdicts), built from ``claim_parts`` and ``stage_parts``, and
``dynheads.report.render`` writes them as markdown and HTML.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from dynheads import stages
from dynheads.analysis.evidence import EvidenceSettings
from dynheads.errors import DynheadsError
from dynheads.io import read_json_if_any, write_text
from dynheads.report import claims
from dynheads.report.claims import Verdict
from dynheads.report.headline import Headline, headline
from dynheads.report.parts import Cards, Part, Section
from dynheads.report.render import report_html, report_markdown
from dynheads.report.sections import build_sections
from dynheads.report.stage_parts import STAGE_NOT_RUN, setting_value
from dynheads.report.stepview import REASONING_THRESHOLD, step_view
from dynheads.report.study import (
    READ_ERRORS,
    decisive_metric,
    evidence_of,
    qa_task,
    stage_evidence,
    stages_gone,
    stages_not_run,
    study_stage_names,
)
from dynheads.tables import SUMMARY_FILE, Table
from dynheads.tasks.niah import NIAH


def write_report(out_dir: str | Path, evidence: EvidenceSettings | None = None) -> tuple[Path, Path]:
    """Read the stage folders of a ``dynheads reproduce`` folder; write and return report.md and report.html.

    ``evidence`` decides the verdicts (floor, bootstrap resamples and seed); default: the study's own settings
    from its manifest (``floor``, ``resamples``, ``seed``). A folder that does not exist, or whose manifest is not a
    study's (``kind`` other than ``reproduce``: a traced run, say), is refused in one line (``DynheadsError``); an
    empty folder is a study not started and gets a report whose stages all say "not run"."""
    root = Path(out_dir)
    _refuse_not_a_study(root)
    _refuse_old_study(root)
    manifest = read_json_if_any(root / "manifest.json") or {}
    evidence = evidence or evidence_of(manifest)
    body = build_sections(root, evidence)
    title = f"Retrieval Heads are Dynamic: reproduction on {(manifest.get('model') or {}).get('name', root.name)}"
    headlines = [_headline(section, verdict, root) for section in body for verdict in section.verdicts]
    run = Section("run", "Run", _overview(manifest, read_json_if_any(root / "stages.json") or {}, stages_gone(root)))
    missing = _missing_stages(stages_not_run(root), len(study_stage_names(root))) + _gone_stages(stages_gone(root))
    sections = [_summary(headlines, manifest, missing), *body]  # the answer first, the run's metadata last
    md_path, html_path = root / "report.md", root / "report.html"
    within = partial(_within_study, folders=_study_folders(root, manifest))
    write_text(md_path, within(report_markdown(title, sections, run, root)))
    write_text(html_path, within(report_html(title, sections, run, _step_data(root))))
    return md_path, html_path


def _study_folders(root: Path, manifest: dict) -> list[str]:
    """The spellings the study's files use for its folder: where it was written (the manifest's ``folder``, kept
    when the study is moved) and where it is now, as given and resolved."""
    return [str(root), str(root.resolve()), *([manifest["folder"]] if manifest.get("folder") else [])]


def _within_study(text: str, folders: list[str]) -> str:
    """``text`` with every path inside the study shown relative to it (``/runs/s1/static/x.json`` ->
    ``static/x.json``), so a report reads the same wherever the study folder is moved or copied to."""
    for folder in sorted(set(folders), key=len, reverse=True):
        if folder not in ("", "."):
            text = re.sub(rf"(?<![\w.~/+-]){re.escape(folder.rstrip('/'))}/", "", text)
    return text


def _refuse_not_a_study(root: Path) -> None:
    """A folder that does not exist (a mistyped path) or holds another kind of run gets one line, not a report of
    16 stages "not run" written into it; an empty folder is a study not started yet and gets that report."""
    if not root.is_dir():
        raise DynheadsError(f"no study folder {root}: give the --out folder of 'dynheads reproduce'")
    manifest = root / "manifest.json"
    if manifest.is_file():
        found = read_json_if_any(manifest)
        kind = found.get("kind") if isinstance(found, dict) else None
        if kind != "reproduce":
            why = f"a '{kind}' run" if kind else "its manifest.json is not a run manifest"
            raise DynheadsError(f"{root} is not a study folder written by 'dynheads reproduce' ({why})")


def _refuse_old_study(root: Path) -> None:
    """A study written before stages recorded ``summary.json`` has only their markdown: say so in one line."""
    old = (
        [
            folder.name
            for folder in sorted(root.iterdir())
            if folder.is_dir() and not (folder / SUMMARY_FILE).is_file() and any(folder.rglob("*.md"))
        ]
        if root.is_dir()
        else []
    )
    if old:
        raise DynheadsError(
            f"{root} was written by an older dynheads: its stage folder(s) {', '.join(old)} have "
            f"markdown results but no {SUMMARY_FILE}; re-run those stages to rebuild the report"
        )


def _headline(section: Section, verdict: Verdict, root: Path) -> Headline:
    """The verdict's card; a figure that cannot be read or drawn leaves the card without one, saying why."""
    anchor, figure = section.anchor, section.card_figure
    paper = section.task.paper_label if section.task is not None else None
    try:
        metric = _ablation_metric(root, figure[0]) if verdict.claim == claims.CLAIM2 else "accuracy"
        return headline(anchor, verdict, root, metric, paper_task=paper, figure=figure)
    except READ_ERRORS as error:
        return Headline(anchor, verdict, None, [], f"no figure: {error}")


def _ablation_metric(root: Path, stage: str) -> str:
    """Claim 2's decisive metric on the ablation ``stage`` (the first of ABLATION_METRICS it measured)."""
    try:
        measured = (stage_evidence(root, stage) or {}).get("per_sample") or {}
    except READ_ERRORS:
        measured = {}
    return decisive_metric(measured)


# ---- the first section (the verdicts) and the last (the run) --------------------------------------------------
def _overview(manifest: dict, timings: dict, gone: Sequence[str] = ()) -> list[Part]:
    """The run's manifest, and each stage's wall time from ``stages.json`` (the attempt that finished it); a stage
    of ``gone`` (its folder missing now) says so."""
    if not manifest:
        return [f"*`manifest.json`: {STAGE_NOT_RUN} (no top-level manifest).*"]
    rows = [[f"model {key}", setting_value(value)] for key, value in (manifest.get("model") or {}).items()]
    rows += [
        [key, setting_value(value)] for key, value in manifest.items() if key not in ("model", "config", "versions")
    ]
    rows.append(["versions", ", ".join(f"{k} {v}" for k, v in (manifest.get("versions") or {}).items())])
    config = [[key, setting_value(value)] for key, value in (manifest.get("config") or {}).items()]
    times = [
        [name, f"{entry.get('seconds', 0):.0f}", entry.get("error", "its folder is missing" if name in gone else "")]
        for name, entry in timings.items()
        if isinstance(entry, dict)
    ]
    if times:
        times.append(["total", f"{sum(float(row[1]) for row in times):.0f}", ""])
    parts: list[Part] = [Table(["field", "value"], rows)]
    return (
        parts
        + (["Configuration:", Table(["option", "value"], config)] if config else [])
        + (
            [
                "Stages (wall time of the attempt that finished each; a stage this model could not support says why):",
                Table(["stage", "seconds", "failed because"], times),
            ]
            if times
            else []
        )
    )


def _summary(headlines: list[Headline], manifest: dict, missing: list[Part]) -> Section:
    """The first section: how much of the study is missing (``missing``: when any is), the question, the cards, the
    rules."""
    model = (manifest.get("model") or {}).get("name", "this model")
    preset = f", preset `{manifest['preset']}`" if manifest.get("preset") else ""
    return Section(
        "verdicts",
        "Verdicts",
        missing
        + [
            f"Does {model}{preset} show what the paper claims? Each card: the verdict, its figure, and the numbers it "
            "rests on beside the paper's (llama3.1-8b, or the range over the paper's models); click for the section.",
            Cards(headlines),
            f"Rules (docs/report.md): {claims.RULES}.",
        ],
    )


def _missing_stages(not_run: list[str], total: int) -> list[Part]:
    """The partial study's first line: how many of its ``total`` stages have not run, and how to run them."""
    if not not_run:
        return []
    return [
        f"**{len(not_run)} of {total} stages not run yet: run the same command to continue** "
        f"(`dynheads reproduce` with the same `--out` and settings resumes where it stopped). Not run: "
        f'{", ".join(not_run)}; the cards of the claims they decide say "{claims.NOT_RUN}".'
    ]


def _gone_stages(gone: list[str]) -> list[Part]:
    """The line naming the stages that finished but whose folders are missing now, and how to get them back."""
    if not gone:
        return []
    folders = ", ".join(f"`{name}/`" for name in gone)
    return [
        f"**Stage folders missing: {folders}** (stages.json logs {'them' if len(gone) > 1 else 'it'} as finished, "
        "but the folder is gone: deleted, or not copied with the study). Copy it back and run `dynheads report` "
        "again, or run the same `dynheads reproduce` command, which runs a logged stage whose folder is gone "
        f"again. The cards of the claims it decides say "
        f'"{claims.NOT_RUN}".'
    ]


# ---- step view data ---------------------------------------------------------------------------------------------
def _step_data(root: Path) -> dict[str, Any]:
    """Per-step view of the NIAH and HotpotQA (or multi-hop) runs that exist (with the dynamism threshold of the
    second, if recorded)."""
    try:
        published = stage_evidence(root, stages.HOTPOTQA_DYNAMISM) or {}
    except READ_ERRORS:
        published = {}  # its section already says what is wrong with the stage
    threshold = published.get("threshold") or REASONING_THRESHOLD
    runs = []
    for stage, task in ((stages.NIAH, NIAH), (stages.HOTPOTQA, qa_task(root))):
        try:
            if (root / stage / "manifest.json").is_file():
                runs.append(step_view(root / stage, task.label, task.score_kind, threshold=threshold))
        except READ_ERRORS:
            continue  # its section already says what is wrong with the stage
    return {"runs": runs}
