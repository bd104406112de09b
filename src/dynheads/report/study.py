"""What the report reads of a study folder as a whole: its verdict settings, the QA task its HotpotQA-side stages
ran, its stages and those not run yet, and the numbers each stage published for its verdict."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path

from dynheads import stages
from dynheads.analysis.evidence import EvidenceSettings
from dynheads.errors import DynheadsError
from dynheads.io import read_json_if_any
from dynheads.tables import read_summaries
from dynheads.tasks.hotpotqa import HOTPOTQA
from dynheads.tasks.registry import Task, task_of, task_of_manifest

READ_ERRORS = (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError, DynheadsError)
ABLATION_METRICS = ("accuracy", "f1", "em", "rouge_l")  # the first one the stage measured decides Claim 2


def evidence_of(manifest: Mapping) -> EvidenceSettings:
    """The verdict settings a study recorded (the defaults for what it does not record)."""
    config = manifest.get("config") or {}
    defaults = EvidenceSettings()
    return EvidenceSettings(
        floor=int(config.get("floor", defaults.floor)),
        resamples=int(config.get("resamples", defaults.resamples)),
        seed=int(config.get("seed", defaults.seed)),
    )


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


def study_stage_names(root: Path) -> list[str]:
    """The stages of the study in ``root``, in run order (``stages.study_stages``): every stage that is not optional,
    and each optional one whose table its preset had (the manifest's ``preset_settings``)."""
    tables = ((read_json_if_any(root / "manifest.json") or {}).get("preset_settings")) or {}
    return stages.study_stages([name for name, table in tables.items() if isinstance(table, dict)])


def stages_not_run(root: Path) -> list[str]:
    """The study's stages that have not run yet: those ``stages.json`` does not log (``reproduce`` logs a stage when
    it ends, failed or not, so an interrupted one is not run); in a folder without ``stages.json`` (assembled by
    hand), the stages without a folder."""
    log = read_json_if_any(root / "stages.json")
    names = study_stage_names(root)
    if isinstance(log, dict):
        return [name for name in names if name not in log]
    return [name for name in names if not (root / name).is_dir()]


def stages_gone(root: Path) -> list[str]:
    """The study's stages that ``stages.json`` logs as finished but whose folder is gone (deleted, or left behind
    when the study was copied): the same ``reproduce`` command runs them again; a stage logged as leaving no folder
    (``folder: false``) is never gone."""
    log = read_json_if_any(root / "stages.json")
    if not isinstance(log, dict):
        return []
    return [
        name
        for name in study_stage_names(root)
        if isinstance(log.get(name), dict)
        and "error" not in log[name]
        and log[name].get("folder", True)  # a stage that left no folder (recorded) has none to lose
        and not (root / name).is_dir()
    ]


def stage_evidence(root: Path, stage: str) -> dict | None:
    """The numbers stage ``stage`` published for its verdict (its evidence document in ``summary.json``, see
    ``dynheads.stages``); None when the stage has not written them."""
    folder = root / stage
    summary = read_summaries(folder).get(stages.evidence_of(stage)) if folder.is_dir() else None
    return summary.numbers if summary is not None else None


def decisive_metric(metrics: Iterable[str]) -> str:
    """Claim 2's metric: the first of ABLATION_METRICS that the ablation stage measured."""
    return next((metric for metric in ABLATION_METRICS if metric in set(metrics)), ABLATION_METRICS[0])
