"""Claim 2 as a dose-response in fractions of each step's own |D_t| (issue 59): at step t, for a fraction f, every
arm masks k_t = ceil(f |D_t|) heads; a step whose D_t is empty masks nothing in any arm.

Arms (``ablation_strategies``): ``dynamic`` (the first k_t heads of D_t, ranked: always a subset of D_t while
f <= 1; past 1, D_t then the step's next-ranked heads), ``static`` (the static list's top k_t), ``static_outside``
(the first k_t static heads outside the step's D_t: "dynamic" against "important and always on") and ``random``
(k_t heads drawn per sample and step). The paper's literal controls run beside them at f = 1 (teacher-forced):
``static_mean`` and ``random_mean`` mask the clean answer's mean |D_t| (rounded) at every step (``MEAN_ARMS``).

``fractions`` (in (0, 1], holding 1) are the doses; ``compensation`` (above 1) masks past D_t, where the dynamic
arm adds the step's next-ranked heads while static adds D_t's backups: that measures compensation (the paper's
Figure 3), is drawn in its own figure and never enters a decided quantity. A fixed k per step would mix the two
(past |D_t| it flips the sign of dynamic minus static), which is why doses are fractions.

Metrics (``metric``):

- ``teacher`` (graded, decides the verdict at f = 1): ``ablation.teacher_forced.forced_ablations``, one record per
  sample; per arm and fraction the mean over the clean answer's steps of the masked log-probability of the clean token,
  of its drop and of the argmax flips, the drop over non-empty steps (|D_t| > 0), the heads masked per step and
  the overlap of the masked set with D_t (|masked ∩ D_t| / |D_t|, mean over non-empty steps); per sample whether
  the clean answer is correct (the task's first metric at least 0.5). One prefill per sample; the arms x fractions
  of a step are rows of one batch; ``batch_size`` samples' clean answers decode together.
- ``cascade``: greedy continues under masking (``ablation.ablated_generate_batch``), one record per sample, arm and
  fraction, plus the un-ablated run; the task metric (accuracy / ROUGE-L, EM / F1). A sample's arms share one
  prefill. Shown, not decided on.

``write_doses`` writes ``dose.csv`` (metric, arm, fraction, part (dose or compensation), mean and 95 % interval
over samples, n, heads masked per step, overlap with D_t), ``summary.md`` (its numbers: per arm and fraction the
per-sample values Claim 2 reads, ``report.claims.operating_point_verdict``), ``plots/dose-teacher.png`` (f <= 1),
``plots/compensation-teacher.png`` (f >= 1) and their cascade twins. The manifest records the static list and the
data that fitted it (``static_source``, from ``resources``); a list fitted on the evaluated stream is refused.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, Unpack

import numpy as np
import pandas as pd

from dynheads.ablation.cascade import AblationResult, AblationSettings
from dynheads.ablation.jobs import cascade_jobs, cascade_work, result_record
from dynheads.ablation.strategies import ABLATION_STRATEGIES, DOSE_ARMS, MEAN_ARMS
from dynheads.ablation.teacher_forced import ForcedResult, forced_ablations
from dynheads.analysis.evidence import EvidenceSettings, Interval, fraction_interval, mean_interval
from dynheads.errors import DynheadsError
from dynheads.experiments.experiment import (
    Context,
    Experiment,
    GridPlan,
    Phase,
    Work,
    grid_manifest,
    grid_plan,
    run_experiment,
)
from dynheads.models import LoadedModel, decode_text
from dynheads.outputs import Outputs, Written, write_outputs
from dynheads.plots.ablation import plot_doses
from dynheads.resources import needs_of
from dynheads.runs import Finished, Job, RunDir, RunOptions, RunView
from dynheads.seeding import derive_seed
from dynheads.settings import AblationConfig
from dynheads.tables import Summary, frame_table
from dynheads.tasks.registry import Task, grid_task

TEACHER = {
    "logprob": "log p(clean token), masked",
    "drop": "drop in log p(clean token) (nats), all steps",
    "drop_nonempty": "drop in log p(clean token) (nats), steps with |D_t| > 0",
    "flip": "argmax flips",
}
TEACHER_QUANTITIES = ("logprob", "drop", "drop_nonempty", "flip", "masked", "overlap")  # per arm and fraction
OPERATING_POINT = 1.0  # the fraction that masks exactly D_t: the paper's design, where Claim 2 is decided
DESIGN = "fraction"  # the dose design the stage's numbers follow (older runs: "dose", fixed k heads per step)
CORRECT_AT = 0.5  # a clean answer is correct when the task's first metric reaches this (accuracy, EM: 0 or 1)


def fraction_key(fraction: float | None) -> str:
    """How a fraction names a dose in records and numbers: 0.25, 1, 1.5 (None: the un-ablated run)."""
    return "None" if fraction is None else f"{fraction:g}"


def _check_doses(config: AblationConfig) -> None:
    config.check()
    if not config.fractions or not config.static:
        raise DynheadsError("the dose-response needs fractions (--fractions 0.25,0.5,0.75,1) and a static head list")


def _dose_work(context: Context[AblationConfig, GridPlan]) -> Work:
    """The teacher-forced records (one per sample: every arm x fraction as rows of its batch) and the cascade's
    (one per sample, arm and fraction, plus the un-ablated run; a sample's arms share its prefill)."""
    config, lm, samples, static = context.config, context.lm, context.plan.samples, context.sources.static_ranking
    fractions = config.dose_fractions()

    def settings(sample, arm: str, fraction: float | None) -> AblationSettings:
        return AblationSettings(
            strategy=MEAN_ARMS.get(arm, arm),
            fraction=None if arm in MEAN_ARMS else fraction,
            matching="mean" if arm in MEAN_ARMS else "per_step",  # mean arms: the clean answer's mean |D_t|
            mode=config.ablation_mode(),
            static_ranking=static,
            seed=derive_seed(config.seed, "random-heads", sample.seed),
            score=config.task_entry().score_kind,
            threshold=config.threshold,
        )

    phases = []
    if config.metric in ("teacher", "both"):
        grid = [(arm, f) for arm in DOSE_ARMS for f in fractions] + [(arm, OPERATING_POINT) for arm in MEAN_ARMS]
        teacher = partial(_teacher_records, lm, config, settings, grid)
        phases.append(  # batch_size samples' clean answers decode together; a sample's arms x fractions are one batch
            Phase(
                [Job(f"{s.sample_id}-teacher", s, group=s.sample_id) for s in samples],
                lambda batch: [Finished(record) for record in teacher(batch)],
                "ablate teacher-forced",
            )
        )
    if config.metric in ("cascade", "both"):
        arms = [("none", None)] + [(arm, f) for arm in DOSE_ARMS for f in fractions]
        named = [(arm, f, "" if f is None else f"-f{fraction_key(f)}") for arm, f in arms]
        jobs = cascade_jobs(  # sample by sample: a sample's arms share its prefill
            [(f"{s.sample_id}-{arm}{key}", s, partial(settings, s, arm, f)) for s in samples for arm, f, key in named]
        )
        work = cascade_work(lm, config.task_entry(), config.max_new_tokens, context.batch_size, _cascade_record)
        phases.append(Phase(jobs, work, "ablate cascade"))
    design = {"design": DESIGN, "arms": list(DOSE_ARMS), "mean_arms": list(MEAN_ARMS)}
    return Work(grid_manifest(context, design), phases)


def _dose_plan(config: AblationConfig, lm: LoadedModel) -> GridPlan:
    return grid_plan(config, lm, needs_of(ABLATION_STRATEGIES.get(arm) for arm in DOSE_ARMS), "this ablation run")


DOSES = Experiment(
    "ablation",
    _dose_plan,
    _dose_work,
    tables=lambda context: dose_tables(RunView.of(context.run)),
    check=_check_doses,
)


def run_doses(config: AblationConfig, out: str | Path, **options: Unpack[RunOptions]) -> RunDir:
    """Every grid sample under every arm at every fraction, by the config's metric(s), into ``out`` (resumable)."""
    return run_experiment(DOSES, config, out, **options)


def _teacher_records(
    lm: LoadedModel, config: AblationConfig, settings, grid: list[tuple[str, float]], samples: list
) -> list[dict]:
    """The samples' teacher-forced records (their clean answers decoded as one batch)."""
    rows = [[settings(sample, arm, fraction) for arm, fraction in grid] for sample in samples]
    results = forced_ablations(lm, samples, rows, config.max_new_tokens)
    return [_teacher_record(lm, config, grid, sample, result) for sample, result in zip(samples, results, strict=True)]


def _teacher_record(lm: LoadedModel, config: AblationConfig, grid: list, sample, result: ForcedResult) -> dict:
    """One sample's teacher-forced record: per arm and fraction the means over the clean answer's steps."""
    text = decode_text(lm.tokenizer, result.tokens, skip_special_tokens=True)
    arms: dict[str, dict[str, dict[str, float | None]]] = {}
    for row, (arm, fraction) in enumerate(grid):
        arms.setdefault(arm, {})[fraction_key(fraction)] = arm_numbers(result, row)
    task = config.task_entry()
    metrics = task.score(sample, text)
    first = next(iter(task.metrics))
    return {
        **sample.describe(),
        "grid_sample_id": sample.sample_id,
        "kind": "teacher",
        "generated": text,
        "steps": len(result.tokens),
        "nonempty_steps": sum(1 for count in result.dynamic_counts if count),
        "metrics": metrics,
        "correct": bool(metrics.get(first, 0.0) >= CORRECT_AT),
        "clean_logprob": float(np.mean(result.clean_logprob)) if result.tokens else None,
        "mean_dynamic": float(np.mean(result.dynamic_counts)) if result.tokens else 0.0,
        "arms": arms,
    }


def arm_numbers(result: ForcedResult, row: int) -> dict[str, float | None]:
    """One setting's means over the clean answer's steps: masked log-probability, its drop (all steps, and steps
    whose D_t is not empty), argmax flips, heads masked and the overlap |masked ∩ D_t| / |D_t| (non-empty steps);
    None where there is no such step."""
    if not result.tokens:
        return dict.fromkeys(TEACHER_QUANTITIES)
    drop = result.drop(row)
    nonempty = np.asarray(result.dynamic_counts) > 0
    overlaps = [
        len(set(masked) & set(dynamic)) / len(dynamic)
        for masked, dynamic in zip(result.masked[row], result.dynamic, strict=True)
        if dynamic
    ]
    return {
        "logprob": float(np.mean(result.masked_logprob[row])),
        "drop": float(np.mean(drop)),
        "drop_nonempty": float(np.mean(drop[nonempty])) if nonempty.any() else None,
        "flip": float(np.mean(result.flipped[row])),
        "masked": float(np.mean([len(h) for h in result.masked[row]])),
        "overlap": float(np.mean(overlaps)) if overlaps else None,
    }


def _cascade_record(sample, settings: AblationSettings, result: AblationResult, task: Task) -> dict:
    return {
        **result_record(sample, result, task),
        "kind": "cascade",
        "strategy": settings.strategy,
        "fraction": settings.fraction,
    }


# ---- tables, figures and the numbers Claim 2 reads -------------------------------------------------------------------
def write_doses(run: RunDir, evidence: EvidenceSettings | None = None) -> pd.DataFrame:
    """``dose_tables`` written into the run's folder; returns dose.csv's frame."""
    outputs = dose_tables(RunView.of(run), evidence)
    write_outputs(run.path, outputs)
    return outputs.files["dose.csv"]


def dose_tables(view: RunView, evidence: EvidenceSettings | None = None) -> Outputs:
    """dose.csv, the figures and summary.md (with the per-sample numbers) of a dose-response run."""
    evidence = evidence or EvidenceSettings()
    records, manifest = view.records, view.manifest
    task, config = grid_task(manifest), manifest["config"]
    numbers: dict[str, Any] = {
        "design": DESIGN,
        "fractions": config.get("fractions"),
        "compensation": config.get("compensation"),
        "arms": list(DOSE_ARMS),
        "mean_arms": list(MEAN_ARMS),
    }
    teacher = [r for r in records if r.get("kind") == "teacher" and r["steps"] > 0]
    if teacher:
        numbers["teacher"] = _teacher_numbers(teacher)
        numbers["teacher"]["no_steps"] = sum(1 for r in records if r.get("kind") == "teacher" and r["steps"] == 0)
    cascade = [r for r in records if r.get("kind") == "cascade"]
    if cascade:
        numbers["cascade"] = _cascade_numbers(cascade, list(task.metrics))
    table = pd.DataFrame(_rows(numbers, evidence))
    outputs = Outputs().add("dose.csv", table)
    title = f"{manifest['model']['name']}: {{}} ({task.label}, {config['mode']} masking)"
    if teacher:
        panels = {name: TEACHER[name] for name in ("drop", "drop_nonempty", "flip")}
        outputs.extend(_figures(table[table["family"] == "teacher"], "teacher", panels, title))
    if cascade:
        outputs.extend(_figures(table[table["family"] == "cascade"], "cascade", dict(task.metrics), title))
    return outputs.add("summary.md", _summary(table, numbers, manifest, title.format("dose-response")))


def _figures(table: pd.DataFrame, family: str, panels: dict[str, str], title: str) -> Outputs:
    """The dose curves (f <= 1) and, when the run masked past D_t, the compensation curves (f >= 1)."""
    doses = table[table["fraction"] <= OPERATING_POINT]
    figures = Outputs().add(
        f"plots/dose-{family}.png",
        Written(partial(plot_doses, doses, panels=panels, title=title.format("dose-response in fractions of |D_t|"))),
    )
    past = table[((table["fraction"] >= OPERATING_POINT) & table["arm"].isin(DOSE_ARMS)) | (table["arm"] == "none")]
    if (past["fraction"] > OPERATING_POINT).any():
        compensation = title.format("compensation, masking past D_t (not decided on)")
        figures.add(
            f"plots/compensation-{family}.png", Written(partial(plot_doses, past, panels=panels, title=compensation))
        )
    return figures


def _teacher_numbers(records: list[dict]) -> dict[str, Any]:
    """Per-sample values in one sample order: the clean log-probability, whether the clean answer is correct, its
    non-empty steps and, per quantity, arm and fraction."""
    out: dict[str, Any] = {
        "clean_logprob": [r["clean_logprob"] for r in records],
        "correct": [bool(r["correct"]) for r in records],
        "nonempty_steps": [r["nonempty_steps"] for r in records],
        "samples": len(records),
    }
    arms = records[0]["arms"]
    for quantity in TEACHER_QUANTITIES:
        out[quantity] = {
            arm: {f: [r["arms"][arm][f][quantity] for r in records] for f in sorted(arms[arm], key=float)}
            for arm in arms
        }
    return out


def _cascade_numbers(records: list[dict], metrics: list[str]) -> dict[str, Any]:
    """Per metric: the un-ablated run's per-sample values and, per arm and fraction, the masked runs' (one sample
    order: samples every run of the design finished)."""
    frame = pd.DataFrame(
        [
            {
                "sample": r["grid_sample_id"],
                "run": f"{r['strategy']}|{fraction_key(r['fraction'])}",
                "masked": r["mean_masked"],
                **r["metrics"],
            }
            for r in records
        ]
    )
    out: dict[str, Any] = {}
    for metric in [*metrics, "masked"]:
        table = frame.pivot_table(index="sample", columns="run", values=metric, aggfunc="mean").dropna()
        out[metric] = {"none": [float(v) for v in table.get("none|None", [])]}
        for arm in DOSE_ARMS:
            out[metric][arm] = {
                column.split("|")[1]: [float(v) for v in table[column]]
                for column in table.columns
                if column.startswith(f"{arm}|")
            }
    return out


def _rows(numbers: dict[str, Any], evidence: EvidenceSettings) -> list[dict]:
    """dose.csv's rows: per metric, arm and fraction the mean over samples with its 95 % interval."""
    rows = []
    teacher_metrics = ("drop", "drop_nonempty", "flip")
    for family, quantities in (("teacher", teacher_metrics), ("cascade", tuple(numbers.get("cascade", {})))):
        data: dict[str, Any] = numbers.get(family) or {}
        for quantity in quantities if data else ():
            if quantity == "masked":
                continue
            for arm, doses in data[quantity].items():
                if arm == "none":  # the cascade's un-ablated run: one list of per-sample values
                    rows += [_row(doses, evidence, family, quantity, arm, 0.0) | {"masked": 0.0}] if doses else []
                    continue
                for fraction, values in doses.items():
                    overlap = data.get("overlap", {}).get(arm, {}).get(fraction)
                    rows.append(
                        _row(values, evidence, family, quantity, arm, float(fraction))
                        | {"masked": _mean_of(data["masked"][arm][fraction]), "overlap": _mean_of(overlap or [])}
                    )
    return rows


def _row(values: list, evidence: EvidenceSettings, family: str, metric: str, arm: str, fraction: float) -> dict:
    interval = _interval_of(metric, values, evidence)
    part = "compensation" if fraction > OPERATING_POINT else "dose"
    return {
        "family": family,
        "metric": metric,
        "arm": arm,
        "fraction": fraction,
        "part": part if arm != "none" else "un-ablated",
        "mean": interval.effect,
        "low": interval.low,
        "high": interval.high,
        "n": interval.n,
    }


def _interval_of(quantity: str, values: list, evidence: EvidenceSettings) -> Interval:
    """A quantity's mean over samples with its 95 % interval: a drop in log-probability (unbounded) by bootstrap;
    a share per sample (argmax flips, the task's metrics: accuracy, ROUGE-L, EM, F1, each in [0, 1]) by
    ``fraction_interval`` (exact Clopper-Pearson for 0/1 values, never of zero width)."""
    if quantity.startswith("drop"):
        return mean_interval(_floats(values), evidence)
    return fraction_interval(_floats(values), evidence)


def _floats(values: list) -> np.ndarray:
    """Per-sample values, None (undefined on that sample) as NaN."""
    return np.asarray([np.nan if value is None else value for value in values], dtype=float)


def _mean_of(values: list) -> float | None:
    finite = _floats(values)
    finite = finite[~np.isnan(finite)]
    return float(finite.mean()) if finite.size else None


def _summary(table: pd.DataFrame, numbers: dict[str, Any], manifest: dict, title: str) -> Summary:
    source = manifest.get("static_source") or {}
    fitted = source.get("fitted_on")
    blocks: list = [
        "At step t every arm masks k_t = ceil(f |D_t|) heads, f a fraction of the step's own |D_t| (none where D_t "
        "is empty): dynamic = the first k_t heads of D_t (past f = 1: D_t, then the step's next-ranked heads); "
        "static = the static list's top k_t; static_outside = its first k_t heads outside D_t; random = a draw per "
        "sample and step. static_mean / random_mean (f = 1 only): the paper's literal controls, the clean answer's "
        "mean |D_t| at every step. part = dose (f <= 1) or compensation (f > 1: masking past D_t, where static "
        "removes D_t's backups; never decided on). teacher = each step of the clean greedy answer masked alone on "
        "the clean history (drop in log p of the clean token over all steps, and over steps with |D_t| > 0; share "
        "of steps whose argmax flips; the stop token's step is not measured); cascade = greedy continues under "
        "masking. Means over samples with 95 % bootstrap intervals; masked = heads removed per step; overlap = "
        "|masked ∩ D_t| / |D_t| over non-empty steps.",
        f"Static list: {source.get('file')}, fitted on "
        + (", ".join(f"{key} {value}" for key, value in fitted.items()) if isinstance(fitted, dict) else str(fitted))
        + " (the manifest's static_source).",
        frame_table(table, {column: column for column in table.columns} | {"family": "metric of", "fraction": "f"}),
    ]
    if numbers.get("teacher", {}).get("no_steps"):
        blocks.append(
            f"Samples whose clean answer ended at once (no step to measure): {numbers['teacher']['no_steps']}."
        )
    return Summary(blocks, numbers, title)
