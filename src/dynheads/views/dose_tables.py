"""The tables of a dose-response run (``experiments.dose``), from its records: dose.csv, summary.md with the
per-sample numbers Claim 2's operating point is decided from, and the dose and compensation figures."""

from __future__ import annotations

from functools import partial
from typing import Any

import numpy as np
import pandas as pd

from dynheads.ablation.strategies import DOSE_ARMS, MEAN_ARMS, dose_key
from dynheads.analysis.evidence import (
    EvidenceSettings,
    Interval,
    fraction_interval,
    mean_interval,
    paired_difference,
)
from dynheads.outputs import Outputs, Written, write_outputs
from dynheads.plots.ablation import plot_doses
from dynheads.runs import RunDir, RunView
from dynheads.scores import ScoreSpec
from dynheads.tables import Summary, frame_table
from dynheads.tasks.registry import grid_task
from dynheads.views.threshold_fit import fit_lines

TEACHER = {
    "logprob": "log p(clean token), masked",
    "drop": "drop in log p(clean token) (nats), all steps",
    "drop_nonempty": "drop in log p(clean token) (nats), steps with |D_t| > 0",
    "flip": "argmax flips",
}


TEACHER_QUANTITIES = ("logprob", "drop", "drop_nonempty", "flip", "masked", "overlap")  # per arm and fraction


OPERATING_POINT = 1.0  # the fraction that masks exactly D_t: the paper's design, where Claim 2 is decided


DESIGN = "fraction"  # the dose design the stage's numbers follow (older runs: "dose", fixed k heads per step)


def fraction_key(fraction: float | None) -> str:
    """How a fraction names a dose in records and numbers: 0.25, 1, 1.5 (None: the un-ablated run)."""
    return "None" if fraction is None else dose_key(fraction)


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
        "arms": list(manifest.get("arms") or DOSE_ARMS),  # the contrast arm beside DOSE_ARMS where one ran
        "mean_arms": list(MEAN_ARMS),
    }
    teacher = [r for r in records if r.get("kind") == "teacher" and r["steps"] > 0]
    if teacher:
        numbers["teacher"] = _teacher_numbers(teacher)
        numbers["teacher"]["no_steps"] = sum(1 for r in records if r.get("kind") == "teacher" and r["steps"] == 0)
    cascade = [r for r in records if r.get("kind") == "cascade"]
    if cascade:
        numbers["cascade"] = _cascade_numbers(cascade, list(task.metrics), numbers["arms"])
    table = pd.DataFrame(_rows(numbers, evidence))
    outputs = Outputs().add("dose.csv", table)
    title = f"{manifest['model']['name']}: {{}} ({task.label}, {config['mode']} masking)"
    if teacher:
        panels = {name: TEACHER[name] for name in ("drop", "drop_nonempty", "flip")}
        outputs.extend(_figures(table[table["family"] == "teacher"], "teacher", panels, title))
    if cascade:
        outputs.extend(_figures(table[table["family"] == "cascade"], "cascade", dict(task.metrics), title))
    panel = manifest.get("panel") or {}
    blocks: list = []
    if panel and teacher:
        detectors = [
            "static",
            *(["contrast"] if config.get("contrast") else []),
            *panel,
        ]  # the per-step second score too
        effects = panel_effects(numbers["teacher"], detectors, evidence)
        overlap = panel_overlap({"static": manifest["static_top"]} | _tops(panel))
        outputs.add("panel.csv", effects).add("panel-overlap.csv", overlap)
        blocks = _panel_blocks(effects, overlap)
    return outputs.add("summary.md", _summary(table, numbers, manifest, title.format("dose-response"), blocks))


# ---- the detector panel (--panel): every list at the step's own |D_t|, beside D_t itself ----------------------------
def panel_effects(teacher: dict[str, Any], lists: list[str], evidence: EvidenceSettings) -> pd.DataFrame:
    """At f = 1, on the samples Claim 2 decides on (a correct clean answer with a step where D_t is not empty):
    D_t's and each list's drop over non-empty steps (each list's top |D_t| heads at every step), D_t minus each
    list (paired over samples), and each list's overlap |masked ∩ D_t| / |D_t|."""
    at = fraction_key(OPERATING_POINT)
    decided = np.asarray(teacher["correct"], bool) & (np.asarray(teacher["nonempty_steps"]) > 0)
    drop = {arm: _floats(teacher["drop_nonempty"][arm][at])[decided] for arm in ["dynamic", *lists]}
    rows = []
    for arm, values in drop.items():
        alone = mean_interval(values, evidence)
        versus = paired_difference(drop["dynamic"], values, evidence) if arm != "dynamic" else None
        overlap = _floats(teacher["overlap"][arm][at])[decided]
        rows.append(
            {
                "arm": arm,
                "drop": alone.effect,
                "drop_low": alone.low,
                "drop_high": alone.high,
                "n": alone.n,
                "dynamic_minus": None if versus is None else versus.effect,
                "dynamic_minus_low": None if versus is None else versus.low,
                "dynamic_minus_high": None if versus is None else versus.high,
                "overlap": _mean_of(list(overlap)),
            }
        )
    return pd.DataFrame(rows)


def panel_overlap(tops: dict[str, list[str]], ks: tuple[int, ...] = (10, 20)) -> pd.DataFrame:
    """Heads shared by the top k of every two lists (``tops``: each list's heads, best first), k in ``ks``."""
    names = list(tops)
    return pd.DataFrame(
        [
            {"k": k, "list": a, "other": b, "shared": len(set(tops[a][:k]) & set(tops[b][:k]))}
            for k in ks
            for i, a in enumerate(names)
            for b in names[i + 1 :]
        ]
    )


def _tops(panel: dict[str, dict]) -> dict[str, list[str]]:
    return {arm: list(entry["top"]) for arm, entry in panel.items()}


def _panel_blocks(effects: pd.DataFrame, overlap: pd.DataFrame) -> list:
    """summary.md's panel section: the effects (panel.csv) and the top-k overlaps (panel-overlap.csv)."""

    def shown(prefix: str) -> list[str]:
        columns = [effects[f"{prefix}{part}"] for part in ("", "_low", "_high")]
        return ["" if pd.isna(m) else f"{m:+.3f} [{lo:+.3f}, {hi:+.3f}]" for m, lo, hi in zip(*columns, strict=True)]

    shown_effects = effects.assign(drop=shown("drop"), dynamic_minus=shown("dynamic_minus"))
    columns = {"arm": "arm", "drop": "drop", "n": "n", "dynamic_minus": "D_t minus it", "overlap": "overlap with D_t"}
    return [
        "Detector panel at f = 1 (panel.csv), on the samples Claim 2 decides on (correct clean answer, a non-empty "
        "step): every list masks its top |D_t| heads at each step, D_t itself beside them; drop over non-empty "
        "steps (nats) with 95 % bootstrap intervals, D_t minus each list paired over samples, overlap = |masked ∩ "
        "D_t| / |D_t|. Heads shared by the lists' top k (panel-overlap.csv):",
        frame_table(shown_effects[list(columns)], columns),
        frame_table(overlap, {"k": "k", "list": "list", "other": "other", "shared": "shared heads"}),
    ]


def _figures(table: pd.DataFrame, family: str, panels: dict[str, str], title: str) -> Outputs:
    """The dose curves (f <= 1) and, when the run masked past D_t, the compensation curves (f >= 1)."""
    doses = table[table["fraction"] <= OPERATING_POINT]
    figures = Outputs().add(
        f"plots/dose-{family}.png",
        Written(partial(plot_doses, doses, panels=panels, title=title.format("dose-response in fractions of |D_t|"))),
    )
    dosed = ~table["arm"].isin([*MEAN_ARMS, "none"])
    past = table[((table["fraction"] >= OPERATING_POINT) & dosed) | (table["arm"] == "none")]
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


def _cascade_numbers(records: list[dict], metrics: list[str], arms: list[str]) -> dict[str, Any]:
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
        for arm in arms:
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


def _summary(table: pd.DataFrame, numbers: dict[str, Any], manifest: dict, title: str, panel: list) -> Summary:
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
    config, scores = manifest["config"], []
    if config.get("score"):  # D_t from another score than the task's (the write score's W_t)
        spec = ScoreSpec(config["score"], config["threshold"])
        scores.append(f"D_t here: {spec.describe()} (--score {config['score']}).")
    scores += fit_lines(manifest)
    if config.get("contrast"):
        scores.append(
            f"contrast = the step's top k_t heads by the {ScoreSpec(config['contrast']).describe()}, its own set "
            "first (then by its ranking): as many of those heads as D_t."
        )
    blocks[1:1] = scores
    blocks += panel
    if numbers.get("teacher", {}).get("no_steps"):
        blocks.append(
            f"Samples whose clean answer ended at once (no step to measure): {numbers['teacher']['no_steps']}."
        )
    return Summary(blocks, numbers, title)
