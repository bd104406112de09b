"""Each claim's parts: its verdict, decided by the rules of ``dynheads.report.claims`` from the numbers its stages
published (or why it is not decided), then those stages (``stage_parts``)."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dynheads import stages
from dynheads.analysis.evidence import EvidenceSettings
from dynheads.io import read_json_if_any
from dynheads.paper import PAPER_MODEL, PAPER_TABLE4, PAPER_TABLE6
from dynheads.report import claims
from dynheads.report.claims import Verdict
from dynheads.report.parts import Part
from dynheads.report.stage_parts import stage_parts
from dynheads.report.study import READ_ERRORS, decisive_metric, stage_evidence, stages_gone, stages_not_run
from dynheads.tables import Table

RAG_STRATEGIES = {
    "dynamic": "Dynamic",
    "static": "Static",
    "dynamic-random": "Dynamic Random",
    "fixed-random": "Fixed Random",
    "none": "w/o RAG",
}


def dynamism_parts(
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
    return [verdict, *stage_parts(root, stage, figure, [note])]


def _unfinished(root: Path, needed: Iterable[str], claim: str, task: str) -> Verdict | None:
    """The verdict of a claim whose stages ``needed`` have not all finished, or None: inconclusive naming the
    first that failed (stages.json records why), else "not run" naming those whose folder is gone
    (``stages_gone``) or, failing that, those not run yet (``stages_not_run``)."""
    log = read_json_if_any(root / "stages.json") or {}
    for stage in needed:
        error = (log.get(stage) or {}).get("error") if isinstance(log.get(stage), dict) else None
        if error:
            return claims.failed(claim, task, f"stage {stage} failed: {error}")
    gone = [stage for stage in needed if stage in set(stages_gone(root))]
    if gone:
        return claims.folder_gone(claim, task, gone)
    not_run = set(stages_not_run(root))
    missing = [stage for stage in needed if stage in not_run]
    return claims.not_run(claim, task, missing) if missing else None


def ablation_parts(
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
        metric = decisive_metric(per_sample)
        values = (
            {strategy: np.asarray(arm, dtype=float) for strategy, arm in per_sample[metric].items()}
            if metric in per_sample
            else None
        )
        masking = claims.AblationMasking(**numbers["masking"]) if "masking" in numbers else None
        return claims.irreplaceability_verdict(values, metric, task, masking, evidence)

    return [
        _guard(lambda: _unfinished(root, (grid,), claims.CLAIM2, task) or verdict(), claims.CLAIM2, task),
        *stage_parts(root, grid, figures[0], [grid_note]),
        *stage_parts(root, progressive, figures[1], [progressive_note]),
    ]


OLD_DOSE_DESIGN = (
    "old design: every arm masked a fixed k heads per step, which past |D_t| measures compensation (D_t plus inert "
    "heads against D_t plus its backups), not D_t: re-run the ablation (fractions of each step's |D_t|)"
)


def operating_point(numbers: Mapping[str, Any]) -> claims.OperatingPoint | None:
    """Claim 2's operating point from a dose-response stage's numbers (``views.dose_tables.dose_tables``): per arm
    the teacher-forced numbers at f = 1, the mean-matched controls beside; None without teacher-forced numbers."""
    teacher = numbers.get("teacher")
    if not teacher:
        return None

    def at_one(quantity: str) -> dict[str, np.ndarray]:
        return {
            arm: np.asarray([math.nan if v is None else v for v in doses["1"]], dtype=float)
            for arm, doses in teacher.get(quantity, {}).items()
            if "1" in doses
        }

    correct = np.asarray(teacher["correct"], dtype=bool)
    return claims.OperatingPoint(
        at_one("drop_nonempty"), at_one("drop"), at_one("overlap"), correct, masked=at_one("masked")
    )


def correlation_parts(
    root: Path,
    folders: tuple[str, str],
    figure: str,
    probe_kind: str,
    task: str,
    cca_note: str,
    probe_note: str,
    evidence: EvidenceSettings,
    deciding: tuple[str, ...] = claims.CLAIM3_DECIDING,
    predictor_margin: float = claims.PROBE_MARGIN,
) -> list[Part]:
    """Claim 3: the stages (CCA, MLP probe) of one task; ``figure`` is the CCA's (4 or 8), ``probe_kind`` the
    probe's task when its metrics do not say (binary copy scores, or continuous Eq. 2 scores); ``deciding`` and
    ``predictor_margin``: the rules that decide on this task and the predictor's margin
    (``claims.correlation_verdict``)."""
    cca, probe_stage = folders

    def verdict() -> Verdict:
        row = ((stage_evidence(root, cca) or {}).get("held_out") or {}).get(str(claims.CCA_OFFSET))
        metrics = stage_evidence(root, probe_stage)
        kind = (metrics or {}).get("task", probe_kind)
        metric = "auprc" if kind == "binary" else "r2"
        return claims.correlation_verdict(row, metrics, metric, task, evidence, deciding, predictor_margin)

    return [
        _guard(lambda: _unfinished(root, folders, claims.CLAIM3, task) or verdict(), claims.CLAIM3, task),
        *stage_parts(root, cca, figure, [cca_note]),
        *stage_parts(root, probe_stage, "Probe", [probe_note]),
    ]


def rag_parts(root: Path, task: str, evidence: EvidenceSettings) -> list[Part]:
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
        *stage_parts(root, stages.RAG, "RAG"),
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
