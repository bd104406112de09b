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

from dynheads.ablation.cascade import AblationResult, AblationSettings
from dynheads.ablation.jobs import cascade_jobs, cascade_work, result_record
from dynheads.ablation.strategies import ABLATION_STRATEGIES, DOSE_ARMS, MEAN_ARMS
from dynheads.ablation.teacher_forced import ForcedResult, forced_ablations
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
from dynheads.heads import head_key
from dynheads.models import LoadedModel, decode_text
from dynheads.resources import StaticSource, needs_of, static_heads
from dynheads.runs import Finished, Job, RunDir, RunOptions, RunView
from dynheads.seeding import derive_seed
from dynheads.settings import AblationConfig
from dynheads.tasks.registry import Task
from dynheads.views.dose_tables import DESIGN, OPERATING_POINT, TEACHER_QUANTITIES, dose_tables, fraction_key

CORRECT_AT = 0.5  # a clean answer is correct when the task's first metric reaches this (accuracy, EM: 0 or 1)


def _check_doses(config: AblationConfig) -> None:
    config.check()
    if not config.fractions or not config.static:
        raise DynheadsError("the dose-response needs fractions (--fractions 0.25,0.5,0.75,1) and a static head list")


def _dose_work(context: Context[AblationConfig, GridPlan]) -> Work:
    """The teacher-forced records (one per sample: every arm x fraction as rows of its batch) and the cascade's
    (one per sample, arm and fraction, plus the un-ablated run; a sample's arms share its prefill)."""
    config, lm, samples, static = context.config, context.lm, context.plan.samples, context.sources.static_ranking
    fractions = config.dose_fractions()
    panel = panel_sources(config, context)

    def settings(sample, arm: str, fraction: float | None) -> AblationSettings:
        return AblationSettings(
            strategy="static" if arm in panel else MEAN_ARMS.get(arm, arm),  # a panel list masks as static does
            fraction=None if arm in MEAN_ARMS else fraction,
            matching="mean" if arm in MEAN_ARMS else "per_step",  # mean arms: the clean answer's mean |D_t|
            mode=config.ablation_mode(),
            static_ranking=panel[arm].ranking if arm in panel else static,
            seed=derive_seed(config.seed, "random-heads", sample.seed),
            score=config.score_kind(),
            threshold=context.plan.threshold(config.threshold),
            contrast=config.contrast,
        )

    arms = dose_arms(config)
    phases = []
    if config.metric in ("teacher", "both"):
        grid = [(arm, f) for arm in arms for f in fractions] + [(arm, OPERATING_POINT) for arm in MEAN_ARMS]
        teacher = partial(_teacher_records, lm, config, settings, grid)
        phases.append(  # batch_size samples' clean answers decode together; a sample's arms x fractions are one batch
            Phase(
                [Job(f"{s.sample_id}-teacher", s, group=s.sample_id) for s in samples],
                lambda batch: [Finished(record) for record in teacher(batch)],
                "ablate teacher-forced",
            )
        )
    if config.metric in ("cascade", "both"):
        runs = [("none", None)] + [(arm, f) for arm in arms for f in fractions]
        named = [(arm, f, "" if f is None else f"-f{fraction_key(f)}") for arm, f in runs]
        jobs = cascade_jobs(  # sample by sample: a sample's arms share its prefill
            [(f"{s.sample_id}-{arm}{key}", s, partial(settings, s, arm, f)) for s in samples for arm, f, key in named]
        )
        work = cascade_work(lm, config.task_entry(), config.max_new_tokens, context.batch_size, _cascade_record)
        phases.append(Phase(jobs, work, "ablate cascade"))
    design: dict[str, Any] = {"design": DESIGN, "arms": list(arms), "mean_arms": list(MEAN_ARMS)}
    design["contrast"] = config.contrast
    if panel:  # each list, what fitted it and its top heads (the panel's overlap table reads them)
        design["panel"] = {
            arm: {**source.fitted, "top": [head_key(h) for h in source.ranking[:20]]} for arm, source in panel.items()
        }
    return Work(grid_manifest(context, design), phases)


def dose_arms(config: AblationConfig) -> tuple[str, ...]:
    """The dose arms a config runs: ``DOSE_ARMS``, ``contrast`` when it names a contrast score, then the panel's
    lists (``list:NAME``)."""
    return DOSE_ARMS + (("contrast",) if config.contrast else ()) + tuple(config.panel_lists())


def panel_sources(config: AblationConfig, context: Context[AblationConfig, GridPlan]) -> dict[str, StaticSource]:
    """The panel's head lists by arm, each loaded for the model and refused where it was fitted on what the run
    evaluates (``resources.static_heads``, as the static list)."""
    shape = (context.lm.num_layers, context.lm.num_heads)
    return {arm: static_heads(path, shape, context.plan.evaluated) for arm, path in config.panel_lists().items()}


def _dose_plan(config: AblationConfig, lm: LoadedModel) -> GridPlan:
    needs = needs_of(ABLATION_STRATEGIES.get(arm) for arm in DOSE_ARMS)
    return grid_plan(config, lm, needs, "this ablation run", fits_threshold=True)


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
        "mean_contrast": float(np.mean(result.contrast_sizes)) if config.contrast and result.tokens else None,
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
