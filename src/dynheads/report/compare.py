"""``dynheads compare``: what the studies of several models say, side by side (docs/compare.md).

Each folder given is a study (``dynheads reproduce``) or a single run (``dynheads niah``, ``dynheads hotpotqa``, ...,
with the dynamism statistics ``dynheads dynamism`` wrote into it, if any), or a ``compare.json`` that an earlier
comparison wrote: what it collected of each model, so that studies run on other machines or in other sittings can be
compared without their folders (``results_to_dict`` / ``results_from_dict``). Folders are grouped by the model their
manifest names; a model has at most one study. From each model this module reads what the report reads, never
recomputing a stage: the verdicts (``report.sections.build_sections``, decided from the numbers the stages published),
Table 1's statistics (the dynamism stage's published ``stats``) and the task accuracy of its traced runs (the
records' metrics, each mean with its bootstrap interval). ``compare_page`` writes compare.md and compare.html.

Studies whose settings differ in what a verdict is decided by (``VERDICT_SETTINGS``: the sample floor and the
bootstrap, the ablations' masking mode, head matching, doses and Eq. 2 threshold, the RAG ks) are refused in one
line: their verdicts would not be answers to the same question. A setting fitted per model is compared by its rule
(a calibrated Eq. 2 threshold's ``calibrated:M``, relative doses' multiples), never by the value it resolved to.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dynheads import stages
from dynheads.analysis.evidence import Effect, EvidenceSettings, Interval, fraction_interval
from dynheads.errors import DynheadsError
from dynheads.io import read_json, read_json_if_any
from dynheads.report import claims
from dynheads.report.claims import Verdict, VerdictStatus
from dynheads.report.sections import build_sections
from dynheads.report.study import evidence_of, stage_evidence
from dynheads.runs import RunDir
from dynheads.tables import read_summaries
from dynheads.tasks.registry import Task, task_of_manifest

STUDY_KIND = "reproduce"
RESULTS_FILE = "compare.json"  # what a comparison collected of each model, readable by a later comparison
RESULTS_KIND, RESULTS_FORMAT = "compare", 1
TRACED = (stages.NIAH, stages.HOTPOTQA)  # the traced stages whose task accuracy a comparison reports
STATUSES: tuple[VerdictStatus, ...] = ("supported", "not supported", "inconclusive", claims.NOT_RUN)
# what a verdict is decided by: label -> (where it is recorded, the stage folder, the key). "evidence": the study's
# evidence settings (its manifest); "config": the stage manifest's config; "rule": the rule of a setting fitted
# per model (a stage's threshold_fit.json, else its config); "doses": the dose design (the config's fractions of
# each step's |D_t| and compensation; an older run's fixed doses, marked as the old design); "published": the
# stage's published numbers (a fit's rule)
VERDICT_SETTINGS = {
    "sample floor": ("evidence", "", "floor"),
    "bootstrap resamples": ("evidence", "", "resamples"),
    "NIAH ablation masking mode": ("config", stages.ABLATION, "mode"),
    "NIAH ablation head matching": ("config", stages.ABLATION, "matching"),
    "NIAH ablation doses": ("doses", stages.ABLATION, "doses"),
    "QA ablation masking mode": ("config", stages.HOTPOTQA_ABLATION, "mode"),
    "QA ablation head matching": ("config", stages.HOTPOTQA_ABLATION, "matching"),
    "QA ablation doses": ("doses", stages.HOTPOTQA_ABLATION, "doses"),
    "QA ablation Eq. 2 threshold": ("rule", stages.HOTPOTQA_ABLATION, "threshold"),
    "QA dynamism Eq. 2 threshold": ("published", stages.HOTPOTQA_DYNAMISM, "threshold"),
    "RAG ks": ("config", stages.RAG, "ks"),
}


@dataclass(frozen=True)
class Accuracy:
    """A task metric of one model: its mean over the run's samples with the interval, and the folder it is from."""

    task: str  # the task's label
    metric: str  # the metric's label
    interval: Interval
    source: Path


@dataclass
class ModelResults:
    """Everything compared about one model, from its study and single runs."""

    name: str  # the model's name as its manifests record it
    parameters: int | None  # None: a manifest from before dynheads recorded it
    heads: int  # layers x query heads
    folders: list[Path] = field(default_factory=list)
    study: Path | None = None
    preset: str | None = None
    evidence: EvidenceSettings | None = None  # the study's verdict settings
    verdicts: list[Verdict] = field(default_factory=list)
    dynamism: dict[str, dict[str, Any]] = field(default_factory=dict)  # task label -> Table 1 statistics
    accuracy: list[Accuracy] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)  # VERDICT_SETTINGS label -> value (where recorded)
    saved_in: Path | None = None  # the compare.json it was read from; None: read from its folders

    def verdict(self, claim: str, task: str) -> Verdict | None:
        return next((v for v in self.verdicts if (v.claim, v.task) == (claim, task)), None)


def collect(folders: Sequence[str | Path], *, by_study: bool = False) -> list[ModelResults]:
    """The models of ``folders`` (studies, single runs or an earlier comparison's compare.json), smallest first;
    refuses folders that are neither, two studies of one model and studies whose verdict settings differ
    (``DynheadsError``, one line), before any verdict is computed. ``by_study``: one entry per study folder, named
    "model [folder name]" (two studies of one model, a run of it in a column of its own)."""
    if not folders:
        raise DynheadsError("compare needs at least one study or run folder")
    models: dict[str, ModelResults] = {}
    for path in (Path(folder) for folder in folders if Path(folder).is_file()):
        for saved in read_results(path):
            if saved.name in models:
                raise DynheadsError(f"{saved.name} is in {models[saved.name].saved_in} and in {path}: give it once")
            models[saved.name] = saved
    given = [(Path(folder), _manifest(Path(folder))) for folder in folders if not Path(folder).is_file()]
    given.sort(key=lambda item: item[1].get("kind") != STUDY_KIND)  # studies first: a run's model knows its study
    keys = {folder: _entry_name(folder, manifest, by_study) for folder, manifest in given}
    for folder, manifest in given:
        model = _model(models, manifest, keys[folder])
        model.folders.append(folder)
        if manifest.get("kind") == STUDY_KIND:
            _start_study(model, folder, manifest)
        elif model.study is None and _published_dynamism(folder) is not None:
            defaults = EvidenceSettings()  # a single run records no verdict settings: the defaults decide
            model.settings.setdefault("sample floor", defaults.floor)
            model.settings.setdefault("bootstrap resamples", defaults.resamples)
    check_settings(models.values())
    for folder, manifest in given:
        if manifest.get("kind") == STUDY_KIND:
            _add_study(models[keys[folder]], folder)
        else:
            _add_run(models[keys[folder]], folder, manifest)
    return sorted(models.values(), key=lambda m: (m.parameters is None, m.parameters or 0, m.name))


def check_settings(models: Iterable[ModelResults]) -> None:
    """Refuse models whose verdicts were decided under different settings (where both recorded the setting),
    naming the presets when the studies ran different ones (the usual cause)."""
    models = list(models)
    presets = {m.name: m.preset for m in models if m.preset}
    differ = (
        " (they ran different presets: " + "; ".join(f"{name}: {p}" for name, p in presets.items()) + ")"
        if len(set(presets.values())) > 1
        else ""
    )
    for label in VERDICT_SETTINGS:
        seen = {m.name: m.settings[label] for m in models if m.settings.get(label) is not None}
        if len({_key(value) for value in seen.values()}) > 1:
            values = "; ".join(f"{name}: {value}" for name, value in seen.items())
            raise DynheadsError(
                f"the studies differ in the {label} ({values}), which their verdicts are decided by{differ}: "
                "compare studies run with the same settings"
            )


def _key(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _manifest(folder: Path) -> dict:
    path = folder / "manifest.json"
    if not path.is_file():
        raise DynheadsError(f"{folder} is neither a study nor a run folder: no manifest.json")
    try:
        manifest = read_json(path)
    except ValueError as error:
        raise DynheadsError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(manifest, dict):
        raise DynheadsError(f"{path} is not a run manifest")
    return manifest


def _name(manifest: dict) -> str:
    return str((manifest.get("model") or {}).get("name") or "unknown model")


def _entry_name(folder: Path, manifest: dict, by_study: bool) -> str:
    """The column a folder's numbers go to: its model's, or (``by_study``) its own, named after the folder."""
    return f"{_name(manifest)} [{folder.resolve().name}]" if by_study else _name(manifest)


def _model(models: dict[str, ModelResults], manifest: dict, name: str) -> ModelResults:
    """The entry ``name`` of the manifest's model, made on first sight."""
    described = manifest.get("model") or {}
    heads = int(described.get("num_layers", 0)) * int(described.get("num_heads", 0))
    return models.setdefault(name, ModelResults(name, described.get("parameters"), heads))


def _start_study(model: ModelResults, root: Path, manifest: dict) -> None:
    """What is cheap to read of a study: that it is the model's only one, its evidence and verdict settings."""
    if model.study is not None:
        raise DynheadsError(
            f"two studies of {model.name}: {model.study}{_saved_note(model)} and {root}; a comparison has one "
            "column per model, so give one study per model (single runs of it may be added), or pass --by-study "
            "for one column per study folder (two seeds or presets of one model; folders of distinct names)"
        )
    logged = _json_object(root / "stages.json")  # the stages reproduce finished, or that failed (with why)
    published = [entry.name for entry in stages.STAGES if entry.value.evidence]  # the stages a verdict reads
    unfinished = [name for name in published if name not in logged and _started_not_summarised(root / name)]
    unfinished += [name for name in TRACED if name not in logged and _started_not_tabled(root / name)]
    if unfinished:
        raise DynheadsError(
            f"{root} is not finished: its stage{'s' if len(unfinished) > 1 else ''} {', '.join(unfinished)} started "
            "and published no summary.json (a traced stage: no results.csv) yet; let the study finish (or run its "
            "reproduce command again to resume it), then compare"
        )
    model.study, model.evidence = root, evidence_of(manifest)
    model.preset = manifest.get("preset") or (manifest.get("config") or {}).get("preset")
    model.settings.update(_study_settings(root, model.evidence))


def _started_not_summarised(folder: Path) -> bool:
    """A stage that a verdict reads, begun (its manifest written) but not summarised: still running, or stopped (a
    stage that failed is logged in stages.json, and its verdict says why)."""
    return (folder / "manifest.json").is_file() and not (folder / "summary.json").is_file()


def _started_not_tabled(folder: Path) -> bool:
    """A traced stage whose accuracy the comparison reads, begun but stopped before its last sample (its table,
    results.csv, is written once every sample is): its accuracy would be a part of the grid's."""
    return (folder / "manifest.json").is_file() and not (folder / "results.csv").is_file()


def _add_study(model: ModelResults, root: Path) -> None:
    """The study's verdicts (as its report decides them), Table 1 statistics and task accuracy."""
    evidence = model.evidence or EvidenceSettings()
    model.verdicts += [v for section in build_sections(root, evidence) for v in section.verdicts]
    for stage, traced in ((stages.DYNAMISM, stages.NIAH), (stages.HOTPOTQA_DYNAMISM, stages.HOTPOTQA)):
        task = task_of_manifest(_stage_manifest(root / traced))
        published = stage_evidence(root, stage) if (root / stage).is_dir() else None
        if task is not None and published and "stats" in published:
            model.dynamism.setdefault(task.label, published["stats"])
    for traced in TRACED:
        if (root / traced).is_dir():
            model.accuracy += accuracy_of(root / traced, evidence)


def _add_run(model: ModelResults, folder: Path, manifest: dict) -> None:
    """A single traced run: its task accuracy, and Claim 1 with Table 1's row where its dynamism is published and
    the model's study has no Claim 1 on that task (decided with the study's evidence settings, else the defaults)."""
    task = task_of_manifest(manifest)
    if task is None:
        raise DynheadsError(
            f"{folder} is a {manifest.get('kind')!r} run, not a study or a traced run of a task: nothing to compare"
        )
    evidence = model.evidence or EvidenceSettings()
    model.accuracy += accuracy_of(folder, evidence)
    dynamism = _published_dynamism(folder)
    if dynamism is not None and model.verdict(claims.CLAIM1, task.label) is None:
        model.verdicts.append(claims.dynamism_verdict(dynamism, task.label, evidence))
        model.dynamism.setdefault(task.label, dynamism["stats"])


def _published_dynamism(folder: Path) -> dict | None:
    """The dynamism statistics ``dynheads dynamism`` published into a run folder (Claim 1's numbers), if any."""
    summary = read_summaries(folder).get(stages.evidence_of(stages.DYNAMISM))
    return summary.numbers if summary is not None and "stats" in summary.numbers else None


def _study_settings(root: Path, evidence: EvidenceSettings) -> dict[str, Any]:
    """The study's ``VERDICT_SETTINGS`` that it recorded (a stage not run records none)."""
    found: dict[str, Any] = {}
    for label, (where, stage, key) in VERDICT_SETTINGS.items():
        config = (_stage_manifest(root / stage).get("config") or {}).get(key) if stage else None
        if where == "evidence":
            value = getattr(evidence, key)
        elif where == "published":
            published = (stage_evidence(root, stage) or {}) if (root / stage).is_dir() else {}
            value = (published.get("threshold_fit") or {}).get("rule", published.get(key))
        elif where == "rule":
            value = _fit_file(root / stage / "threshold_fit.json").get("rule", config)
        elif where == "doses":
            value = _dose_design(root / stage)
        else:
            value = config
        if value is not None:
            found[label] = value
    return found


def _dose_design(folder: Path) -> str | None:
    """How a stage's dose-response masked: fractions of each step's |D_t| (and past it), or an older run's fixed
    heads per step (dose_fit.json's multiples of a mean |D_t|, else the config's k), which Claim 2 no longer reads;
    None: the stage ran no dose-response."""
    config = _stage_manifest(folder).get("config") or {}
    fractions, compensation = config.get("fractions"), config.get("compensation") or []
    if fractions:
        past = f"; compensation {', '.join(f'{f:g}' for f in compensation)}" if compensation else ""
        return f"{', '.join(f'{f:g}' for f in fractions)} x each step's |D_t|{past}"
    multiples = _fit_file(folder / "dose_fit.json").get("multiples")
    if multiples:
        return f"old design: k = {', '.join(f'{m:g}' for m in multiples)} x mean |D_t| heads at every step"
    doses = config.get("doses")
    return f"old design: k = {', '.join(str(k) for k in doses)} heads at every step" if doses else None


def _fit_file(path: Path) -> dict:
    """A fit written beside a stage (threshold_fit.json, dose_fit.json), or {} where there is none."""
    found = read_json(path) if path.is_file() else {}
    return found if isinstance(found, dict) else {}


def _stage_manifest(folder: Path) -> dict:
    return _json_object(folder / "manifest.json")


def _json_object(path: Path) -> dict:
    """The JSON object in ``path``; {} where there is none (no file, not JSON, not an object)."""
    data = read_json_if_any(path)
    return data if isinstance(data, dict) else {}


def accuracy_of(folder: Path, evidence: EvidenceSettings) -> list[Accuracy]:
    """Each metric of the run's task (a score in [0, 1] per sample): the mean over its finished samples with its 95 %
    interval, exact (Clopper-Pearson) for 0/1 scores (``evidence.fraction_interval``)."""
    task: Task | None = task_of_manifest(_stage_manifest(folder))
    records = RunDir(folder).records()
    if task is None or not records:
        return []
    found = []
    for key, label in task.metrics.items():
        values = np.array([_number((r.get("metrics") or {}).get(key)) for r in records], dtype=float)
        if not np.isnan(values).all():
            found.append(Accuracy(task.label, label, fraction_interval(values, evidence), folder))
    return found


def _number(value: Any) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


# ---- saved results -------------------------------------------------------------------------------------------------
def results_to_dict(models: Sequence[ModelResults]) -> dict[str, Any]:
    """What ``collect`` found of each model, as JSON data (``RESULTS_FILE``); ``results_from_dict`` reads it back."""
    return {"kind": RESULTS_KIND, "format": RESULTS_FORMAT, "models": [_model_dict(model) for model in models]}


def results_from_dict(data: Any, source: Path) -> list[ModelResults]:
    """The models of a ``results_to_dict`` document read from ``source``; a ``DynheadsError`` for anything else."""
    if not isinstance(data, dict) or data.get("kind") != RESULTS_KIND or data.get("format") != RESULTS_FORMAT:
        raise DynheadsError(
            f"{source} is not a {RESULTS_FILE} that dynheads compare wrote (format {RESULTS_FORMAT}): give a study "
            "or run folder, or a compare.json"
        )
    try:
        return [_model_from(entry, source) for entry in data["models"]]
    except (KeyError, TypeError, ValueError) as error:
        raise DynheadsError(f"{source} is damaged ({type(error).__name__}: {error})") from None


def read_results(path: Path) -> list[ModelResults]:
    try:
        data = read_json(path)
    except (ValueError, UnicodeDecodeError) as error:
        raise DynheadsError(f"{path} is not valid JSON: {error}") from None
    return results_from_dict(data, path)


def _saved_note(model: ModelResults) -> str:
    return f" (in {model.saved_in})" if model.saved_in is not None else ""


def _model_dict(model: ModelResults) -> dict[str, Any]:
    found = asdict(model)
    found["saved_in"] = None
    found["folders"] = [str(folder) for folder in model.folders]
    found["study"] = str(model.study) if model.study is not None else None
    found["accuracy"] = [{**asdict(a), "source": str(a.source)} for a in model.accuracy]
    return found


def _model_from(entry: dict[str, Any], source: Path) -> ModelResults:
    evidence = entry["evidence"]
    return ModelResults(
        name=str(entry["name"]),
        parameters=entry["parameters"],
        heads=int(entry["heads"]),
        folders=[Path(folder) for folder in entry["folders"]],
        study=Path(entry["study"]) if entry["study"] is not None else None,
        preset=entry["preset"],
        evidence=EvidenceSettings(**evidence) if evidence is not None else None,
        verdicts=[_verdict_from(verdict) for verdict in entry["verdicts"]],
        dynamism=dict(entry["dynamism"]),
        accuracy=[
            Accuracy(a["task"], a["metric"], Interval(**a["interval"]), Path(a["source"])) for a in entry["accuracy"]
        ],
        settings=dict(entry["settings"]),
        saved_in=source,
    )


def _verdict_from(entry: dict[str, Any]) -> Verdict:
    effects = tuple(Effect(**{**effect, "interval": Interval(**effect["interval"])}) for effect in entry["effects"])
    status = entry["status"]
    if status not in STATUSES:
        raise ValueError(f"unknown verdict status {status!r}")
    return Verdict(entry["claim"], entry["task"], status, entry["reason"], dict(entry["numbers"]), effects)
