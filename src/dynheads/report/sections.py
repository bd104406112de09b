"""The report's sections, each a ``ReportSection`` made with ``@report_section``: what it says of the study (text,
tables, figures and its claims' verdicts). A stage names the section that shows it (``dynheads.stages.Stage.section``,
a ``"module:attribute"`` string); the report shows the sections of the study's stages in the paper's order
(``SECTION_ORDER``), and gates a section's verdicts when the model does not solve its task."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from dynheads import stages
from dynheads.analysis.evidence import EvidenceSettings
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
    PAPER_TOP1,
)
from dynheads.report import claims
from dynheads.report.claim_parts import ablation_parts, correlation_parts, dynamism_parts, rag_parts
from dynheads.report.claims import Verdict
from dynheads.report.parts import Part, Section
from dynheads.report.stage_parts import stage_parts, static_parts, task_run_parts
from dynheads.report.study import READ_ERRORS, decisive_metric, qa_task, study_stage_names
from dynheads.runs import RunDir
from dynheads.tasks.niah import NIAH
from dynheads.tasks.registry import Task


@dataclass(frozen=True)
class StudyFolder:
    """What a section reads: the study folder, the settings that decide its verdicts, and the QA task its
    HotpotQA-side stages ran."""

    root: Path
    evidence: EvidenceSettings
    qa: Task


@dataclass(frozen=True)
class ReportSection:
    """One section of the report: its anchor (in links to it), its title (``{qa}`` stands for the QA task's label),
    what builds its parts from the study (text, tables, figures and its claims' verdicts, e.g. by a ``claims``
    function), the task whose stages it shows (``niah``, ``qa`` or None: its verdicts' cards set the paper's numbers
    for that task beside ours, and a task the model does not solve makes them inconclusive), and the figure of its
    verdict cards: a stage folder and file patterns (the first pattern that matches, first match in name order)."""

    anchor: str
    title: str
    build: Callable[[StudyFolder], list[Part]]
    side: Literal["niah", "qa"] | None = None
    card_figure: tuple[str, tuple[str, ...]] = ("", ())


# The report's order, the paper's: the stages whose sections come first (the static list before the NIAH grid, then
# each task's setup, its three claims, and RAG); the section of any other stage of the study (an optional stage, one
# registered elsewhere) follows them, in run order.
SECTION_ORDER = (
    stages.STATIC,
    stages.NIAH,
    stages.DYNAMISM,
    stages.ABLATION,
    stages.CCA,
    stages.HOTPOTQA,
    stages.HOTPOTQA_DYNAMISM,
    stages.HOTPOTQA_ABLATION,
    stages.HOTPOTQA_CCA,
    stages.RAG,
)
# Claim 2's card figure: the dose curves, else the matched grid's heat maps
CLAIM2_FIGURES = ("plots/dose-teacher.png", "plots/dose-cascade.png", "plots/ablation-*.png")


def build_sections(root: Path, evidence: EvidenceSettings | None = None) -> list[Section]:
    """The sections of the study's stages in order; any error while reading a stage becomes text in its section."""
    study = StudyFolder(root, evidence or EvidenceSettings(), qa_task(root))
    tasks = {"niah": NIAH, "qa": study.qa, None: None}
    sections = []
    for spec in report_sections(study_stage_names(root)):
        try:
            parts = spec.build(study)
        except READ_ERRORS as error:
            parts = [f"*Could not read this stage: {error}*"]
        title = spec.title.format(qa=study.qa.label)
        sections.append(Section(spec.anchor, title, parts, tasks[spec.side], spec.card_figure))
    return _gate_unsolved(sections, root, study.qa)


def report_sections(names: list[str]) -> list[ReportSection]:
    """The sections that show the stages ``names`` (``Stage.section``), in the report's order (``SECTION_ORDER``,
    then the others in the order of ``names``)."""
    ordered = [name for name in SECTION_ORDER if name in names] + [name for name in names if name not in SECTION_ORDER]
    sections = (stages.STAGES.get(name).report_section() for name in ordered)
    return [section for section in sections if section is not None]


def report_section(
    anchor: str,
    title: str,
    side: Literal["niah", "qa"] | None = None,
    card_figure: tuple[str, tuple[str, ...]] = ("", ()),
) -> Callable[[Callable[[StudyFolder], list[Part]]], ReportSection]:
    """Make the decorated function the parts of the section ``anchor`` (``ReportSection``); a stage shows it by
    naming it (``Stage.section``, ``"module:name"``)."""

    def make(build: Callable[[StudyFolder], list[Part]]) -> ReportSection:
        return ReportSection(anchor, title, build, side, card_figure)

    return make


# ---- the static list, the NIAH setup and the three claims on NIAH -----------------------------------------------
@report_section("static", "Static retrieval heads (Wu et al. 2024)")
def static_section(study: StudyFolder) -> list[Part]:
    return static_parts(study.root)


@report_section(stages.NIAH, f"{NIAH.label} setup (Section 3.1)", side="niah")
def niah_setup(study: StudyFolder) -> list[Part]:
    return task_run_parts(study.root, stages.NIAH)


@report_section(
    "claim1-niah", "Claim 1, dynamism, on NIAH (Figure 1, Tables 1 and 5)", "niah", (stages.DYNAMISM, ("heads-*.png",))
)
def claim1_niah(study: StudyFolder) -> list[Part]:
    stage_pair = (stages.DYNAMISM, stages.PROBE)
    return dynamism_parts(study.root, stage_pair, NIAH.label, "Figure 1", _table1_note(), study.evidence)


@report_section(
    "claim2-niah", "Claim 2, irreplaceability, on NIAH (Figures 2 and 3)", "niah", (stages.ABLATION, CLAIM2_FIGURES)
)
def claim2_niah(study: StudyFolder) -> list[Part]:
    pair = (stages.ABLATION, stages.PROGRESSIVE)
    figures, paper = (
        ("Figure 2", "Figure 3"),
        (f"{PAPER_MODEL}: {PAPER_GRID['niah']}.", f"{PAPER_MODEL}: {PAPER_PROGRESSIVE}."),
    )
    return ablation_parts(study.root, pair, figures, NIAH.label, *paper, study.evidence)


@report_section("claim3-niah", "Claim 3, correlation, on NIAH (Figure 4, Table 2)", "niah", (stages.CCA, ("cca.png",)))
def claim3_niah(study: StudyFolder) -> list[Part]:
    notes = (_cca_note(), _range_note("Table 2", PAPER_PROBE_BINARY, ("f1", "auprc")))
    stage_pair = (stages.CCA, stages.PROBE)
    return correlation_parts(study.root, stage_pair, "Figure 4", "binary", NIAH.label, *notes, study.evidence)


# ---- the HotpotQA (or stand-in) setup, the three claims on it, and Dynamic RAG -------------------------------------
@report_section(stages.HOTPOTQA, "{qa} setup (Section 5)", side="qa")
def qa_setup(study: StudyFolder) -> list[Part]:
    root = study.root
    static = root / stages.HOTPOTQA_STATIC
    return task_run_parts(root, stages.HOTPOTQA) + (
        stage_parts(root, stages.HOTPOTQA_STATIC, "Static reasoning heads") if static.is_dir() else []
    )


@report_section(
    "claim1-hotpotqa", "Claim 1, dynamism, on {qa} (Figure 5)", "qa", (stages.HOTPOTQA_DYNAMISM, ("heads-*.png",))
)
def claim1_qa(study: StudyFolder) -> list[Part]:
    pair = (stages.HOTPOTQA_DYNAMISM, stages.HOTPOTQA_SET_PROBE)  # the predictor of D_t (Eq. 2 sets)
    return dynamism_parts(study.root, pair, study.qa.label, "Figure 5", PAPER_FIGURE5, study.evidence)


@report_section(
    "claim2-hotpotqa",
    "Claim 2, irreplaceability, on {qa} (Figures 6 and 7)",
    "qa",
    (stages.HOTPOTQA_ABLATION, CLAIM2_FIGURES),
)
def claim2_qa(study: StudyFolder) -> list[Part]:
    pair, figures = (stages.HOTPOTQA_ABLATION, stages.HOTPOTQA_PROGRESSIVE), ("Figure 6", "Figure 7")
    return ablation_parts(study.root, pair, figures, study.qa.label, PAPER_FIGURE6, PAPER_FIGURE7, study.evidence)


QA_SET_PREDICTOR_NOTE = (
    "On Eq. 2 tasks the predictor of D_t (the Eq. 2 heads above the fitted threshold) decides Claim 3 alone; the "
    "CCA of the shares and the paper's Table 3 regressor of the shares (below) are descriptive, without the power "
    "to decide at short answers (`dynheads rules`)"
)


@report_section(
    "claim3-hotpotqa", "Claim 3, correlation, on {qa} (Figure 8, Table 3)", "qa", (stages.HOTPOTQA_CCA, ("cca.png",))
)
def claim3_qa(study: StudyFolder) -> list[Part]:
    """The predictor of D_t (the Eq. 2 sets, ``hotpotqa-set-probe``) decides; the CCA of the shares and the
    regressor of the shares themselves (the paper's Table 3) are shown beside, deciding nothing: at HotpotQA's short
    answers the CCA misses most true simulated studies and the regressor calls them "not supported"
    (``report.rules``)."""
    pair = (stages.HOTPOTQA_CCA, stages.HOTPOTQA_SET_PROBE)
    notes = (PAPER_FIGURE8, QA_SET_PREDICTOR_NOTE)
    decided = correlation_parts(
        study.root,
        pair,
        "Figure 8",
        "binary",
        study.qa.label,
        *notes,
        study.evidence,
        claims.CLAIM3_QA_DECIDING,
        claims.SET_PROBE_MARGIN,
    )
    table3 = _range_note("Table 3", PAPER_PROBE_CONTINUOUS, ("r2",))
    return decided + stage_parts(study.root, stages.HOTPOTQA_PROBE, "Regressor of the shares", [table3])


@report_section("rag", "Dynamic RAG (Section 6, Tables 4 and 6)", side="qa")
def rag_section(study: StudyFolder) -> list[Part]:
    return rag_parts(study.root, study.qa.label, study.evidence)


def _unsolved(root: Path, stage: str, task: str) -> str:
    """Why the verdicts on ``task`` are not decided (``claims.unsolved_reason`` on its task run), or ""."""
    try:
        records = RunDir(root / stage).records() if (root / stage).is_dir() else []
        return claims.unsolved_reason(
            records, decisive_metric((records[0].get("metrics") or {}) if records else ()), task
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
