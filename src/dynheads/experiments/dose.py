"""Claim 2 as a dose-response (issue 32): every arm masks k heads per step, for every k of ``doses``.

Arms (``ablation_strategies``): ``dynamic`` (the step's heads ranked, D_t first), ``static`` (the static list's top
k), ``static_outside`` (the static list's top k outside the step's D_t: "dynamic" against "important and always
on") and ``random`` (k heads drawn per sample and step). Metrics (``metric``):

- ``teacher`` (graded, decides the verdict): ``ablation_forced.forced_ablations``, one record per sample; per arm
  and dose the mean over the clean answer's steps of the masked log-probability of the clean token, of its drop
  and of the argmax flips. One prefill per sample; the arms x doses of a step are rows of one batch; the clean
  answers of ``batch_size`` samples decode together (batch 1: the reference path, exactly as before).
- ``cascade``: greedy continues under masking (``ablation.ablated_generate_batch``), one record per sample, arm and
  dose, plus the un-ablated run; the task metric (accuracy / ROUGE-L, EM / F1). A sample's arms share one prefill.

``write_doses`` writes ``dose.csv`` (metric, arm, dose, mean and 95 % interval over samples, n, heads masked per
step), ``summary.md`` (its numbers: per arm and dose the per-sample values Claim 2 reads) and
``plots/dose-teacher.png`` / ``plots/dose-cascade.png`` (every arm's curve with its interval). The manifest
records the static list and the data that fitted it (``static_source``, from ``resources``); a list fitted on the
evaluated stream is refused.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any, Unpack

import numpy as np
import pandas as pd

from dynheads import distributed
from dynheads.ablation.forced import ForcedResult, forced_ablations
from dynheads.ablation.per_step import AblationResult, AblationSettings
from dynheads.ablation.strategies import ABLATION_STRATEGIES, DOSE_ARMS
from dynheads.analysis.evidence import EvidenceSettings, Interval, fraction_interval, mean_interval
from dynheads.errors import DynheadsError
from dynheads.experiments.ablation import (
    AblationConfig,
    decode_jobs,
    result_record,
    run_ablation,
    run_task_of,
    start_grid,
)
from dynheads.io import atomic_path
from dynheads.models import LoadedModel, decode_text
from dynheads.plots.ablation import plot_doses
from dynheads.resources import needs_of
from dynheads.runs import Finished, Job, RunDir, RunOptions, batch_size_of, run_jobs, run_model
from dynheads.seeding import derive_seed
from dynheads.tables import Summary, frame_table, write_summary
from dynheads.tasks.registry import Task

TEACHER = {"logprob": "log p(clean token), masked", "drop": "drop in log p(clean token) (nats)", "flip": "argmax flips"}


def run_claim2(config: AblationConfig, out: str | Path, **options: Unpack[RunOptions]) -> RunDir:
    """``ablate``: the dose-response when ``doses`` are given, else the matched grid (``run_ablation``)."""
    return run_doses(config, out, **options) if config.doses else run_ablation(config, out, **options)


def run_doses(config: AblationConfig, out: str | Path, **options: Unpack[RunOptions]) -> RunDir:
    """Every grid sample under every arm at every dose, by the config's metric(s), into ``out`` (resumable)."""
    config.check()
    if not config.doses or not config.static:
        raise DynheadsError("the dose-response needs doses (--doses 1,2,3,5,8) and a static head list (--static FILE)")
    lm = run_model(config, options)
    doses = tuple(sorted(set(config.doses)))
    needs = needs_of(ABLATION_STRATEGIES.get(arm) for arm in DOSE_ARMS)
    run, samples, static = start_grid(
        config,
        "ablation",
        lm,
        out,
        needs,
        {"design": "dose", "arms": list(DOSE_ARMS)},
        batch_size=batch_size_of(options),
    )

    def settings(sample, arm: str, dose: int | None) -> AblationSettings:
        return AblationSettings(
            strategy=arm,
            dose=dose,
            mode=config.ablation_mode(),
            static_ranking=static,
            seed=derive_seed(config.seed, "random-heads", sample.seed),
            score=config.task_entry().score_kind,
            threshold=config.threshold,
        )

    if config.metric in ("teacher", "both"):
        teacher = partial(_teacher_records, lm, config, settings, doses)
        run_jobs(  # batch_size samples' clean answers decode together; a sample's arms x doses are one batch
            run,
            [Job(f"{s.sample_id}-teacher", s, group=s.sample_id) for s in samples],
            lambda batch: [Finished(record) for record in teacher(batch)],
            desc="ablate teacher-forced",
            **options,
        )
    if config.metric in ("cascade", "both"):
        arms = [("none", None)] + [(arm, dose) for arm in DOSE_ARMS for dose in doses]
        jobs = [  # sample by sample: a sample's arms share its prefill (``decode_jobs``)
            (f"{s.sample_id}-{arm}" + ("" if dose is None else f"-k{dose}"), s, partial(settings, s, arm, dose))
            for s in samples
            for arm, dose in arms
        ]
        decode_jobs(run, lm, config, jobs, _cascade_record, "ablate cascade", options)
    if distributed.is_main():
        write_doses(run)
    return run


def _teacher_records(
    lm: LoadedModel, config: AblationConfig, settings, doses: tuple[int, ...], samples: list
) -> list[dict]:
    """The samples' teacher-forced records (their clean answers decoded as one batch)."""
    grid = [(arm, dose) for arm in DOSE_ARMS for dose in doses]
    rows = [[settings(sample, arm, dose) for arm, dose in grid] for sample in samples]
    results = forced_ablations(lm, samples, rows, config.max_new_tokens)
    return [_teacher_record(lm, config, grid, sample, result) for sample, result in zip(samples, results, strict=True)]


def _teacher_record(lm: LoadedModel, config: AblationConfig, grid: list, sample, result: ForcedResult) -> dict:
    """One sample's teacher-forced record: per arm and dose the means over the clean answer's steps."""
    text = decode_text(lm.tokenizer, result.tokens, skip_special_tokens=True)
    arms: dict[str, dict[str, dict[str, float | None]]] = {arm: {} for arm in DOSE_ARMS}
    for row, (arm, dose) in enumerate(grid):
        steps = len(result.tokens)
        arms[arm][str(dose)] = {
            "logprob": float(np.mean(result.masked_logprob[row])) if steps else None,
            "drop": float(np.mean(result.drop(row))) if steps else None,
            "flip": float(np.mean(result.flipped[row])) if steps else None,
            "masked": float(np.mean([len(h) for h in result.masked[row]])) if steps else None,
        }
    return {
        **sample.describe(),
        "grid_sample_id": sample.sample_id,
        "kind": "teacher",
        "generated": text,
        "steps": len(result.tokens),
        "metrics": config.task_entry().score(sample, text),
        "clean_logprob": float(np.mean(result.clean_logprob)) if result.tokens else None,
        "mean_dynamic": float(np.mean(result.dynamic_counts)) if result.tokens else 0.0,
        "arms": arms,
    }


def _cascade_record(sample, settings: AblationSettings, result: AblationResult, task: Task) -> dict:
    return {
        **result_record(sample, result, task),
        "kind": "cascade",
        "strategy": settings.strategy,
        "dose": settings.dose,
    }


# ---- tables, figures and the numbers Claim 2 reads -------------------------------------------------------------------
def write_doses(run: RunDir, evidence: EvidenceSettings | None = None) -> pd.DataFrame:
    """dose.csv, summary.md (with the per-sample numbers) and the figures of a dose-response run."""
    evidence = evidence or EvidenceSettings()
    records, task = run.records(), run_task_of(run)
    numbers: dict[str, Any] = {"design": "dose", "doses": run.manifest()["config"]["doses"], "arms": list(DOSE_ARMS)}
    teacher = [r for r in records if r.get("kind") == "teacher" and r["steps"] > 0]
    if teacher:
        numbers["teacher"] = _teacher_numbers(teacher)
        numbers["teacher"]["no_steps"] = sum(1 for r in records if r.get("kind") == "teacher" and r["steps"] == 0)
    cascade = [r for r in records if r.get("kind") == "cascade"]
    if cascade:
        numbers["cascade"] = _cascade_numbers(cascade, list(task.metrics))
    table = pd.DataFrame(_rows(numbers, evidence))
    with atomic_path(run.path / "dose.csv") as tmp:
        table.to_csv(tmp, index=False)
    model = run.manifest()["model"]["name"]
    title = f"{model}: dose-response ({task.label}, {run.manifest()['config']['mode']} masking)"
    if teacher:
        plot_doses(
            table,
            run.path / "plots" / "dose-teacher.png",
            {"drop": TEACHER["drop"], "flip": TEACHER["flip"]},
            title=title,
        )
    if cascade:
        plot_doses(table, run.path / "plots" / "dose-cascade.png", dict(task.metrics), title=title)
    write_summary(run.path, "summary.md", _summary(table, numbers, run.manifest(), title))
    return table


def _teacher_numbers(records: list[dict]) -> dict[str, Any]:
    """Per-sample values in one sample order: the clean log-probability and, per quantity, arm and dose."""
    doses = sorted(records[0]["arms"]["dynamic"], key=int)
    out: dict[str, Any] = {"clean_logprob": [r["clean_logprob"] for r in records], "samples": len(records)}
    for quantity in ("logprob", "drop", "flip", "masked"):
        out[quantity] = {arm: {d: [r["arms"][arm][d][quantity] for r in records] for d in doses} for arm in DOSE_ARMS}
    return out


def _cascade_numbers(records: list[dict], metrics: list[str]) -> dict[str, Any]:
    """Per metric: the un-ablated run's per-sample values and, per arm and dose, the masked runs' (one sample
    order: samples every run of the design finished)."""
    frame = pd.DataFrame(
        [
            {
                "sample": r["grid_sample_id"],
                "run": f"{r['strategy']}|{r['dose']}",
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


def _mean_of(quantity: str, values: list[float], evidence: EvidenceSettings) -> Interval:
    """A quantity's mean over samples with its 95 % interval: the drop in log-probability (unbounded) by bootstrap;
    a share per sample (argmax flips, the task's metrics: accuracy, ROUGE-L, EM, F1, each in [0, 1]) by
    ``fraction_interval`` (exact Clopper-Pearson for 0/1 values, never of zero width)."""
    if quantity == "drop":
        return mean_interval(np.asarray(values, dtype=float), evidence)
    return fraction_interval(values, evidence)


def _rows(numbers: dict[str, Any], evidence: EvidenceSettings) -> list[dict]:
    """dose.csv's rows: per metric, arm and dose the mean over samples with its 95 % interval."""
    rows = []
    for family, quantities in (("teacher", ("drop", "flip")), ("cascade", tuple(numbers.get("cascade", {})))):
        data = numbers.get(family)
        if not data:
            continue
        for quantity in quantities:
            if quantity == "masked":
                continue
            masked = data["masked"]
            for arm in DOSE_ARMS:
                for dose, values in data[quantity][arm].items():
                    interval = _mean_of(quantity, values, evidence)
                    rows.append(
                        {
                            "family": family,
                            "metric": quantity,
                            "arm": arm,
                            "dose": int(dose),
                            "mean": interval.effect,
                            "low": interval.low,
                            "high": interval.high,
                            "n": interval.n,
                            "masked": float(np.mean(masked[arm][dose])),
                        }
                    )
            if family == "cascade" and data[quantity]["none"]:
                interval = _mean_of(quantity, data[quantity]["none"], evidence)
                rows.append(
                    {
                        "family": family,
                        "metric": quantity,
                        "arm": "none",
                        "dose": 0,
                        "mean": interval.effect,
                        "low": interval.low,
                        "high": interval.high,
                        "n": interval.n,
                        "masked": 0.0,
                    }
                )
    return rows


def _summary(table: pd.DataFrame, numbers: dict[str, Any], manifest: dict, title: str) -> Summary:
    source = manifest.get("static_source") or {}
    fitted = source.get("fitted_on")
    blocks: list = [
        "Every arm masks k heads at every step (dynamic: the step's heads ranked, D_t first; static: the static "
        "list's top k; static_outside: its top k outside D_t; random: a draw per sample and step). teacher = each "
        "step of the clean greedy answer masked alone on the clean history (drop in log p of the clean token, "
        "share of steps whose argmax flips; the stop token's step is not measured); cascade = greedy continues under "
        "masking. Means over samples with "
        "95 % bootstrap intervals; masked = heads removed per step.",
        f"Static list: {source.get('file')}, fitted on "
        + (", ".join(f"{key} {value}" for key, value in fitted.items()) if isinstance(fitted, dict) else str(fitted))
        + " (the manifest's static_source).",
        frame_table(
            table,
            {
                "family": "metric of",
                "metric": "metric",
                "arm": "arm",
                "dose": "k",
                "mean": "mean",
                "low": "low",
                "high": "high",
                "n": "n",
                "masked": "masked",
            },
        ),
    ]
    if numbers.get("teacher", {}).get("no_steps"):
        blocks.append(
            f"Samples whose clean answer ended at once (no step to measure): {numbers['teacher']['no_steps']}."
        )
    return Summary(blocks, numbers, title)
