"""HaluEval responses teacher-forced through the traced model (the source run of ``dynheads detect --data``), and
the transfer of detectors between the two HaluEval tasks (``dynheads detect-transfer``).

``trace_halueval`` traces questions ``first .. first + questions - 1`` of HaluEval QA or dialogue
(``dynheads.tasks.halueval``): both answers of each question are forced through the model after the same prompt,
one trace each, into a resumable run whose manifest records the question stream and the pinned data file.

The context boundary (``context_boundary``): ``prompt`` counts the whole prompt, assistant header included, as
context (the lookback ratio of step 0 is then the constant 1 and is left out of span averages); ``lookback-lens``
ends the context with the user turn's content and counts the end-of-turn marker and the assistant header as
generated, as Lookback Lens does (``context_mass`` / ``context_entropy`` are then measured up to there).

``run_transfer`` fits every feature set on all responses of one task and scores all responses of the other,
beside the in-task cross-validated numbers of both detect runs (Lookback Lens, Table 3's shape).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Unpack

import numpy as np
import pandas as pd

from dynheads.analysis import hallucination as hl
from dynheads.analysis.detector import (
    Featuriser,
    LabelledSample,
    Level,
    evidence_settings,
    fit_detectors,
    hallucination_probability,
    training_feature_spec,
)
from dynheads.analysis.settings import ANSWER_KEY, FEATURE_SETS
from dynheads.engine.tracing import trace_batch
from dynheads.errors import DynheadsError
from dynheads.experiments.experiment import Context, Experiment, Phase, Plan, Work, run_experiment
from dynheads.io import read_json
from dynheads.models import LoadedModel, model_difference
from dynheads.outputs import Outputs, write_outputs
from dynheads.packaged import describe
from dynheads.runs import Finished, Job, RunDir, RunOptions
from dynheads.settings import BOUNDARIES, HaluevalConfig
from dynheads.tables import Block, Heading, Summary, Table
from dynheads.tasks import halueval
from dynheads.tasks.questions import QuestionStream
from dynheads.views.detect import (
    HEADLINE_TITLE,
    UPPER_TITLE,
    DetectConfig,
    labelled_samples,
    match_lengths,
    refuse_probe_overlap,
)

# where a run was traced (the same model on another device or placement gives the same features up to rounding)
WHERE_TRACED = ("device", "device_map")


@dataclass(frozen=True, kw_only=True)
class _HaluPlan(Plan):
    task: str
    stream: QuestionStream
    answers: Sequence[Any]  # the samples, each forcing its own response (not checked against the window)
    response_prefix: int  # tokens of the assistant header the lookback-lens boundary leaves out (else 0)


def _check_halueval(config: HaluevalConfig) -> None:
    halueval.parse_data(config.data)
    if config.context_boundary not in BOUNDARIES:
        raise DynheadsError(f"unknown context boundary {config.context_boundary!r}: use {' or '.join(BOUNDARIES)}")


def _halueval_plan(config: HaluevalConfig, lm: LoadedModel) -> _HaluPlan:
    """Both answers of every question of the stream; the lookback-lens boundary needs one assistant header length."""
    task = halueval.parse_data(config.data)
    stream = QuestionStream("detect", config.first, config.questions)
    samples = halueval.make_samples(lm.tokenizer, task, stream)
    prefixes = {len(s.input_ids) - s.context_end for s in samples}
    if config.context_boundary == "lookback-lens" and len(prefixes) != 1:
        raise DynheadsError(
            f"the assistant header has {sorted(prefixes)} tokens across prompts: the lookback-lens "
            "boundary needs one length"
        )
    prefix = prefixes.pop() if config.context_boundary == "lookback-lens" else 0
    return _HaluPlan(task=task, stream=stream, answers=samples, response_prefix=prefix)


def _halueval_work(context: Context[HaluevalConfig, _HaluPlan]) -> Work:
    config, lm, plan = context.config, context.lm, context.plan
    samples = plan.answers
    lookback_lens = config.context_boundary == "lookback-lens"
    manifest = {
        "data": config.data,
        "packaged": describe(halueval.TASKS[plan.task]),
        "questions": plan.stream.describe(sorted({s.question_id for s in samples})),
        "prompt": {"system": halueval.SYSTEM_PROMPT, "user": halueval.USER_TEMPLATES[plan.task]},
        "context_boundary": config.context_boundary,
        "response_prefix": plan.response_prefix,
    }

    def teacher_force(batch: list) -> list[Finished]:
        """The batch's responses forced as one batch, each row its own answer (``trace_batch``'s per-row forcing)."""
        traces = trace_batch(
            lm,
            batch,
            forced_rows=[sample.response_ids for sample in batch],
            context_ends=[sample.context_end if lookback_lens else None for sample in batch],
        )
        return [
            Finished({**sample.describe(), "generated": traced.text, "steps": traced.num_steps}, traced)
            for sample, traced in zip(batch, traces, strict=True)
        ]

    jobs = [Job(sample.sample_id, sample) for sample in samples]
    return Work(manifest, [Phase(jobs, teacher_force, f"halueval-{plan.task}")])


HALUEVAL = Experiment("halueval", _halueval_plan, _halueval_work, check=_check_halueval)


def trace_halueval(config: HaluevalConfig, out: str | Path, **options: Unpack[RunOptions]) -> RunDir:
    """Teacher-force both answers of every question of the stream into ``out`` (resumable)."""
    return run_experiment(HALUEVAL, config, out, **options)


def source_of(detect_dir: str | Path) -> RunDir:
    """The traced HaluEval run a ``dynheads detect`` output folder was measured on (its manifest's source run)."""
    detect = RunDir(detect_dir)
    manifest = detect.manifest() if detect.exists() else {}
    run = RunDir(manifest.get("source_run", Path(detect_dir) / "trace"))
    if manifest.get("kind") != "detect" or not run.exists() or run.manifest().get("kind") != "halueval":
        raise DynheadsError(
            f"{detect_dir} is not the output of 'dynheads detect' on teacher-forced HaluEval "
            "responses (e.g. 'dynheads detect --data halueval:qa --out DIR')"
        )
    return run


def run_transfer(first: str | Path, second: str | Path, config: DetectConfig, out: str | Path) -> pd.DataFrame:
    """Train on all responses of each detect run's task, test on all of the other's; beside the in-task numbers."""
    runs = [source_of(first), source_of(second)]
    manifests = [run.manifest() for run in runs]
    tasks = _transfer_tasks(manifests, config)
    samples = [labelled_samples(run)[0] for run in runs]
    if config.match_length:
        samples = [match_lengths(group) for group in samples]
    probe_checks = _probe_checks(config, samples, manifests[0].get("model"))
    featurisers = [Featuriser(group, config.probe) for group in samples]
    prefix = int(manifests[0].get("response_prefix", 0))
    in_task = [_in_task(Path(folder), task, config) for folder, task in zip((first, second), tasks, strict=True)]
    rows = []
    for level in ("response", "token"):
        results = _cross_task_aurocs(samples, featurisers, config, prefix, level)
        for name in config.feature_sets:
            if (0, name) not in results and (1, name) not in results:
                continue
            row: dict[str, object] = {
                "level": level,
                "feature_set": name,
                "section": "upper_bound" if name in ANSWER_KEY else "deployable",
            }
            for index, task in enumerate(tasks):
                row[f"{task} in-task"] = in_task[index].numbers.get((level, name), (math.nan,) * 3)
            for source, target in ((0, 1), (1, 0)):
                row[f"{tasks[source]} -> {tasks[target]}"] = results.get((source, name), (math.nan,) * 3)
            rows.append(row)
    table = pd.DataFrame(rows)
    out_run = _start_transfer(
        out,
        config,
        {
            "runs": [str(run.path) for run in runs],
            "detect_runs": [str(first), str(second)],
            "tasks": tasks,
            "in_task": [part.protocol for part in in_task],
            "questions": [m.get("questions") for m in manifests],
            "probe_overlap_check": probe_checks,
            "protocol": "fit on every response of one task (static heads ranked on it), score every response of the "
            "other; 95% bootstrap interval over the target task's questions",
        },
    )
    flat = table.copy()
    for column in [c for c in table.columns if "->" in c or "in-task" in c]:
        flat[[f"{column} auroc", f"{column} low", f"{column} high"]] = pd.DataFrame(table[column].tolist())
        flat = flat.drop(columns=column)
    outputs = Outputs().add("transfer.csv", flat)
    outputs.add("transfer.json", {"tasks": tasks, "rows": flat.to_dict("records")})
    protocols = [part.protocol for part in in_task]
    write_outputs(out_run.path, outputs.add("transfer.md", transfer_summary(table, tasks, config, protocols)))
    return flat


def _transfer_tasks(manifests: list[dict], config: DetectConfig) -> list[str]:
    """The two runs' HaluEval tasks (QA, dialogue); refused unless they differ and were traced alike, or when a
    feature set is unknown."""
    tasks = [halueval.parse_data(m["data"]).replace("qa", "QA") for m in manifests]
    if tasks[0] == tasks[1]:
        raise DynheadsError(f"both runs trace HaluEval {tasks[0]}: transfer needs the two tasks")
    models = [m.get("model") or {} for m in manifests]
    differ = model_difference(models[0], models[1])
    if differ is not None:
        raise DynheadsError(
            f"the two runs are of different models ({tasks[0]}: {models[0].get('name')}, {differ[0]} {differ[1]}; "
            f"{tasks[1]}: {models[1].get('name')}, {differ[0]} {differ[2]}): trace both tasks with one model"
        )
    for key, differs in (
        ("model", [{k: v for k, v in model.items() if k not in WHERE_TRACED} for model in models]),
        ("response_prefix (--context-boundary)", [m.get("response_prefix") for m in manifests]),
    ):
        if differs[0] != differs[1]:
            raise DynheadsError(f"the two runs differ in {key}: {differs[0]} / {differs[1]}; trace them alike")
    unknown = sorted(set(config.feature_sets) - set(FEATURE_SETS))
    if unknown:
        raise DynheadsError(f"unknown feature set(s) {', '.join(unknown)}: choose from {', '.join(FEATURE_SETS)}")
    return tasks


def _probe_checks(config: DetectConfig, samples: list[list[LabelledSample]], model: dict | None) -> list | None:
    """The ``--predictor`` checks of both tasks (refused when fitted on any question either task scores, or on a run
    of another model than the traced one), as the manifest records them; None without a predictor."""
    if not config.probe:
        return None
    return [refuse_probe_overlap(config.probe, [], sorted({s.group for s in group}), model) for group in samples]


def _cross_task_aurocs(
    samples: list[list[LabelledSample]], featurisers: list[Featuriser], config: DetectConfig, prefix: int, level: Level
) -> dict[tuple[int, str], tuple[float, float, float]]:
    """(training task, feature set) -> AUROC and interval on the other task, at ``level``: fitted on every
    response of one task, scored on every response of the other."""
    results = {}
    for source, target in ((0, 1), (1, 0)):
        spec = training_feature_spec(config, samples[source], prefix)  # static heads from the training task only
        train = [featurisers[source](i, spec, level) for i in range(len(samples[source]))]
        test = [featurisers[target](i, spec, level) for i in range(len(samples[target]))]
        names = [n for n in config.feature_sets if all(n in f for f in train + test)]
        y_train, y_test, groups = (
            _labels(samples[source], level),
            _labels(samples[target], level),
            _groups(samples[target], level),
        )
        models = fit_detectors({n: np.vstack([f[n] for f in train]) for n in names}, y_train, config.regularisation)
        for name in names:
            scores = hallucination_probability(models[name], np.vstack([f[name] for f in test]))
            auroc = hl.auroc_auprc(y_test, scores)[0]
            ci = hl.bootstrap_ci(y_test, scores, groups, evidence_settings(config))["auroc"]
            results[(source, name)] = (auroc, *ci)
    return results


def _start_transfer(out: str | Path, config: DetectConfig, details: dict) -> RunDir:
    """The output run with its manifest (``details`` beside the config) written; a rerun replaces its own outputs,
    a folder of another run kind is refused."""
    out_run = RunDir(out)
    out_run.restart("detect-transfer", config, None, details)  # recomputed from the two runs: replaces its outputs
    return out_run


def _labels(samples, level: str) -> np.ndarray:
    return np.concatenate([s.labels if level == "token" else [s.response_label] for s in samples])


def _groups(samples, level: str) -> np.ndarray:
    return np.concatenate([[s.group] * (len(s.steps) if level == "token" else 1) for s in samples])


# the detector settings that change a feature set's columns or its classifier: a detect run's in-task numbers stand
# beside the transfer only when that run used the transfer's (the folds and resamples are its own, and named)
IN_TASK_SETTINGS = ("static", "static_k", "probe", "regularisation", "match_length")


@dataclass(frozen=True)
class InTask:
    """A detect run's cross-validated numbers, (level, feature set) -> AUROC, low, high ({} when they are left out),
    and one line on how they were measured, or why they are left out."""

    numbers: dict[tuple[str, str], tuple[float, float, float]]
    protocol: str


def _in_task(detect_dir: Path, task: str, config: DetectConfig) -> InTask:
    """``detect_dir``'s in-task numbers from its results.json, with its own folds and resamples; left out (n/a) when
    it has none or was measured under other detector settings than ``config`` (``IN_TASK_SETTINGS``)."""
    path, manifest = detect_dir / "results.json", read_json(detect_dir / "manifest.json")
    used = manifest.get("config", {})
    if not path.is_file():
        return InTask({}, f"{task}: n/a ({detect_dir} has no results.json)")
    differ = [name for name in IN_TASK_SETTINGS if used.get(name) != getattr(config, name)]
    if differ:
        return InTask(
            {},
            f"{task}: n/a ({detect_dir} was measured with "
            + ", ".join(f"{name} {used.get(name)!r} (here {getattr(config, name)!r})" for name in differ)
            + ")",
        )
    folds = manifest.get("cross_validation", {})
    numbers = {
        (r["level"], r["feature_set"]): (r["auroc"], r["auroc_low"], r["auroc_high"])
        for r in read_json(path)["results"]
    }
    return InTask(
        numbers,
        f"{task}: {folds.get('folds')}-fold cross-validation grouped by {folds.get('unit')}, first of "
        f"{len(folds.get('repeats', []))} repeats, {used.get('bootstrap')} bootstrap resamples ({detect_dir})",
    )


def transfer_summary(
    table: pd.DataFrame, tasks: list[str], config: DetectConfig, in_task: Sequence[str] = ()
) -> Summary:
    """transfer.md as data: per level, the in-task and cross-task AUROC tables, then the protocol (``in_task``: how
    each detect run's in-task numbers were measured, or why they are left out)."""
    columns = [f"{tasks[0]} in-task", f"{tasks[1]} in-task", f"{tasks[0]} -> {tasks[1]}", f"{tasks[1]} -> {tasks[0]}"]

    def cell(value: tuple[float, float, float]) -> str:
        auroc, low, high = value
        return "n/a" if math.isnan(auroc) else f"{auroc:.3f} [{low:.3f}, {high:.3f}]"

    blocks: list[Block] = []
    for level in ("response", "token"):
        part = table[table["level"] == level]
        blocks.append(Heading("Responses (span-averaged features)" if level == "response" else "Tokens"))
        for title, section in ((HEADLINE_TITLE, "deployable"), (UPPER_TITLE, "upper_bound")):
            rows = part[part["section"] == section]
            if len(rows):
                blocks += [
                    Heading(title, 3),
                    Table(
                        ["feature set", *[c.replace("->", "→") for c in columns]],
                        [[r["feature_set"], *[cell(r[c]) for c in columns]] for r in rows.to_dict("records")],
                    ),
                ]
    blocks.append(
        "AUROC [95% CI]. In-task, from each detect run's results.json: "
        + "; ".join(in_task or ["not given"])
        + ". A → B: fitted on every response of A, scored on every response of B, "
        f"interval by bootstrap over B's questions ({config.bootstrap} resamples)."
    )
    return Summary(blocks, {"tasks": tasks, "in_task": list(in_task)})
