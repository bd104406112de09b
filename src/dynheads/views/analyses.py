"""Analyses of a finished run directory: dynamism (Claim 1), Figure 1, temporal-offset CCA and the MLP probe (Claim 3).

Every function reads the traces of ``run_dir`` and writes its files into ``out_dir`` (default: the run directory,
``RUN_DIR/plots`` for figures, ``RUN_DIR/probe`` for the probe). ``score`` names the head score
(``dynheads.scores.HEAD_SCORES``): ``"copy"`` (Eq. 1, binary; NIAH), ``"reasoning"`` (Eq. 2, continuous; HotpotQA)
or any other registered one; dynamism turns a continuous score into sets with ``score > threshold``.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial
from pathlib import Path

import numpy as np
import pandas as pd
from tqdm.auto import tqdm

from dynheads.analysis.cca import cca_offsets, cca_outputs, empty_note, samples_from_traces, split_record
from dynheads.analysis.dynamism import (
    DEFAULT_KS,
    DynamismStats,
    chance_blocks,
    dynamism_csv,
    dynamism_stats,
    per_sample_dynamism,
    set_overlap,
    table1,
    table5,
)
from dynheads.analysis.headlists import load_head_list, scored_heads
from dynheads.analysis.settings import CCAConfig
from dynheads.errors import DynheadsError
from dynheads.outputs import Outputs, Written, write_outputs
from dynheads.paper import ENTROPY_BASELINE, PAPER_DYNAMISM, PAPER_MODEL, PAPER_TOP1
from dynheads.plots.cca import plot_cca
from dynheads.plots.heads import plot_head_dynamics
from dynheads.runs import RunDir, file_stem
from dynheads.scores import DEFAULT_REASONING_THRESHOLD, HEAD_SCORES, ScoreKind, ScoreSpec, check_kind, score_values
from dynheads.tables import Heading, Summary
from dynheads.thresholds import ReasoningThreshold
from dynheads.traces import Trace
from dynheads.views.threshold_fit import ThresholdFit, resolve_threshold


def load_run(run_dir: str | Path) -> tuple[RunDir, list[Trace]]:
    """The run and the traces of its finished samples; refuses a folder that is not a run or has no trace."""
    run = RunDir(run_dir)
    run.manifest()  # raises if this is not a run directory
    traces = [
        trace
        for _, trace in tqdm(
            run.iter_traces(), total=len(run.records()), desc="load traces", unit="sample", leave=False
        )
    ]
    if not traces:
        raise DynheadsError(f"{run.path} has no traced samples yet: run (or resume) the command that fills it")
    return run, traces


def model_name(run: RunDir) -> str:
    """The model's name from the manifest, or the run folder's name when the manifest records no model."""
    model = run.manifest().get("model")
    return model["name"] if model else run.path.name


def check_score(score: str) -> ScoreKind:
    return check_kind(score)


def score_array(trace: Trace, score: ScoreKind) -> np.ndarray:
    """``[step, layer, head]``: the trace's ``score`` by name (bool for a binary score, float for a continuous one)."""
    return score_values(trace.scores, score)


def dynamic_sets(trace: Trace, score: ScoreKind, threshold: str | float | ReasoningThreshold) -> np.ndarray:
    """D_t for every step, bool ``[step, layer, head]``: a binary score 1, or a continuous score above ``threshold``
    (absolute, or a multiple of the step's chance share: ``dynheads.thresholds``)."""
    return ScoreSpec(check_score(score), str(threshold)).active(trace.scores, trace.chance)


def _beside_blocks(overlap: dict, first: str, second: str) -> list:
    """The section that sets this score's per-step sets (A) beside a second score's (B) on the same steps."""
    return [
        Heading("Beside a second score's sets"),
        f"A: {first}; B: {second}; {overlap['steps']} steps. Mean |A| {overlap['mean_size_first']:.2f}, mean |B| "
        f"{overlap['mean_size_second']:.2f}; |A ∩ B| / |A| {overlap['first_in_second']:.3f} (steps with A), "
        f"|A ∩ B| / |B| {overlap['second_in_first']:.3f} (steps with B); Jaccard {overlap['jaccard']:.3f} (steps with "
        f"either); {overlap['first_only_steps']} steps have A and no B, {overlap['second_only_steps']} B and no A.",
    ]


# ---- Claim 1: dynamism (Table 1, Table 5) ---------------------------------------------------------------------
def fitted_run(
    run_dir: str | Path, score: ScoreKind, threshold: str | float, fit_run: str | Path | None
) -> tuple[RunDir, list[Trace], ThresholdFit, ScoreSpec]:
    """The run, its traces, the threshold its sets are decided with and the score spec that applies it: a fixed
    ``threshold`` as it is, a ``calibrated:M`` one fitted on ``fit_run`` (``threshold_fit``; refused before any
    trace loads when the two runs share a question)."""
    fit = resolve_threshold(threshold, check_score(score), run_dir, fit_run)
    run, traces = load_run(run_dir)
    return run, traces, fit, ScoreSpec(score, fit.applied)


def dynamism_report(
    run_dir: str | Path,
    static_file: str | Path,
    *,
    score: ScoreKind = "copy",
    threshold: str | float = DEFAULT_REASONING_THRESHOLD,
    ks: Sequence[int] = DEFAULT_KS,
    out_dir: str | Path | None = None,
    static_kind: ScoreKind | None = None,
    fit_run: str | Path | None = None,
    beside: ScoreKind | None = None,
) -> DynamismStats:
    """Table 1 / Table 5 statistics of the run against the static list; writes dynamism.md, .csv and .json.

    The run's row sits beside the paper's five rows. ``threshold``: a continuous score's (``fitted_run``).
    ``static_kind``: which static list ``static_file`` is (``copy``: Wu et al.'s retrieval heads; ``reasoning``:
    mean Eq. 2), recorded for the verdict's card; default: the same kind as ``score``. ``beside``: a second score
    (at its default threshold: Eq. 1's copy sets, say) whose per-step sets are set beside these (``set_overlap``).
    """
    run, traces, fit, spec = fitted_run(run_dir, score, threshold, fit_run)
    ranking = scored_heads(load_head_list(static_file, *traces[0].shape))  # never zero-score filler
    if not ranking:
        raise DynheadsError(f"{static_file} scores no head above 0: no static list to compare with")
    sets = [dynamic_sets(trace, score, fit.applied) for trace in traces]
    stats = dynamism_stats(sets, ranking, ks=ks)
    rows = {f"{model_name(run)} (ours)": stats.to_dict(), **{f"{k} (paper)": v for k, v in PAPER_DYNAMISM.items()}}
    out = Path(out_dir) if out_dir else run.path
    setting = spec.describe() if spec.score.binary else f"{spec.describe()} ({fit.describe()})"
    skipped = {"empty_samples_skipped": stats.empty_samples}
    # what Claim 1's verdict is decided from (the summary's numbers), and the step view's threshold
    evidence = {
        "threshold": None if spec.score.binary else fit.applied,
        "threshold_fit": None if spec.score.binary else fit.to_dict(),
        "static_kind": static_kind or score,
        "per_sample": per_sample_dynamism(sets, ranking),
    }
    second = None if beside is None else ScoreSpec(beside)  # at its default threshold
    overlap = None if second is None else set_overlap(sets, [second.active(t.scores, t.chance) for t in traces])
    summary = Summary(
        [
            f"Dynamic sets: {setting}; static list ({static_kind or score}): {static_file}.\n"
            + _dynamism_note(stats, len(ranking), ks),
            *chance_blocks(stats),
            Heading("Table 1"),
            table1(rows),
            Heading("Table 5"),
            table5(rows, ks),
            *([] if second is None or overlap is None else _beside_blocks(overlap, spec.describe(), second.describe())),
        ],
        {"stats": stats.to_dict(), **skipped, **evidence},
        f"Dynamism of {run.path}",
    )
    outputs = Outputs().add("dynamism.md", summary).add("dynamism.csv", dynamism_csv(rows))
    outputs.add(
        "dynamism.json",
        {
            "run": str(run.path),
            "static_file": str(static_file),
            "score": score,
            "threshold": evidence["threshold"],
            "threshold_fit": evidence["threshold_fit"],
            "ks": list(ks),
            **skipped,
            "static_kind": evidence["static_kind"],
            "stats": stats.to_dict(),
            "beside": None if overlap is None else {"score": beside, **overlap},
            "per_sample": evidence["per_sample"],
            "paper": PAPER_DYNAMISM,
        },
    )
    write_outputs(out, outputs)
    return stats


def _dynamism_note(stats: DynamismStats, scored: int, ks: Sequence[int]) -> str:
    """What the dynamism tables count (samples, steps, pairs; ``scored`` heads of the static list) and the bounds
    they are read against (the entropy baseline, the Jaccard ceiling, containment, size-matched Jaccard)."""
    skipped = {"empty_samples_skipped": stats.empty_samples}
    return (
        (f"{empty_note(skipped)}\n" if stats.empty_samples else "")
        + f"{stats.num_samples} samples, {stats.num_steps} steps ({stats.empty_steps} with no active head); "
        f"{stats.adjacent_pairs} adjacent pairs averaged, {stats.adjacent_skipped} skipped (both empty). "
        f"Entropy baseline ln 20 = {ENTROPY_BASELINE:.4f}. Static list: {scored} scored heads"
        + (f" (Table 5 shows n/a for k > {scored}: no zero-score filler)" if scored < max(ks) else "")
        + ". Jaccard w/ static top-20 is at most |D_t|/20: "
        + f"its ceiling here is {stats.jaccard_ceiling_k20:.4f}; "
        f"containment |D_t ∩ S_20|/|D_t| = {stats.containment_k20:.4f}, size-matched Jaccard J(D_t, S_|D_t|) = "
        f"{stats.matched_jaccard:.4f}."
    )


# ---- Figure 1 ----------------------------------------------------------------------------------------------------
def plot_heads(
    run_dir: str | Path,
    sample_ids: Sequence[str] | None = None,
    *,
    score: ScoreKind = "copy",
    top: int = 10,
    out_dir: str | Path | None = None,
) -> list[Path]:
    """Figure 1 for each sample (all samples with generated tokens when ``sample_ids`` is None).

    Writes ``heads-<sample_id>.png`` per sample (``runs.file_stem`` of the id) and returns the paths.
    """
    run = RunDir(run_dir)
    run.manifest()  # raises if this is not a run directory
    if sample_ids:
        chosen = [(sample_id, run.load_trace(sample_id)) for sample_id in sample_ids]
        empty = [sample_id for sample_id, trace in chosen if not trace.num_steps]
        if empty:
            raise DynheadsError(f"sample(s) {', '.join(empty)} generated no token (EOS first): nothing to plot")
    else:
        chosen = [(record["sample_id"], trace) for record, trace in run.iter_traces() if trace.num_steps]
    if not chosen:
        raise DynheadsError(f"{run.path} has no traced sample with generated tokens: nothing to plot")
    out, name = Path(out_dir) if out_dir else run.path / "plots", model_name(run)
    label = HEAD_SCORES.get(check_kind(score)).label  # what the colour bar names ("write score", not "retrieval")
    figures = Outputs()
    for sample_id, trace in chosen:
        title = f"{name}: {sample_id} ({score} score, top-{top} most varying heads)"
        drawn = partial(
            plot_head_dynamics, score_array(trace, score), trace.token_texts, top=top, title=title, scale_label=label
        )
        figures.add(f"heads-{file_stem(sample_id)}.png", Written(drawn))
    write_outputs(out, figures)
    return [out / name for name in figures.files]


# ---- Claim 3: temporal-offset CCA --------------------------------------------------------------------------------
def cca_report(
    run_dir: str | Path,
    offsets: Sequence[int] = tuple(range(11)),
    config: CCAConfig | None = None,
    *,
    score: ScoreKind = "copy",
    out_dir: str | Path | None = None,
) -> pd.DataFrame:
    """CCA between hidden states and the head scores ``k`` steps later; writes cca.csv/.json/.md and cca.png."""
    run, traces = load_run(run_dir)
    config = config or CCAConfig()
    samples = samples_from_traces(traces, check_score(score))  # leaves out traces with no generated token
    table = cca_offsets(samples, offsets, config)
    traced = [record["sample_id"] for record in run.records() if run.trace_path(record["sample_id"]).is_file()]
    ids = [sample_id for sample_id, trace in zip(traced, traces, strict=True) if trace.num_steps]  # = samples
    out, name = Path(out_dir) if out_dir else run.path, model_name(run)
    counts = {"samples": len(samples), "empty_samples_skipped": len(traces) - len(samples)}
    figure = partial(
        plot_cca,
        table,
        title=f"{name}: {len(samples)} samples, {score} score",
        paper=PAPER_TOP1[PAPER_MODEL],
        paper_label=f"paper top-1 ({PAPER_MODEL})",
    )
    splits = split_record(ids, config)
    outputs = cca_outputs(table, config=config, model=name, counts=counts, splits=splits).add(
        "cca.png", Written(figure)
    )
    write_outputs(out, outputs)
    return table
