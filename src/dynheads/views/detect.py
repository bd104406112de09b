"""``dynheads detect``: hallucination detection from a traced run, evaluated by grouped cross-validation.

For every feature set (``dynheads.analysis.hallucination``) a logistic regression (standardised inputs) is
fitted and evaluated by K-fold cross-validation whose groups are questions (a teacher-forced HaluEval run: both
answers of a question sit on one side of every split) or samples (NIAH: tokens of one answer never straddle a
split), repeated over ``repeats`` seeds. Static heads (when not given) are ranked on each training fold only.
Two levels: **token** (every labelled token) and, for runs of teacher-forced responses, **response** (the
features averaged over the response, Lookback Lens's span protocol). Writes into ``out``:

- ``manifest.json``: config, source run, the folds of every repeat (test groups), static heads, counts;
- ``labels.csv``: every labelled token (sample, group, step, token, label, fold of the first repeat);
- ``results.md`` / ``results.csv`` / ``results.json``: per level and feature set the out-of-fold AUROC and AUPRC
  of the first repeat with 95 % bootstrap intervals over groups, the mean and s.d. of the per-fold AUROC over
  every fold and repeat, and the range of the out-of-fold AUROC over repeats; feature sets that read the needle
  positions apart from the rest (``ANSWER_KEY``: an upper bound on NIAH, where the needle is the answer);
- ``roc.png``; ``detector.json``: detectors fitted on every sample (plain numbers, no pickle), for
  ``apply_detector``.

The detector itself (fitting, saving, applying, cross-validating) is analysis of finished traces:
``dynheads.analysis.detector``; this runner reads the traced run, checks the sources and writes the tables.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from dynheads.analysis import hallucination as hl
from dynheads.analysis.detector import (
    REFERENCE,
    Detector,
    Featuriser,
    LabelledSample,
    Level,
    cross_validate,
    fit_detectors,
    length_strata_rows,
    training_feature_spec,
)
from dynheads.analysis.settings import ANSWER_KEY, FEATURE_SETS
from dynheads.errors import DynheadsError
from dynheads.outputs import Outputs, Written, write_outputs
from dynheads.plots.roc import plot_roc
from dynheads.resources import (
    HEAD_PREDICTOR,
    STATIC_HEADS,
    Evaluated,
    fit_record,
    refuse_other_model,
    sample_identity,
)
from dynheads.runs import RunDir
from dynheads.settings import DetectConfig
from dynheads.tables import Block, Heading, Items, Summary, Table

# Published numbers of other detectors, on other tasks (docs/hallucination.md says how they differ).
PUBLISHED = (
    ("Lookback Lens, annotated spans (summarisation / QA)", "AUROC 85.3 / 82.0"),
    ("Lookback Lens, 8-token sliding windows (summarisation / QA)", "AUROC 66.1 / 66.0"),
    ("ReDeEP (RAGTruth)", "AUC 0.75"),
)
HEADLINE_TITLE = "No answer key (deployable)"
UPPER_TITLE = "Upper bound: uses the needle positions (on NIAH the gold answer; never a headline number)"


SpanFinder = Callable[[str, dict], "tuple[int, int] | None"]  # (generated text, record) -> value span


def uuid_span(text: str, record: dict) -> tuple[int, int] | None:
    """NIAH: the first UUID-shaped string of the generated text."""
    return hl.find_value(text)


def labelled_samples(run: RunDir, span_finder: SpanFinder = uuid_span) -> tuple[list[LabelledSample], int]:
    """Label every finished sample that has a trace; also return how many had no value.

    A record with ``response_label`` (a teacher-forced response) labels all its steps with it; otherwise the
    record's ``answer`` labels the value span that ``span_finder`` locates in the generated text (NIAH: a UUID).
    """
    samples, no_value = [], 0
    for record, trace in run.iter_traces():
        group = str(record.get("question_id") or record["sample_id"])
        if "response_label" in record:
            label = int(record["response_label"])
            if trace.num_steps:
                samples.append(
                    LabelledSample(
                        record["sample_id"],
                        trace,
                        np.arange(trace.num_steps),
                        np.full(trace.num_steps, label, np.int64),
                        group,
                        label,
                    )
                )
            continue
        if "answer" not in record:
            raise DynheadsError(f"sample {record.get('sample_id')!r} of {run.path} has no 'answer' to label against")
        span = span_finder("".join(trace.token_texts), record)
        labels = hl.label_tokens(trace.token_texts, str(record["answer"]), span)
        steps = np.flatnonzero(labels != hl.UNLABELLED)
        if steps.size == 0:
            no_value += 1
            continue
        samples.append(LabelledSample(record["sample_id"], trace, steps, labels[steps].astype(np.int64), group))
    if not samples:
        raise DynheadsError(f"{run.path} has no sample with a labelled answer value")
    return samples, no_value


def match_lengths(samples: Sequence[LabelledSample]) -> list[LabelledSample]:
    """Every teacher-forced response cut to the first m steps, m = the shortest response of its question."""
    if any(s.response_label is None for s in samples):
        raise DynheadsError("--match-length applies to runs of teacher-forced responses (e.g. --data halueval:qa)")
    shortest: dict[str, int] = {}
    for s in samples:
        shortest[s.group] = min(shortest.get(s.group, len(s.steps)), len(s.steps))
    return [
        LabelledSample(
            s.sample_id, s.trace, s.steps[: shortest[s.group]], s.labels[: shortest[s.group]], s.group, s.response_label
        )
        for s in samples
    ]


# ---- evaluation ------------------------------------------------------------------------------------------------------


def refuse_probe_overlap(probe: str, records: Sequence[dict], groups: Sequence[str], model: dict | None = None) -> dict:
    """Refuse a head predictor fitted on any question (or, for NIAH-like records, any seed or needle value) that
    this detection evaluates (``resources.fit_record``, the check of every run that reads one), or trained on a run
    of another model than ``model``. Returns what the manifest records."""
    record = fit_record(probe, HEAD_PREDICTOR, _evaluated(records, groups, "refuse"))
    refuse_other_model(probe, HEAD_PREDICTOR, model)
    return record


def refuse_static_overlap(static: str, records: Sequence[dict], groups: Sequence[str], model: dict | None) -> dict:
    """Refuse a ``--static`` list scored on what this detection evaluates (its run's questions, or NIAH seeds and
    needle values) or on a run of another model; a list with no run beside it is recorded as unchecked. Returns
    what the manifest records."""
    record = fit_record(static, STATIC_HEADS, _evaluated(records, groups, "record"))
    refuse_other_model(static, STATIC_HEADS, model)
    return record


def _evaluated(records: Sequence[dict], groups: Sequence[str], unknown_fit: Literal["record", "refuse"]) -> Evaluated:
    """What this detection evaluates, as the overlap checks read it."""
    if records and all("seed" in r and "answer" in r for r in records):
        # NIAH: sample ids repeat across seed streams (split-length-depth-run); seeds and needle values do not
        identities = tuple(sample_identity(r["sample_id"], r["seed"], r["answer"]) for r in records)
        return Evaluated("this detection", samples=identities, unknown_fit=unknown_fit)
    return Evaluated("this detection", questions=tuple(groups))


def run_detect(
    run_dir: str | Path, config: DetectConfig, out: str | Path | None = None, span_finder: SpanFinder = uuid_span
) -> pd.DataFrame:
    """Label, featurise, cross-validate every feature set by group; fit the saved detector on every sample."""
    source = RunDir(run_dir)
    source_manifest = source.manifest()  # refuses a folder that is not a run
    out_run = RunDir(out if out is not None else source.path / "detect")
    _refuse_bad_config(config, out_run)
    samples, no_value = labelled_samples(source, span_finder)
    if config.match_length:
        samples = match_lengths(samples)
    all_labels = _both_classes(samples)
    groups = sorted({s.group for s in samples})
    records = [r for r in source.records() if r["sample_id"] in {s.sample_id for s in samples}]
    model = source_manifest.get("model")
    probe_check = refuse_probe_overlap(config.probe, records, groups, model) if config.probe else None
    static_check = refuse_static_overlap(config.static, records, groups, model) if config.static else None
    response_prefix = int(source_manifest.get("response_prefix", 0))
    featurise = Featuriser(samples, config.probe)
    levels: list[Level] = ["token"]
    if all(s.response_label is not None for s in samples):
        levels.insert(0, "response")
    full_spec = training_feature_spec(config, samples, response_prefix)
    evaluated = _evaluate_levels(samples, config, levels, featurise, full_spec)
    skipped, folds = evaluated.skipped, evaluated.folds
    counts = _class_counts(samples, all_labels, levels)
    out_run.restart(  # detect recomputes everything: a rerun replaces its own outputs
        "detect",
        config,
        None,
        {
            "source_run": str(source.path),
            "source_kind": source_manifest.get("kind"),
            "data": source_manifest.get("data"),
            "question_stream": source_manifest.get("questions"),
            "response_prefix": response_prefix,
            "cross_validation": {
                "unit": "question" if any(s.group != s.sample_id for s in samples) else "sample",
                "folds": config.folds,
                "repeats": folds,
            },
            "static_heads": {
                "source": config.static or "Eq. 1 frequency on each training fold (saved detector: on all samples)",
                "top": [list(h) for h in full_spec.static_heads[: config.static_k]],
            },
            "probe_overlap_check": probe_check,
            "static_overlap_check": static_check,
            "levels": levels,
            "class_counts": counts,
            "samples_without_value": no_value,
            "skipped_feature_sets": skipped,
        },
    )
    prompts = [sample.trace.prompt_digest() for sample in samples]
    fitted = Detector(
        full_spec,
        config.probe,
        evaluated.models["token"],
        evaluated.models.get("response"),
        frozenset(p for p in prompts if p is not None) if all(p is not None for p in prompts) else None,
        model,
    )
    outputs = Outputs().add("labels.csv", _labels(samples, folds[0]["test_groups"]))
    outputs.add("detector.json", Written(fitted.save))
    results = _results(config, evaluated, counts, title=f"{levels[0]}s, {len(groups)} groups")
    write_outputs(out_run.path, outputs.extend(results))
    return results.files["results.csv"]


def _refuse_bad_config(config: DetectConfig, out_run: RunDir) -> None:
    """One line for an output folder of another run kind, an unknown feature set or fewer than one repeat."""
    out_run.refuse_other_kind("detect")  # before the work: restart refuses it again, after it
    unknown = sorted(set(config.feature_sets) - set(FEATURE_SETS))
    if unknown:
        raise DynheadsError(f"unknown feature set(s) {', '.join(unknown)}: choose from {', '.join(FEATURE_SETS)}")
    if config.repeats < 1:
        raise DynheadsError(f"repeats must be at least 1, got {config.repeats}")


def _both_classes(samples: Sequence[LabelledSample]) -> np.ndarray:
    """Every token label of ``samples``; refused when they hold one class only (nothing to detect)."""
    all_labels = np.concatenate([s.labels for s in samples])
    if len(np.unique(all_labels)) < 2:
        raise DynheadsError(
            f"the samples hold only {'hallucinated' if all_labels[0] else 'faithful'} tokens: "
            "use a harder setting (e.g. --distractor-depth) or more samples"
        )
    return all_labels


def _class_counts(samples: Sequence[LabelledSample], all_labels: np.ndarray, levels: Sequence[Level]) -> dict:
    """Samples, groups and the tokens (and, at the response level, the responses) of each class."""
    counts = {
        "samples": len(samples),
        "groups": len({s.group for s in samples}),
        "faithful_tokens": int((all_labels == 0).sum()),
        "hallucinated_tokens": int((all_labels == 1).sum()),
    }
    if "response" in levels:
        counts["hallucinated_responses"] = sum(s.response_label == 1 for s in samples)
        counts["faithful_responses"] = sum(s.response_label == 0 for s in samples)
    return counts


def _results(config: DetectConfig, evaluated: Evaluation, counts: dict, title: str) -> Outputs:
    """``roc.png`` (titled by what its curves count), ``results.csv``, ``responses.csv`` (with responses),
    ``results.json`` and ``results.md``."""
    rows, skipped = evaluated.rows, evaluated.skipped
    table = pd.DataFrame(rows)
    curves = {(f"{n} (upper bound)" if n in ANSWER_KEY else n): c for n, c in evaluated.curves.items()}
    outputs = Outputs().add(
        "roc.png", Written(partial(plot_roc, curves, title=f"out-of-fold {title}, {config.folds} folds"))
    )
    outputs.add("results.csv", table)
    if evaluated.responses is not None:
        outputs.add("responses.csv", evaluated.responses)
    outputs.add(
        "results.json",
        {"class_counts": counts, "results": rows, "length_strata": evaluated.strata, "skipped": skipped},
    )
    return outputs.add("results.md", results_summary(table, counts, skipped, config, evaluated.strata))


@dataclass
class Evaluation:
    """Every level's cross-validated rows, the first level's ROC curves, the folds, the response level's rows by
    length stratum, the skipped feature sets, the detectors fitted on every sample, per level, and the response
    level's out-of-fold scores (first repeat; None without responses)."""

    rows: list[dict]
    curves: dict
    folds: list[dict]
    strata: list[dict]
    skipped: dict[str, list[str]]
    models: dict[str, dict[str, dict]]
    responses: pd.DataFrame | None = None


def _evaluate_levels(
    samples: Sequence[LabelledSample],
    config: DetectConfig,
    levels: Sequence[Level],
    featurise: Featuriser,
    full_spec: hl.FeatureSpec,
) -> Evaluation:
    """Cross-validate every available feature set at every level and fit the saved detectors on every sample."""
    evaluation = Evaluation([], {}, [], [], {}, {})
    for level in levels:
        available = [featurise(i, full_spec, level) for i in range(len(samples))]
        names = [n for n in config.feature_sets if all(n in f for f in available)]
        evaluation.skipped[level] = sorted(set(config.feature_sets) - set(names))
        measured = cross_validate(samples, config, level, names, featurise, full_spec.response_prefix)
        evaluation.rows += measured.rows
        evaluation.folds = evaluation.folds or measured.folds  # they depend on the groups and seeds only
        if level == levels[0]:
            evaluation.curves = measured.curves
        if level == "response":  # the answers read whole, sorted by how much longer the hallucinated one is
            evaluation.strata = length_strata_rows(measured, np.array([len(s.steps) for s in samples]), config)
            evaluation.responses = _response_scores(samples, measured.labels, measured.scores)
        evaluation.models[level] = fit_detectors(
            {n: np.vstack([f[n] for f in available]) for n in names}, measured.labels, config.regularisation
        )
    return evaluation


def _response_scores(
    samples: Sequence[LabelledSample], labels: np.ndarray, scores: dict[str, np.ndarray]
) -> pd.DataFrame:
    """responses.csv: one row per response (a sample), its question, its label (1 = hallucinated) and each feature
    set's out-of-fold score of the first repeat, the scores every response-level number is computed from: two runs
    on the same questions (e.g. the two context boundaries) can be compared pairwise from these files."""
    ids = {"sample_id": [s.sample_id for s in samples], "group": [s.group for s in samples]}
    return pd.DataFrame({**ids, "hallucinated": labels.astype(int), **scores})


def _labels(samples: Sequence[LabelledSample], test_groups: list[list[str]]) -> pd.DataFrame:
    """labels.csv: one row per labelled step, with its sample's cross-validation fold."""
    fold_of = {group: fold for fold, members in enumerate(test_groups) for group in members}
    rows = [
        {
            "sample_id": s.sample_id,
            "group": s.group,
            "fold": fold_of[s.group],
            "step": int(step),
            "token": s.trace.token_texts[step],
            "label": int(label),
        }
        for s in samples
        for step, label in zip(s.steps, s.labels, strict=True)
    ]
    return pd.DataFrame(rows)


def _interval(value: float, low: float, high: float) -> str:
    return "n/a" if math.isnan(value) else f"{value:.3f} [{low:.3f}, {high:.3f}]"


def results_table(table: pd.DataFrame) -> Table:
    """One row per feature set: AUROC [CI], (responses) the within-question win rate [CI], fold mean ± s.d., repeat
    range, paired difference to the lookback ratio [CI], AUPRC [CI]."""
    records = table.to_dict("records")
    paired = any(row["paired_questions"] for row in records)
    rows = [
        [
            row["feature_set"],
            int(row["features"]),
            _interval(row["auroc"], row["auroc_low"], row["auroc_high"]),
            *([_interval(row["paired_win"], row["paired_win_low"], row["paired_win_high"])] if paired else []),
            f"{row['fold_auroc_mean']:.3f} ± {row['fold_auroc_sd']:.3f}",
            f"{row['repeat_auroc_min']:.3f} to {row['repeat_auroc_max']:.3f}",
            "(reference)"
            if row["feature_set"] == REFERENCE
            else _interval(row["delta_lookback"], row["delta_lookback_low"], row["delta_lookback_high"]),
            _interval(row["auprc"], row["auprc_low"], row["auprc_high"]),
        ]
        for row in records
    ]
    return Table(
        [
            "feature set",
            "features",
            "AUROC [95% CI]",
            *(["within-question win [95% CI]"] if paired else []),
            "fold AUROC mean ± s.d.",
            "AUROC over repeats",
            "Δ AUROC vs lookback [95% CI]",
            "AUPRC [95% CI]",
        ],
        rows,
    )


def strata_table(strata: Sequence[dict]) -> Table:
    """Within-question win rate [CI] (n questions) per feature set (rows) and length stratum (columns)."""
    names = list(dict.fromkeys(row["feature_set"] for row in strata))
    columns = list(dict.fromkeys(row["stratum"] for row in strata))
    cell = {(row["feature_set"], row["stratum"]): row for row in strata}

    def text(row: dict) -> str:
        if not row["n"]:
            return "— (n=0)"
        if math.isnan(row["low"]):  # one question: a win rate, no interval
            return f"{row['effect']:.3f} (n={row['n']}, no interval)"
        return f"{_interval(row['effect'], row['low'], row['high'])} (n={row['n']})"

    return Table(
        ["feature set", *columns],
        [[name, *(text(cell[name, stratum]) for stratum in columns)] for name in names],
    )


def _win_protocol(config: DetectConfig) -> str:
    """How the within-question win rate of responses is measured (said only where there are responses)."""
    return (
        " Within-question win (responses): the share of questions whose hallucinated answer scores above its right "
        "one (ties count one half; the paired AUROC), 95% bootstrap interval over questions "
        f"({config.bootstrap} resamples), answers read whole"
        + (" (here cut to the shorter one's tokens: --match-length)" if config.match_length else "")
        + "."
    )


def results_summary(
    table: pd.DataFrame, counts: dict, skipped: dict, config: DetectConfig, strata: Sequence[dict] = ()
) -> Summary:
    """results.md as data: per level, the deployable and upper-bound tables, then the counts and the protocol;
    its numbers are the class counts, per level and feature set the AUROC with its interval, and per feature set the
    responses' within-question win rate with its interval."""
    blocks: list[Block] = []
    for level in dict.fromkeys(table["level"]):
        part = table[table["level"] == level]
        blocks.append(
            Heading(
                "Responses (features averaged over the response, Lookback Lens's span protocol)"
                if level == "response"
                else "Tokens (every labelled token)"
            )
        )
        for title, section in ((HEADLINE_TITLE, "deployable"), (UPPER_TITLE, "upper_bound")):
            rows = part[part["section"] == section]
            if len(rows):
                blocks += [Heading(title, 3), results_table(rows)]
        if level == "response" and strata:
            blocks += [
                Heading("Within-question win rate by answer length (hallucinated / right tokens)", 3),
                strata_table(strata),
            ]
        if skipped.get(level):
            blocks.append(f"skipped (not in every trace, or no probe given): {', '.join(skipped[level])}")
    unit = "questions" if counts["groups"] < counts["samples"] else "samples"
    grouped = f" in {counts['groups']} questions" if unit == "questions" else " (each its own group)"
    blocks.append(
        f"{counts['samples']} samples{grouped}; {counts['faithful_tokens']} faithful / "
        f"{counts['hallucinated_tokens']} hallucinated tokens"
        + (
            f"; {counts['faithful_responses']} faithful / {counts['hallucinated_responses']} hallucinated responses"
            if "faithful_responses" in counts
            else ""
        )
        + "."
    )
    blocks.append(
        f"AUROC: out-of-fold scores of the first of {config.repeats} repeats of {config.folds}-fold "
        f"cross-validation grouped by {unit[:-1]}, 95% bootstrap interval over {unit} "
        f"({config.bootstrap} resamples); fold mean ± s.d. over all {config.folds * config.repeats} folds; "
        "range of the out-of-fold AUROC over the repeats; Δ: AUROC minus the lookback ratio's on the same "
        "out-of-fold units, paired bootstrap over the same groups."
        + (_win_protocol(config) if "faithful_responses" in counts else "")
    )
    blocks += [
        "published detectors, on other tasks and models (not comparable one to one):",
        Items([f"{name}: {value}" for name, value in PUBLISHED]),
    ]
    auroc = {
        f"{row['level']}/{row['feature_set']}": [row["auroc"], row["auroc_low"], row["auroc_high"]]
        for row in table.to_dict("records")
    }
    paired = {
        row["feature_set"]: [row["paired_win"], row["paired_win_low"], row["paired_win_high"]]
        for row in table.to_dict("records")
        if row["paired_questions"]
    }
    return Summary(blocks, {"class_counts": counts, "auroc": auroc, "paired_win": paired})
