"""Train the head predictor (the paper's MLP probe; Claim 3, offset 0) on a run directory and report it beside the
paper's Table 2 / Table 3.

Writes into ``out_dir`` (default ``RUN_DIR/probe``): ``weights.pt`` and ``probe.json``
(``HeadPredictorResult.save``, loadable with ``load_head_predictor``), and ``metrics.md`` / ``metrics.json``: test
metrics of the probe, of the frequency baseline, and the paper's values for its five models. Copy scores (Eq. 1)
train a classifier, reasoning scores (Eq. 2) a regressor, and the sets a threshold decides on a continuous score
(``sets``: W_t of the write score) a classifier.

``questions.json`` records the questions behind each split of the probe (train, validation, test: source
record ids, or sample ids for tasks without records) and the run's question stream, so that ``dynheads rag``
can refuse to evaluate the probe on questions it was trained or validated on (``resources.predictor_questions``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from dynheads.analysis.cca import empty_note, samples_from_traces
from dynheads.analysis.head_predictor import (
    HeadPredictorConfig,
    HeadPredictorResult,
    Task,
    split_by_sample,
    train_head_predictor,
)
from dynheads.errors import DynheadsError
from dynheads.outputs import Outputs, Written, write_outputs
from dynheads.paper import PAPER_PROBE_BINARY, PAPER_PROBE_CONTINUOUS
from dynheads.resources import QUESTIONS_FILE
from dynheads.runs import RunDir
from dynheads.scores import HEAD_SCORES, ScoreKind, ScoreSpec
from dynheads.tables import Summary, Table
from dynheads.traces import Trace
from dynheads.views.analyses import check_score, load_run, model_name
from dynheads.views.threshold_fit import ThresholdFit

_COLUMNS = {  # task -> (metric key, column title)
    "binary": (
        ("f1", "F1"),
        ("precision", "Precision"),
        ("recall", "Recall"),
        ("auprc", "AUPRC"),
        ("positive_rate", "positive rate"),
    ),
    "continuous": (
        ("mse", "MSE"),
        ("mae", "MAE"),
        ("r2", "R² (heads weighted by variance)"),
        ("r2_uniform", "R² (mean per head)"),
        ("r2_flat", "R² (flattened)"),
    ),
}


def train_probe_on_run(
    run_dir: str | Path,
    config: HeadPredictorConfig | None = None,
    *,
    score: ScoreKind = "copy",
    out_dir: str | Path | None = None,
    device: str = "cpu",
    progress: bool = True,
    sets: ThresholdFit | None = None,
) -> HeadPredictorResult:
    """Train a probe from the run's hidden states to its ``score`` of every head; save it and its metrics. With
    ``sets`` (a continuous score's threshold, as ``views.threshold_fit`` resolves it) the targets are the per-step
    sets the threshold decides (W_t of the write score): a classifier, ranked as Eq. 1's D_t are."""
    run, traces = load_run(run_dir)
    config = config or HeadPredictorConfig()
    start = time.perf_counter()
    task, samples = _training_samples(traces, score, sets)
    counts = {"samples": len(samples), "empty_samples_skipped": len(traces) - len(samples)}
    result = train_head_predictor(samples, config, task=task, shape=traces[0].shape, progress=progress, device=device)
    seconds = time.perf_counter() - start
    out = Path(out_dir) if out_dir else run.path / "probe"
    outputs = Outputs().add(".", Written(result.save))  # weights.pt and probe.json
    outputs.add(QUESTIONS_FILE, probe_questions(run, config, result.metrics["split_pairs"]))
    paper = PAPER_PROBE_BINARY if task == "binary" else PAPER_PROBE_CONTINUOUS
    rows = {
        f"{model_name(run)}: MLP probe (ours)": result.metrics["probe"],
        f"{model_name(run)}: frequency baseline (ours)": result.metrics["baseline"],
        **{f"{name} (paper, {'Table 2' if task == 'binary' else 'Table 3'})": row for name, row in paper.items()},
    }
    epochs = len(result.history)
    targets = f"{score} scores" if sets is None else f"{score} sets ({sets.describe()})"
    summary = (
        (f"{empty_note(counts)}\n" if counts["empty_samples_skipped"] else "")
        + f"{targets} ({task}); {len(samples)} samples split by sample into "
        f"{_split_text(result.metrics['split_pairs'])} steps; hidden sizes {list(config.hidden_sizes)}, {epochs} of "
        f"{config.epochs} epochs (best {result.metrics['best_epoch']}), trained in {seconds:.0f} s on {device}."
        + (
            f" Decision threshold {result.metrics['threshold']:.4f} (probe), "
            f"{result.metrics['baseline_threshold']:.4f} (baseline)."
            if task == "binary"
            else ""
        )
        + f" Probe minus baseline {_gap_text(result.metrics['gap'])}"
        + (f"; baseline minus probe {_gap_text(result.metrics['mse_gap'])}" if "mse_gap" in result.metrics else "")
        + f"; probe minus the step-index profile {_gap_text(result.metrics['position_gap'])} (Claim 3)"
        + f"; within-step ranking of the step's heads, probe minus the frequency profile "
        f"{_gap_text(result.metrics['step_gap'])} (Claim 1)" + " (95 % bootstrap intervals over the test samples)."
    )
    outputs.add(
        "metrics.md",
        Summary(
            [summary, metrics_table(rows, task)],
            {
                "task": task,
                "probe": result.metrics["probe"],
                "baseline": result.metrics["baseline"],
                "gap": result.metrics["gap"],
                "position_gap": result.metrics["position_gap"],
                "step_gap": result.metrics["step_gap"],
                **({"mse_gap": result.metrics["mse_gap"]} if "mse_gap" in result.metrics else {}),
            },
            f"MLP probe on {run.path}",
        ),
    )
    outputs.add(
        "metrics.json",
        {
            "run": str(run.path),
            "score": score,
            **({"threshold_fit": sets.to_dict()} if sets is not None else {}),
            "task": task,
            "epochs_run": epochs,
            **counts,
            "train_seconds": seconds,
            **result.metrics,
            "paper": paper,
        },
    )
    write_outputs(out, outputs)
    return result


def _training_samples(
    traces: Sequence[Trace], score: ScoreKind, sets: ThresholdFit | None
) -> tuple[Task, list[tuple[np.ndarray, np.ndarray]]]:
    """The predictor's task and its (hidden, targets) pairs: a score's values (binary or continuous), or the sets a
    threshold decides (binary); traces with no generated token left out."""
    binary = HEAD_SCORES.get(check_score(score)).binary
    if sets is not None and binary:
        raise DynheadsError(
            f"a threshold decides the sets of a continuous score; {score} is binary (its values are its sets): "
            "train without --threshold"
        )
    if sets is not None:
        return "binary", set_samples(traces, ScoreSpec(score, sets.applied))
    return ("binary" if binary else "continuous"), samples_from_traces(traces, score)


def set_samples(traces: Sequence[Trace], spec: ScoreSpec) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(hidden [T, D], active [T, L*H])`` per trace with T >= 1: the sets ``spec`` decides at every step, as
    0/1 targets (``samples_from_traces``' shape)."""
    return [
        (t.hidden, spec.active(t.scores, t.chance).reshape(t.num_steps, -1).astype(np.float32))
        for t in traces
        if t.num_steps
    ]


def _gap_text(gap: Mapping) -> str:
    metric = {"r2": "R² (heads weighted by variance)", "baseline mse - probe mse": "MSE"}.get(
        gap["metric"], gap["metric"].upper()
    )
    if any(isinstance(gap[key], float) and math.isnan(gap[key]) for key in ("effect", "low", "high")):
        return f"{metric}: undefined (n={gap['n']} test samples)"
    return f"{metric}: {gap['effect']:.4f} [{gap['low']:.4f}, {gap['high']:.4f}] (n={gap['n']} test samples)"


def metrics_table(rows: Mapping[str, Mapping[str, float]], task: str) -> Table:
    """One row per predictor, the task's metric columns; blank where a row lacks a metric."""
    columns = _COLUMNS[task]
    return Table(
        ["predictor", *(title for _, title in columns)],
        [[name, *(float(row[key]) if key in row else "" for key, _ in columns)] for name, row in rows.items()],
        float_format=".4f",
        missing="nan",
    )


def probe_questions(run: RunDir, config: HeadPredictorConfig, split_pairs: Mapping[str, int]) -> dict:
    """``questions.json``: the question ids of each probe split, recomputed with the probe's own seeded
    split and checked against its step counts; if they cannot be matched, every question of the run counts as
    train and validation (never an under-report)."""
    records = [r for r in run.records() if run.trace_path(r["sample_id"]).is_file()]  # = load_run's traces
    ids = [r.get("record_id") or r["sample_id"] for r in records]
    steps = [int(r.get("steps", -1)) for r in records]
    candidates = [list(range(len(records))), [i for i, n in enumerate(steps) if n > 0]]  # empty traces may drop
    splits, exact = {"train": sorted(set(ids)), "validation": sorted(set(ids)), "test": []}, False
    for kept in candidates:
        if len(kept) < 3:
            continue
        parts = split_by_sample(len(kept), config.split, config.seed)
        if all(
            sum(steps[kept[i]] for i in idx) == split_pairs[name]
            for name, idx in zip(("train", "val", "test"), parts, strict=True)
        ):
            splits = {
                name: sorted({ids[kept[i]] for i in idx})
                for name, idx in zip(("train", "validation", "test"), parts, strict=True)
            }
            exact = True
            break
    return {"run": str(run.path), "run_questions": run.manifest().get("questions"), "split_exact": exact, **splits}


def _split_text(split_pairs: dict[str, int]) -> str:
    """``{"train": 583, "val": 162, "test": 82}`` -> "train 583, val 162, test 82"."""
    return ", ".join(f"{part} {count}" for part, count in split_pairs.items())
