"""The report of ``dynheads reproduce``: ``DIR/report.md`` and a self-contained ``DIR/report.html``.

Sections follow the paper. Each shows the settings of its stage folders (their manifests and JSON files), the
results each stage wrote as data (its ``summary.json``: paragraphs, headings, lists and tables, each rendered as the
block it is, never parsed as markdown), every figure (``*.png``), what the paper reports, and for the three claims
and the RAG comparison a verdict by the rules of ``dynheads.report.claims``, decided from the numbers the stages
published (``dynheads.stages``). A stage folder that is missing says "stage not run"; one that cannot be read says
why; neither stops the report. A study written before stages recorded summary.json is refused in one line.
The HTML embeds the figures as base64 PNG data URIs and the per-step view's data as JSON, so it opens offline
(docs/report.md).
"""

from __future__ import annotations

import base64
import html
import itertools
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd

from dynheads import stages
from dynheads.analysis.evidence import EvidenceSettings
from dynheads.errors import DynheadsError
from dynheads.io import read_json_if_any, write_text
from dynheads.paper import (
    ENTROPY_BASELINE,
    PAPER_DYNAMISM,
    PAPER_FIGURE5,
    PAPER_FIGURE6,
    PAPER_FIGURE7,
    PAPER_FIGURE8,
    PAPER_GRID,
    PAPER_MODEL,
    PAPER_PROBE_BINARY,
    PAPER_PROBE_CONTINUOUS,
    PAPER_PROGRESSIVE,
    PAPER_TABLE4,
    PAPER_TABLE6,
    PAPER_TOP1,
)
from dynheads.registry import Registry
from dynheads.report import claims
from dynheads.report.claims import Verdict
from dynheads.report.headline import Headline, headline
from dynheads.report.stepview import REASONING_THRESHOLD, step_page, step_view
from dynheads.runs import RunDir
from dynheads.tables import (
    SUMMARY_FILE,
    Block,
    Cell,
    Heading,
    Items,
    Summary,
    Table,
    block_markdown,
    read_summaries,
    to_html,
    to_markdown,
)
from dynheads.tasks.hotpotqa import HOTPOTQA
from dynheads.tasks.niah import NIAH
from dynheads.tasks.registry import Task, task_of, task_of_manifest

STAGE_NOT_RUN = "stage not run"
COLLAPSE_ROWS = 8  # HTML: a longer table (CCA per offset x method, say) opens on a click
MAX_FIGURES = 8  # per stage folder: Figure 1 alone can have one heat map per sample
READ_ERRORS = (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, DynheadsError)
ABLATION_METRICS = ("accuracy", "f1", "em", "rouge_l")  # the first one the stage measured decides Claim 2
SETTING_KEYS = (
    *("kind", "score", "task", "threshold", "ks", "static_file", "epochs_run", "train_seconds", "seed"),
    *("fractions", "compensation"),  # the dose-response: fractions of each step's |D_t|, and past it
    *("multiples", "mean_size", "fit_steps", "doses"),  # an older run's fixed doses (and dose_fit.json's fit)
)
RAG_STRATEGIES = {
    "dynamic": "Dynamic",
    "static": "Static",
    "dynamic-random": "Dynamic Random",
    "fixed-random": "Fixed Random",
    "none": "w/o RAG",
}


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


def write_report(out_dir: str | Path, evidence: EvidenceSettings | None = None) -> tuple[Path, Path]:
    """Read the stage folders of a ``dynheads reproduce`` folder; write and return report.md and report.html.

    ``evidence`` decides the verdicts (floor, bootstrap resamples and seed); default: the study's own settings
    from its manifest (``floor``, ``resamples``, ``seed``)."""
    root = Path(out_dir)
    _refuse_old_study(root)
    manifest = read_json_if_any(root / "manifest.json") or {}
    evidence = evidence or evidence_of(manifest)
    body = build_sections(root, evidence)
    title = f"Retrieval Heads are Dynamic: reproduction on {(manifest.get('model') or {}).get('name', root.name)}"
    headlines = [_headline(section, verdict, root) for section in body for verdict in section.verdicts]
    run = Section("run", "Run", _overview(manifest, read_json_if_any(root / "stages.json") or {}))
    sections = [_summary(headlines, manifest, stages_not_run(root)), *body]  # the answer first, the run's metadata last
    md_path, html_path = root / "report.md", root / "report.html"
    write_text(md_path, _markdown(title, sections, run, root))
    write_text(html_path, _html(title, sections, run, _step_data(root)))
    return md_path, html_path


def evidence_of(manifest: Mapping) -> EvidenceSettings:
    """The verdict settings a study recorded (the defaults for what it does not record)."""
    config = manifest.get("config") or {}
    defaults = EvidenceSettings()
    return EvidenceSettings(
        floor=int(config.get("floor", defaults.floor)),
        resamples=int(config.get("resamples", defaults.resamples)),
        seed=int(config.get("seed", defaults.seed)),
    )


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
    return _decisive_metric(measured)


def qa_task(root: Path) -> Task:
    """The task the study's HotpotQA stages ran (HotpotQA, or the multi-hop task standing for it), from their
    manifests; before any of them ran, the task the study will run (its HotpotQA file, else its preset's
    ``qa_source``, as ``reproduce`` chooses it); HotpotQA when nothing says."""
    for stage in (stages.HOTPOTQA, stages.HOTPOTQA_ABLATION, stages.HOTPOTQA_PROGRESSIVE, stages.HOTPOTQA_STATIC):
        task = task_of_manifest(read_json_if_any(root / stage / "manifest.json") or {})
        if task is not None:
            return task
    manifest = read_json_if_any(root / "manifest.json") or {}
    data = (manifest.get("config") or {}).get("hotpotqa") or (manifest.get("preset_settings") or {}).get("qa_source")
    try:
        return task_of(HOTPOTQA.name, data) if isinstance(data, str) else HOTPOTQA
    except DynheadsError:  # a source this dynheads does not know: the stages that ran it say what it was
        return HOTPOTQA


def stages_not_run(root: Path) -> list[str]:
    """The study's stages that have not run yet: those ``stages.json`` does not log (``reproduce`` logs a stage when
    it ends, failed or not, so an interrupted one is not run); in a folder without ``stages.json`` (assembled by
    hand), the stages without a folder."""
    log = read_json_if_any(root / "stages.json")
    names = stages.STAGES.names()
    if isinstance(log, dict):
        return [name for name in names if name not in log]
    return [name for name in names if not (root / name).is_dir()]


@dataclass(frozen=True)
class StudyFolder:
    """What a section reads: the study folder, the settings that decide its verdicts, and the QA task its
    HotpotQA-side stages ran."""

    root: Path
    evidence: EvidenceSettings
    qa: Task


@dataclass(frozen=True)
class ReportSection:
    """One section of the report: its title (``{qa}`` stands for the QA task's label), what builds its parts from
    the study (text, tables, figures and its claims' verdicts, e.g. by a ``claims`` function), the task whose stages
    it shows (``niah``, ``qa`` or None: its verdicts' cards set the paper's numbers for that task beside ours, and a
    task the model does not solve makes them inconclusive), and the figure of its verdict cards: a stage folder and
    file patterns (the first pattern that matches, first match in name order)."""

    title: str
    build: Callable[[StudyFolder], list[Part]]
    side: Literal["niah", "qa"] | None = None
    card_figure: tuple[str, tuple[str, ...]] = ("", ())


# The report's sections in order, each under its anchor: one entry (and its claim function) adds a section with
# its verdict cards; register one from anywhere (a test file) as ``study_stage`` adds a stage to the study.
REPORT_SECTIONS = Registry[ReportSection]("report section")
# Claim 2's card figure: the dose curves, else the matched grid's heat maps
CLAIM2_FIGURES = ("plots/dose-teacher.png", "plots/dose-cascade.png", "plots/ablation-*.png")


def build_sections(root: Path, evidence: EvidenceSettings | None = None) -> list[Section]:
    """The registered sections in order; any error while reading a stage becomes text in its section."""
    study = StudyFolder(root, evidence or EvidenceSettings(), qa_task(root))
    tasks = {"niah": NIAH, "qa": study.qa, None: None}
    sections = []
    for entry in REPORT_SECTIONS:
        spec = entry.value
        try:
            parts = spec.build(study)
        except READ_ERRORS as error:
            parts = [f"*Could not read this stage: {error}*"]
        title = spec.title.format(qa=study.qa.label)
        sections.append(Section(entry.name, title, parts, tasks[spec.side], spec.card_figure))
    return _gate_unsolved(sections, root, study.qa)


def report_section(
    anchor: str,
    title: str,
    side: Literal["niah", "qa"] | None = None,
    card_figure: tuple[str, tuple[str, ...]] = ("", ()),
) -> Callable[[Callable[[StudyFolder], list[Part]]], Callable[[StudyFolder], list[Part]]]:
    """Register the decorated function as the parts of section ``anchor`` (``ReportSection``)."""

    def add(build: Callable[[StudyFolder], list[Part]]) -> Callable[[StudyFolder], list[Part]]:
        REPORT_SECTIONS.register(anchor, ReportSection(title, build, side, card_figure), help=title.format(qa="QA"))
        return build

    return add


# ---- the static list, the NIAH setup and the three claims on NIAH -----------------------------------------------
@report_section("static", "Static retrieval heads (Wu et al. 2024)")
def _static_section(study: StudyFolder) -> list[Part]:
    return _static(study.root)


@report_section(stages.NIAH, f"{NIAH.label} setup (Section 3.1)", side="niah")
def _niah_setup(study: StudyFolder) -> list[Part]:
    return _task_run(study.root, stages.NIAH)


@report_section(
    "claim1-niah", "Claim 1, dynamism, on NIAH (Figure 1, Tables 1 and 5)", "niah", (stages.DYNAMISM, ("heads-*.png",))
)
def _claim1_niah(study: StudyFolder) -> list[Part]:
    stage_pair = (stages.DYNAMISM, stages.PROBE)
    return _dynamism(study.root, stage_pair, NIAH.label, "Figure 1", _table1_note(), study.evidence)


@report_section(
    "claim2-niah", "Claim 2, irreplaceability, on NIAH (Figures 2 and 3)", "niah", (stages.ABLATION, CLAIM2_FIGURES)
)
def _claim2_niah(study: StudyFolder) -> list[Part]:
    figures, paper = ("Figure 2", "Figure 3"), (f"{PAPER_MODEL}: {PAPER_GRID}.", f"{PAPER_MODEL}: {PAPER_PROGRESSIVE}.")
    return _ablation(study.root, (stages.ABLATION, stages.PROGRESSIVE), figures, NIAH.label, *paper, study.evidence)


@report_section("claim3-niah", "Claim 3, correlation, on NIAH (Figure 4, Table 2)", "niah", (stages.CCA, ("cca.png",)))
def _claim3_niah(study: StudyFolder) -> list[Part]:
    notes = (_cca_note(), _range_note("Table 2", PAPER_PROBE_BINARY, ("f1", "auprc")))
    stage_pair = (stages.CCA, stages.PROBE)
    return _correlation(study.root, stage_pair, "Figure 4", "binary", NIAH.label, *notes, study.evidence)


# ---- the HotpotQA (or stand-in) setup, the three claims on it, and Dynamic RAG -------------------------------------
@report_section(stages.HOTPOTQA, "{qa} setup (Section 5)", side="qa")
def _qa_setup(study: StudyFolder) -> list[Part]:
    root = study.root
    static = root / stages.HOTPOTQA_STATIC
    return _task_run(root, stages.HOTPOTQA) + (
        _stage(root, stages.HOTPOTQA_STATIC, "Static reasoning heads") if static.is_dir() else []
    )


@report_section(
    "claim1-hotpotqa", "Claim 1, dynamism, on {qa} (Figure 5)", "qa", (stages.HOTPOTQA_DYNAMISM, ("heads-*.png",))
)
def _claim1_qa(study: StudyFolder) -> list[Part]:
    pair = (stages.HOTPOTQA_DYNAMISM, stages.HOTPOTQA_PROBE)
    return _dynamism(study.root, pair, study.qa.label, "Figure 5", PAPER_FIGURE5, study.evidence)


@report_section(
    "claim2-hotpotqa",
    "Claim 2, irreplaceability, on {qa} (Figures 6 and 7)",
    "qa",
    (stages.HOTPOTQA_ABLATION, CLAIM2_FIGURES),
)
def _claim2_qa(study: StudyFolder) -> list[Part]:
    pair, figures = (stages.HOTPOTQA_ABLATION, stages.HOTPOTQA_PROGRESSIVE), ("Figure 6", "Figure 7")
    return _ablation(study.root, pair, figures, study.qa.label, PAPER_FIGURE6, PAPER_FIGURE7, study.evidence)


@report_section(
    "claim3-hotpotqa", "Claim 3, correlation, on {qa} (Figure 8, Table 3)", "qa", (stages.HOTPOTQA_CCA, ("cca.png",))
)
def _claim3_qa(study: StudyFolder) -> list[Part]:  # Eq. 2 scores: a regressor
    notes = (PAPER_FIGURE8, _range_note("Table 3", PAPER_PROBE_CONTINUOUS, ("r2",)))
    pair = (stages.HOTPOTQA_CCA, stages.HOTPOTQA_PROBE)
    return _correlation(study.root, pair, "Figure 8", "continuous", study.qa.label, *notes, study.evidence)


@report_section("rag", "Dynamic RAG (Section 6, Tables 4 and 6)", side="qa")
def _rag_section(study: StudyFolder) -> list[Part]:
    return _rag(study.root, study.qa.label, study.evidence)


def _unsolved(root: Path, stage: str, task: str) -> str:
    """Why the verdicts on ``task`` are not decided (``claims.unsolved_reason`` on its task run), or ""."""
    try:
        records = RunDir(root / stage).records() if (root / stage).is_dir() else []
        return claims.unsolved_reason(
            records, _decisive_metric((records[0].get("metrics") or {}) if records else ()), task
        )
    except READ_ERRORS:
        return ""


def _gate_unsolved(sections: list[Section], root: Path, qa: Task) -> list[Section]:
    """Every verdict of a section whose task (NIAH, or the QA task ``qa``) the model does not solve becomes
    inconclusive with the reason (one whose stages have not run stays "not run")."""
    reasons = {NIAH.name: _unsolved(root, stages.NIAH, NIAH.label), qa.name: _unsolved(root, stages.HOTPOTQA, qa.label)}
    return [
        replace(
            section,
            parts=[
                claims.gated(part, reason) if isinstance(part, Verdict) and part.status != claims.NOT_RUN else part
                for part in section.parts
            ],
        )
        if section.task is not None and (reason := reasons.get(section.task.name, ""))
        else section
        for section in sections
    ]


# ---- sections ---------------------------------------------------------------------------------------------------
def _stage(root: Path, name: str, figure: str, notes: Iterable[str] = ()) -> list[Part]:
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


def _static(root: Path) -> list[Part]:
    parts = _stage(
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
            f"tests counted); top-20: {', '.join(summary['top20'])}.",
        )
    return parts


def _task_run(root: Path, stage: str) -> list[Part]:
    parts = _stage(root, stage, "Figure")
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


def _dynamism(
    root: Path, folders: tuple[str, str], task: str, figure: str, note: str, evidence: EvidenceSettings
) -> list[Part]:
    """Claim 1: the dynamism stage's statistics and the head predictor's within-step ranking (its stage)."""
    stage, predictor = folders
    data, metrics = stage_evidence(root, stage), stage_evidence(root, predictor)
    verdict = _guard(
        lambda: (
            _unfinished(root, folders, claims.CLAIM1, task) or claims.dynamism_verdict(data, task, evidence, metrics)
        ),
        claims.CLAIM1,
        task,
    )
    return [verdict, *_stage(root, stage, figure, [note])]


def _unfinished(root: Path, needed: Iterable[str], claim: str, task: str) -> Verdict | None:
    """The verdict of a claim whose stages ``needed`` have not all finished, or None: inconclusive naming the
    first that failed (stages.json records why), else "not run" naming those not run yet (``stages_not_run``)."""
    log = read_json_if_any(root / "stages.json") or {}
    for stage in needed:
        error = (log.get(stage) or {}).get("error") if isinstance(log.get(stage), dict) else None
        if error:
            return claims.failed(claim, task, f"stage {stage} failed: {error}")
    not_run = set(stages_not_run(root))
    missing = [stage for stage in needed if stage in not_run]
    return claims.not_run(claim, task, missing) if missing else None


def _ablation(
    root: Path,
    folders: tuple[str, str],
    figures: tuple[str, str],
    task: str,
    grid_note: str,
    progressive_note: str,
    evidence: EvidenceSettings,
) -> list[Part]:
    """Claim 2: the stages (ablation grid, progressive ablation) of one task and their figures (2, 3 or 6, 7)."""
    grid, progressive = folders

    def verdict() -> Verdict:
        numbers = stage_evidence(root, grid) or {}
        if numbers.get("design") == "dose":  # an older dynheads: every arm at k heads per step
            return claims.failed(claims.CLAIM2, task, OLD_DOSE_DESIGN)
        if numbers.get("design") == "fraction":
            return claims.operating_point_verdict(operating_point(numbers), task, evidence)
        per_sample = numbers.get("per_sample") or {}
        metric = _decisive_metric(per_sample)
        values = (
            {strategy: np.asarray(arm, dtype=float) for strategy, arm in per_sample[metric].items()}
            if metric in per_sample
            else None
        )
        masking = claims.AblationMasking(**numbers["masking"]) if "masking" in numbers else None
        return claims.irreplaceability_verdict(values, metric, task, masking, evidence)

    return [
        _guard(lambda: _unfinished(root, (grid,), claims.CLAIM2, task) or verdict(), claims.CLAIM2, task),
        *_stage(root, grid, figures[0], [grid_note]),
        *_stage(root, progressive, figures[1], [progressive_note]),
    ]


OLD_DOSE_DESIGN = (
    "old design: every arm masked a fixed k heads per step, which past |D_t| measures compensation (D_t plus inert "
    "heads against D_t plus its backups), not D_t: re-run the ablation (fractions of each step's |D_t|)"
)


def operating_point(numbers: Mapping[str, Any]) -> claims.OperatingPoint | None:
    """Claim 2's operating point from a dose-response stage's numbers (``experiments.dose.write_doses``): per arm
    the teacher-forced numbers at f = 1, the mean-matched controls beside; None without teacher-forced numbers."""
    teacher = numbers.get("teacher")
    if not teacher:
        return None

    def at_one(quantity: str) -> dict[str, np.ndarray]:
        return {
            arm: np.asarray([math.nan if v is None else v for v in doses["1"]], dtype=float)
            for arm, doses in teacher[quantity].items()
            if "1" in doses
        }

    correct = np.asarray(teacher["correct"], dtype=bool)
    return claims.OperatingPoint(at_one("drop_nonempty"), at_one("drop"), at_one("overlap"), correct)


def _decisive_metric(metrics: Iterable[str]) -> str:
    """Claim 2's metric: the first of ABLATION_METRICS that the ablation stage measured."""
    return next((metric for metric in ABLATION_METRICS if metric in set(metrics)), ABLATION_METRICS[0])


def _correlation(
    root: Path,
    folders: tuple[str, str],
    figure: str,
    probe_kind: str,
    task: str,
    cca_note: str,
    probe_note: str,
    evidence: EvidenceSettings,
) -> list[Part]:
    """Claim 3: the stages (CCA, MLP probe) of one task; ``figure`` is the CCA's (4 or 8), ``probe_kind`` the
    probe's task when its metrics do not say (binary copy scores, or continuous Eq. 2 scores)."""
    cca, probe_stage = folders

    def verdict() -> Verdict:
        row = ((stage_evidence(root, cca) or {}).get("held_out") or {}).get(str(claims.CCA_OFFSET))
        metrics = stage_evidence(root, probe_stage)
        kind = (metrics or {}).get("task", probe_kind)
        return claims.correlation_verdict(row, metrics, "auprc" if kind == "binary" else "r2", task, evidence)

    return [
        _guard(lambda: _unfinished(root, folders, claims.CLAIM3, task) or verdict(), claims.CLAIM3, task),
        *_stage(root, cca, figure, [cca_note]),
        *_stage(root, probe_stage, "Probe", [probe_note]),
    ]


def stage_evidence(root: Path, stage: str) -> dict | None:
    """The numbers stage ``stage`` published for its verdict (its evidence document in ``summary.json``, see
    ``dynheads.stages``); None when the stage has not written them."""
    folder = root / stage
    summary = read_summaries(folder).get(stages.evidence_of(stage)) if folder.is_dir() else None
    return summary.numbers if summary is not None else None


def _rag(root: Path, task: str, evidence: EvidenceSettings) -> list[Part]:
    def verdict() -> Verdict:
        pairs = (stage_evidence(root, stages.RAG) or {}).get("f1_pairs") or {}
        return claims.rag_verdict(
            {
                int(k): (np.asarray(arms["dynamic"], dtype=float), np.asarray(arms["static"], dtype=float))
                for k, arms in pairs.items()
            },
            task,
            evidence,
        )

    header = ["model", *RAG_STRATEGIES.values()]
    table4 = [[model, *(_em_f1(row.get(s)) for s in RAG_STRATEGIES)] for model, row in PAPER_TABLE4.items()]
    table6 = [
        [f"k={k}", *(_em_f1(row[s]) for s in RAG_STRATEGIES if s != "none")]
        for k, row in {5: PAPER_TABLE4[PAPER_MODEL], **PAPER_TABLE6}.items()
    ]
    return [
        _guard(lambda: _unfinished(root, (stages.RAG,), claims.RAG, task) or verdict(), claims.RAG, task),
        *_stage(root, stages.RAG, "RAG"),
        "Paper, Table 4 (HotpotQA EM / F1, k = 5):",
        Table(header, table4),
        "Paper, Table 6 (llama3.1-8b, EM / F1 by k):",
        Table(["k", *header[1:-1]], table6),
    ]


def _em_f1(value: tuple[float, float] | None) -> str:
    return f"{value[0]:.3f} / {value[1]:.4f}" if value else ""


def _guard(compute: Callable[[], Verdict], claim: str, task: str) -> Verdict:
    try:
        return compute()
    except READ_ERRORS as error:
        return Verdict(claim, task, "inconclusive", f"could not read the stage files: {error}")


# ---- paper notes -------------------------------------------------------------------------------------------------
def _table1_note() -> str:
    rows = PAPER_DYNAMISM.values()

    def span(key: str, spec: str) -> str:
        values = [row[key] for row in rows]
        return f"{format(min(values), spec)}-{format(max(values), spec)}"

    return (
        f"Table 1 (five models): Jaccard w/ static top-20 {span('jaccard_static_k20', '.4f')}, unique heads "
        f"{span('unique_heads', '.0f')}, entropy {span('entropy', '.4f')} (baseline ln 20 = "
        f"{ENTROPY_BASELINE:.4f}); Figure 1 shows the 10 most varying heads of one llama3.1-8b answer switching "
        "on and off."
    )


def _cca_note() -> str:
    return (
        "; ".join(
            f"Figure 4 ({model}, in-sample top-1): " + ", ".join(f"k={k} {v:.3f}" for k, v in values.items())
            for model, values in PAPER_TOP1.items()
        )
        + "."
    )


def _range_note(table: str, paper: Mapping[str, Mapping[str, float]], keys: tuple[str, ...]) -> str:
    ranges = ", ".join(
        f"{key} {min(r[key] for r in paper.values()):.4f}-{max(r[key] for r in paper.values()):.4f}" for key in keys
    )
    return f"{table} (probe on the test split, {len(paper)} models): {ranges}."


# ---- overview, summary, settings --------------------------------------------------------------------------------
def _overview(manifest: dict, timings: dict) -> list[Part]:
    """The run's manifest, and each stage's wall time from ``stages.json`` (the attempt that finished it)."""
    if not manifest:
        return [f"*`manifest.json`: {STAGE_NOT_RUN} (no top-level manifest).*"]
    rows = [[f"model {key}", _value(value)] for key, value in (manifest.get("model") or {}).items()]
    rows += [[key, _value(value)] for key, value in manifest.items() if key not in ("model", "config", "versions")]
    rows.append(["versions", ", ".join(f"{k} {v}" for k, v in (manifest.get("versions") or {}).items())])
    config = [[key, _value(value)] for key, value in (manifest.get("config") or {}).items()]
    times = [
        [name, f"{entry.get('seconds', 0):.0f}", entry.get("error", "")]
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


def _summary(headlines: list[Headline], manifest: dict, not_run: list[str]) -> Section:
    """The first section: how much of the study is missing (when any is), the question, the cards, the rules."""
    model = (manifest.get("model") or {}).get("name", "this model")
    preset = f", preset `{manifest['preset']}`" if manifest.get("preset") else ""
    return Section(
        "verdicts",
        "Verdicts",
        _missing_stages(not_run)
        + [
            f"Does {model}{preset} show what the paper claims? Each card: the verdict, its figure, and the numbers it "
            "rests on beside the paper's (llama3.1-8b, or the range over the paper's models); click for the section.",
            Cards(headlines),
            f"Rules (docs/report.md): {claims.RULES}.",
        ],
    )


def _missing_stages(not_run: list[str]) -> list[Part]:
    """The partial study's first line: how many of its stages have not run, and how to run them."""
    if not not_run:
        return []
    return [
        f"**{len(not_run)} of {len(stages.STAGES)} stages not run yet: run the same command to continue** "
        f"(`dynheads reproduce` with the same `--out` and settings resumes where it stopped). Not run: "
        f'{", ".join(not_run)}; the cards of the claims they decide say "{claims.NOT_RUN}".'
    ]


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
        shown = [f"`{key}={_value(value)}`" for key, value in values.items() if _short(value)]
        if shown:
            lines.append(f"- `{path.relative_to(root).as_posix()}`: " + ", ".join(shown))
    return "Settings:\n\n" + "\n".join(lines) if lines else "No settings recorded."


def _short(value: Any) -> bool:
    scalar = (str, int, float, bool, type(None))
    return isinstance(value, scalar) or (
        isinstance(value, list | tuple) and len(value) <= 12 and all(isinstance(item, scalar) for item in value)
    )


def _value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return text if len(text) <= 100 else text[:97] + "..."


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


# ---- rendering ----------------------------------------------------------------------------------------------------
def _markdown(title: str, sections: list[Section], run: Section, root: Path) -> str:
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
    rows = to_markdown(_card_table(card))
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
        f"{figure}{to_html(_card_table(card))}</div>"
    )


def _card_table(card: Headline) -> Table:
    return Table(["", "ours", "paper"], [list(row) for row in card.rows])


def _html(title: str, sections: list[Section], run: Section, step_data: dict[str, Any]) -> str:
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


def _demoted(summary: Summary, by: int = 3) -> list[Part]:
    """A stage's results as report parts, its headings below the report's own (its title, level 1, at level 4)."""

    def part(block: Block) -> Part:
        if isinstance(block, Heading):
            return Heading(block.text, min(block.level + by, 6))
        return Plain(block.strip()) if isinstance(block, str) else block

    return [part(block) for block in summary.parts()]


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
