"""The tables of a KV run (``experiments.kv``) or of several joined (``views.kv_join``), from their records: per
policy and budget accuracy with its interval, the cells of the grid, the full cache's evidence against chance, the
probe's precision and recall, summary.md and the plots (the module docstring of ``experiments.kv`` lists the files).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd

from dynheads.analysis.evidence import EvidenceSettings, above_chance_p_value, fraction_interval, paired_difference
from dynheads.errors import DynheadsError
from dynheads.kv.policies import KV_POLICIES
from dynheads.kv.press_registry import KVPRESS, KVPRESS_PRESSES, TRACKS, parse_press
from dynheads.outputs import Outputs, Written, write_outputs
from dynheads.plots.kv import pareto_front, plot_kv_accuracy, plot_kv_grid
from dynheads.runs import RunDir, RunView
from dynheads.tables import Block, Summary, Table
from dynheads.tasks.registry import grid_task


def kv_tables(view: RunView) -> Outputs:
    """results.csv, table.csv, cells.csv, probe_pr.*, summary.md and the plots of a KV run, from its records."""
    return policy_tables(view.records, view.manifest, unchecked_sources(view.manifest))


def write_kv_tables(run: RunDir) -> pd.DataFrame:
    """``kv_tables`` written into the run's folder; returns table.csv's frame."""
    outputs = kv_tables(RunView.of(run))
    write_outputs(run.path, outputs)
    return outputs.files["table.csv"]


def unchecked_sources(manifest: dict) -> list[Block]:
    """A line per head source whose disjointness from the evaluation samples was not checked (an outside list,
    ``--outside-heads``): nothing tells whether it was fitted on the samples it is judged on."""
    fitted = manifest.get("fit_samples") or {}
    return [
        f"The {name} head source {source['path']} was not checked for disjointness from the evaluation samples "
        f"({source['checked']}{'; --outside-heads' if manifest['config'].get('outside_heads') else ''}): if it "
        "was fitted on them, its rows overstate it."
        for name, source in fitted.items()
        if source and str(source.get("checked", "")).startswith("unknown")
    ]


def write_policy_tables(folder: Path, records: list[dict], manifest: dict, notes: Sequence[Block] = ()) -> pd.DataFrame:
    """``policy_tables`` written into ``folder``; returns table.csv's frame."""
    if not records:
        raise DynheadsError(f"{folder} has no finished samples yet")
    outputs = policy_tables(records, manifest, notes)
    write_outputs(folder, outputs)
    return outputs.files["table.csv"]


def policy_tables(records: list[dict], manifest: dict, notes: Sequence[Block] = ()) -> Outputs:
    """The tables of the KV records ``records`` decoded under ``manifest`` (one run's, or several joined by
    ``views.kv_join``); ``notes`` go into summary.md after the table."""
    if not records:
        raise DynheadsError("no finished KV samples yet")
    frame = pd.json_normalize(
        [{k: v for k, v in r.items() if k not in ("dynamic", "probe_scores", "voters")} for r in records], sep="."
    )
    outputs = Outputs().add("results.csv", frame.copy())
    frame["budget"] = frame["budget"].fillna(1.0).where(frame["policy"] != "none", 0.0)
    # Compare policies on the same samples: keep those finished under every (policy, budget) seen in the run.
    jobs = frame.groupby("grid_sample_id")[["policy", "budget"]].apply(lambda g: len(g.drop_duplicates()))
    complete = set(jobs[jobs == frame[["policy", "budget"]].drop_duplicates().shape[0]].index)
    frame = frame[frame["grid_sample_id"].isin(complete)]
    records = [r for r in records if r["grid_sample_id"] in complete]
    task = grid_task(manifest)
    first, *others = task.metrics  # the first decides: the table's accuracy; the others keep their names
    frame["accuracy"] = frame[f"metrics.{first}"]
    evidence = EvidenceSettings(seed=manifest["seed"])
    table = _policy_table(frame, others, evidence)
    if "ratio" in frame:  # presses at compression ratios (--ratios): each row's ratio beside its kept share
        ratios = frame.groupby(["policy", "budget"])["ratio"].first()
        table["ratio"] = [ratios.get((p, b), np.nan) for p, b in zip(table["policy"], table["budget"], strict=True)]
    full_scores = frame.loc[frame["policy"] == "full", "accuracy"].to_numpy(dtype=float)
    at_chance = full_cache_evidence(full_scores, run_chance(manifest), evidence)
    table["full_cache_evidence"] = at_chance.evidence
    cells = (
        frame.groupby(["policy", "budget", "context_tokens", "depth"])
        .agg(accuracy=("accuracy", "mean"), samples=("grid_sample_id", "size"))
        .reset_index()
    )
    if "ratio" in table:  # a press at a compression ratio: its panel names the ratio, not the kept share
        ratios = table.set_index(["policy", "budget"])["ratio"]
        cells["ratio"] = [ratios.get((p, b), np.nan) for p, b in zip(cells["policy"], cells["budget"], strict=True)]
    outputs.add("table.csv", table).add("cells.csv", cells)
    model, config = manifest["model"]["name"], manifest["config"]
    measure = f"{task.label} accuracy" if first == "accuracy" else f"{task.label} {task.metrics[first]}"
    named: list[Block] = [] if first == "accuracy" else [f"accuracy = {task.metrics[first]}, the task's first metric."]
    blocks: list[Block] = [
        *named,
        f"sink {config['sink']}, recent {config['recent']}; budget = fraction of the KV heads kept whole (full: 1, "
        f"none: 0; {manifest['gqa_rule']}); KV heads = whole KV heads per step, shortfall = KV heads the budget "
        "allows that the policy did not keep (static: no head with a positive score left); accuracy with its 95 % "
        "interval over samples (exact Clopper-Pearson for 0/1 scores, else bootstrap; * = on the Pareto front of "
        "accuracy vs resident KV: no row holds at most its KV with at least its accuracy, one strictly); resident = "
        "KV held on the device as a fraction of the unmodified model's and in MB, mean over steps; dynamic policies "
        "hold the full KV offloaded (second tier) and move, per step, the picked heads' keys beyond the window plus "
        "the new token of every head (re-used: heads picked at the previous step stay resident).",
        *([] if at_chance.evidence else [at_chance.text()]),
        kv_table(table, {name: task.metrics[name] for name in others}),
        *notes,
    ]
    versus = press_comparison(frame, evidence) if at_chance.evidence else None
    if versus is not None:
        outputs.add("presses.csv", versus)
        blocks += press_blocks(versus, config.get("track", "question-aware"))
    pr = probe_precision_recall(records, manifest)
    if pr is not None:
        outputs.add("probe_pr.json", pr).add("probe_pr.md", Summary(pr_blocks(pr), pr))
        blocks += pr_blocks(pr)
    numbers = {**_accuracy_numbers(table), "full_cache": at_chance.to_dict()}
    outputs.add("summary.md", Summary(blocks, numbers, f"KV retention: {model}"))
    caveat = "" if at_chance.evidence else f" ({AT_CHANCE})"
    pressed = frame["policy"].str.startswith(KVPRESS).any()
    track = f", {config.get('track', 'question-aware')} track" if pressed else ""
    title = f"{model}\n{measure} vs resident KV{track}{caveat}"  # the model on a line of its own: it fits
    outputs.add(
        "plots/kv-accuracy.png",
        Written(partial(plot_kv_accuracy, table, title=title, measure=measure, front=at_chance.evidence)),
    )
    if cells.groupby(["context_tokens", "depth"]).ngroups > 1:
        outputs.add("plots/kv-grid.png", Written(partial(plot_kv_grid, cells, title=f"{model}: {measure} per cell")))
    return outputs


def _policy_table(frame: pd.DataFrame, others: list[str], evidence: EvidenceSettings) -> pd.DataFrame:
    """table.csv: one row per (policy, budget) of the samples' records (``frame``, its ``accuracy`` the task's first
    metric, ``others`` its other metrics), with the accuracy's interval (``evidence``: the run's seed resamples every
    row's samples) and the Pareto front, in budget and registration order."""
    mb = 1e6
    table = (
        frame.groupby(["policy", "budget"])
        .agg(
            samples=("grid_sample_id", "size"),
            accuracy=("accuracy", "mean"),
            **{name: (f"metrics.{name}", "mean") for name in others},
            kv_heads=("mean_kv_heads", lambda heads: pd.to_numeric(heads).mean()),  # null (a press): no count
            shortfall=("shortfall", "mean"),
            kv_fraction=("kv_fraction", "mean"),
            kv_mb=("kv_bytes", lambda b: b.mean() / mb),
            offloaded_mb=("offloaded_bytes", lambda b: b.mean() / mb),
            moved_mb_per_step=("moved_bytes_per_step", lambda b: b.mean() / mb),
            moved_new_mb_per_step=("moved_new_bytes_per_step", lambda b: b.mean() / mb),
        )
        .reset_index()
    )
    intervals = {
        key: fraction_interval(rows["accuracy"].to_numpy(), evidence)
        for key, rows in frame.groupby(["policy", "budget"])
    }
    table["accuracy_low"] = [intervals[(p, b)].low for p, b in zip(table["policy"], table["budget"], strict=True)]
    table["accuracy_high"] = [intervals[(p, b)].high for p, b in zip(table["policy"], table["budget"], strict=True)]
    table["order"] = table["policy"].map(_policy_order)
    table = table.sort_values(["budget", "order"]).drop(columns="order").reset_index(drop=True)
    table["pareto_front"] = pareto_front(table["kv_fraction"].to_numpy(), table["accuracy"].to_numpy())
    return table


AT_CHANCE = "full cache at chance: not evidence"


@dataclass(frozen=True)
class FullCacheEvidence:
    """Whether a KV cell's full (uncompressed) cache scores above chance, by a one-sided exact binomial test: only
    then can its compressed rows show what compression keeps or loses (a cell whose ceiling is chance compares the
    arms at chance). ``evidence``: p below (1 - confidence) / 2, i.e. the exact 95 % interval lies above chance."""

    evidence: bool
    reason: str
    chance: float | None = None
    successes: int | None = None
    samples: int = 0
    p_value: float | None = None

    def text(self) -> str:
        return f"**{AT_CHANCE[0].upper()}{AT_CHANCE[1:]}** ({self.reason}): no row of this table counts as evidence."

    def to_dict(self) -> dict:
        return asdict(self)


def run_chance(manifest: dict) -> float | None:
    """The chance level of a KV run's task on its data (``Task.chance``), None when the task does not know it."""
    task = grid_task(manifest)
    return task.chance(manifest["config"].get("data") or task.default_data) if task.chance is not None else None


def full_cache_evidence(scores: np.ndarray, chance: float | None, evidence: EvidenceSettings) -> FullCacheEvidence:
    """``FullCacheEvidence`` of the full cache's per-sample scores on the task's first metric (0/1 each) against
    the task's ``chance`` (``run_chance``); not evidence, saying why, when there are no scores, they are not 0/1, or
    the chance is not known."""
    scores = np.asarray(scores, dtype=float)
    if not len(scores):
        return FullCacheEvidence(False, "no full-cache row to compare with chance")
    if not np.isin(scores, (0.0, 1.0)).all():
        return FullCacheEvidence(False, "the full cache's scores are not 0/1, so no exact test against chance")
    successes, n = int(scores.sum()), len(scores)
    if chance is None:
        return FullCacheEvidence(
            False, f"full cache {successes}/{n}; the task's chance is not known", None, successes, n
        )
    p_value = above_chance_p_value(successes, n, chance)
    above = p_value < (1 - evidence.confidence) / 2
    reason = f"full cache {successes}/{n} against chance {chance:.3g}, one-sided exact binomial p = {p_value:.3f}" + (
        " (above chance)" if above else f", not below {(1 - evidence.confidence) / 2:g}"
    )
    return FullCacheEvidence(above, reason, chance, successes, n, p_value)


def _policy_order(policy: str) -> int:
    """Registration order; presses after every registered policy."""
    names = KV_POLICIES.names()
    return names.index(policy) if policy in names else len(names)


def _accuracy_numbers(table: pd.DataFrame) -> dict:
    """summary.json's numbers: each (policy, budget)'s accuracy with its interval."""
    return {
        "accuracy": {
            f"{row.policy}@{_size(row)}": [row.accuracy, row.accuracy_low, row.accuracy_high]
            for row in table.itertuples()
        }
    }


def _size(row, ratio_word: str = "r") -> str:
    """A row's size: its budget, or ``<ratio_word><ratio>`` for a press at a compression ratio (summary.json's
    ``r0.5``; summary.md's ``ratio 0.5``)."""
    ratio = getattr(row, "ratio", np.nan)
    return f"{row.budget:g}" if pd.isna(ratio) else f"{ratio_word}{ratio:g}"


def kv_table(table: pd.DataFrame, others: dict[str, str]) -> Table:
    """One row per (budget, policy) of ``table.csv``, as summary.md shows it; ``others``: the task's metrics after
    the first (column -> label), e.g. NIAH's ROUGE-L."""
    rows = []
    for row in table.itertuples():
        moved = f"{row.moved_mb_per_step:.3f} ({row.moved_new_mb_per_step:.3f})" if row.offloaded_mb else "0"
        rows.append(
            [
                _size(row, "ratio "),
                row.policy,
                int(row.samples),
                f"{row.accuracy:.3f} [{row.accuracy_low:.2f}, {row.accuracy_high:.2f}]"
                + (" *" if row.pareto_front and getattr(row, "full_cache_evidence", True) else ""),
                *(f"{getattr(row, name):.3f}" for name in others),
                "–" if np.isnan(row.kv_heads) else f"{row.kv_heads:.1f}",
                f"{row.shortfall:.1f}",
                f"{row.kv_fraction:.3f}",
                f"{row.kv_mb:.2f}",
                f"{row.offloaded_mb:.2f}",
                moved,
            ]
        )
    return Table(
        [
            "budget",
            "policy",
            "samples",
            "accuracy [95 % CI]",
            *others.values(),
            "KV heads",
            "shortfall",
            "resident",
            "resident MB",
            "offloaded MB",
            "moved MB/step (re-used)",
        ],
        rows,
    )


def probe_precision_recall(records: list[dict], manifest: dict) -> dict | None:
    """Micro precision / recall over heads and steps of predictors of "head in D_{t+1}" on the ``full`` records.

    Predictors: the probe on h_t above its threshold, the probe's top-k at each budget, the probe on h_t for the
    same step's D_t (what it was trained on), and the previous step's D_t (WakeKV's kind of predictor).
    """
    full = [r for r in records if r["policy"] == "full" and "probe_scores" in r]
    if not full:
        return None
    threshold = manifest["probe_threshold"]
    width = len(full[0]["probe_scores"][0])

    def targets(steps: list[list[int]]) -> np.ndarray:
        out = np.zeros((len(steps), width), dtype=bool)
        for i, heads in enumerate(steps):
            out[i, heads] = True
        return out

    scores = np.concatenate([np.asarray(r["probe_scores"][:-1]) for r in full if len(r["dynamic"]) > 1])
    now = np.concatenate([targets(r["dynamic"][:-1]) for r in full if len(r["dynamic"]) > 1])
    following = np.concatenate([targets(r["dynamic"][1:]) for r in full if len(r["dynamic"]) > 1])
    predictors = {f"probe(h_t) > {threshold:.3f}": scores > threshold, "previous D_t (D_t itself)": now}
    for budget, k in manifest["heads_per_budget"].items():
        top = np.argsort(-scores, axis=1, kind="stable")[:, :k]
        chosen = np.zeros_like(now)
        np.put_along_axis(chosen, top, True, axis=1)
        predictors[f"probe(h_t) top-{k} (budget {float(budget):g})"] = chosen
    rows = {name: _pr(pred, following) for name, pred in predictors.items()}
    rows[f"same step: probe(h_t) > {threshold:.3f} vs D_t"] = _pr(scores > threshold, now)
    return {
        "samples": len(full),
        "step_pairs": int(len(scores)),
        "positive_rate": float(following.mean()),
        "predictors": rows,
    }


def _pr(predicted: np.ndarray, actual: np.ndarray) -> dict:
    hits = float((predicted & actual).sum())
    return {
        "precision": hits / max(float(predicted.sum()), 1.0),
        "recall": hits / max(float(actual.sum()), 1.0),
        "predicted_per_step": float(predicted.sum(1).mean()),
    }


def pr_blocks(pr: dict) -> list[Block]:
    """``probe_precision_recall``'s result as a sentence and a table (probe_pr.md, and the end of summary.md)."""
    rows = [
        [name, f"{row['precision']:.3f}", f"{row['recall']:.3f}", f"{row['predicted_per_step']:.1f}"]
        for name, row in pr["predictors"].items()
    ]
    return [
        f"Predicting the heads active (Eq. 1) at step t+1 from step t, on the full-KV decoding of "
        f"{pr['samples']} samples ({pr['step_pairs']} step pairs; {pr['positive_rate']:.4f} of head-steps "
        "positive), micro over heads and steps:",
        Table(["predictor", "precision", "recall", "heads per step"], rows),
    ]


def is_kvpress_own(policy: str) -> bool:
    """Whether a table row is one of kvpress's own presses (not a press dynheads builds, nor a retention policy)."""
    return policy.startswith(KVPRESS) and KVPRESS_PRESSES.get(parse_press(policy).name).is_kvpress_method


def press_comparison(frame: pd.DataFrame, evidence: EvidenceSettings) -> pd.DataFrame | None:
    """presses.csv: at each size (budget or ratio) where both ran, every press dynheads builds against the best of
    kvpress's own presses at that size (highest mean accuracy; the first listed on a tie, ``best_kvpress_ties``
    counting the presses tied there), paired over the samples both finished: the mean difference with its interval
    (bounded by -1 and 1). None without both kinds."""
    presses = frame[frame["policy"].str.startswith(KVPRESS)]
    rows = []
    for budget, at_size in presses.groupby("budget", sort=True):
        own = at_size[at_size["policy"].map(is_kvpress_own)]
        built = at_size[~at_size["policy"].map(is_kvpress_own)]
        if own.empty or built.empty:
            continue
        means = own.groupby("policy", sort=False)["accuracy"].mean()
        best, ties = str(means.idxmax()), int((means == means.max()).sum())
        control = own[own["policy"] == best].set_index("grid_sample_id")["accuracy"]
        for policy, treated_rows in built.groupby("policy", sort=False):
            treated = treated_rows.set_index("grid_sample_id")["accuracy"]
            shared = treated.index.intersection(control.index)
            diff = paired_difference(
                treated[shared].to_numpy(), control[shared].to_numpy(), evidence, bounds=(-1.0, 1.0)
            )
            ratio = treated_rows["ratio"].iloc[0] if "ratio" in treated_rows else np.nan
            rows.append(
                {
                    "budget": budget,
                    "ratio": ratio,
                    "press": policy,
                    "best_kvpress": best,
                    "best_kvpress_ties": ties,
                    "samples": diff.n,
                    "press_accuracy": float(treated[shared].mean()),
                    "best_kvpress_accuracy": float(control[shared].mean()),
                    "difference": diff.effect,
                    "difference_low": diff.low,
                    "difference_high": diff.high,
                }
            )
    return pd.DataFrame(rows) if rows else None


def press_blocks(versus: pd.DataFrame, track: str) -> list[Block]:
    """presses.csv as summary.md shows it, under the run's leaderboard track."""
    rows = [
        [
            _size(row, "ratio "),
            row.press,
            row.best_kvpress + (f" (first of {row.best_kvpress_ties} tied)" if row.best_kvpress_ties > 1 else ""),
            int(row.samples),
            f"{row.press_accuracy:.3f}",
            f"{row.best_kvpress_accuracy:.3f}",
            f"{row.difference:+.3f} [{row.difference_low:+.3f}, {row.difference_high:+.3f}]",
        ]
        for row in versus.itertuples()
    ]
    return [
        f"Against the best of kvpress's own presses in this run ({track} track: {TRACKS.get(track, track)}), at "
        "each size: every press dynheads builds minus the kvpress press with the highest accuracy there, paired over "
        "the same samples (95 % interval; the best is picked on these samples, which favours it).",
        Table(
            ["size", "press", "best kvpress press", "samples", "press", "best kvpress", "difference [95 % CI]"], rows
        ),
    ]
