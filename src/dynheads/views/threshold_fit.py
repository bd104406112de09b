"""The threshold a run's dynamic sets are decided with: a fixed rule as given, a ``calibrated:M`` rule fitted on a
fitting stream (``dynheads.thresholds.fit_relative``) and applied as its ``relative:K`` (an absolute value for a
score that is no attention share), or a ``null:Q`` rule fitted on a traced decoy run (``tasks.decoy``: the same
prompts scored at a needle-free span) so that the decoy spans mark Q heads per step on average.

A decoy fitting run must share no sample seed with the evaluated run (fit on the static split); a calibrated rule
refuses a decoy run and a null rule anything else.

The fitting stream is a traced run on other questions than the evaluated run's (in ``reproduce``: the static
reasoning heads' stream, which nothing evaluates). Both runs' manifests must record their questions; any shared
question is refused, and so is a fitting run whose manifest records none (disjointness cannot be checked). The
fit (rule, fitted value, fitting run, its questions and samples, the mean set size it gives there) is what every
analysis that applies it records in its output.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from dynheads.errors import DynheadsError
from dynheads.resources import Evaluated
from dynheads.runs import RunDir
from dynheads.scores import HEAD_SCORES, ScoreKind, ScoreSpec
from dynheads.tasks.decoy import is_decoy
from dynheads.tasks.questions import refuse_overlap
from dynheads.thresholds import FITTED, ReasoningThreshold, fit_absolute, fit_relative


@dataclass(frozen=True)
class ThresholdFit:
    """A threshold rule and what it resolved to: ``applied`` decides D_t (``relative:K`` for a calibrated rule)."""

    rule: str  # as given: "calibrated:12", or a fixed rule ("relative:3", "0.1")
    applied: str  # the threshold D_t is decided with
    fit_run: str | None = None  # the fitting run (a calibrated rule only)
    fit_questions: list[str] = field(default_factory=list)  # its questions (manifest ids)
    fit_samples: list[str] = field(default_factory=list)  # its traced samples the fit read
    fit_steps: int = 0
    fit_mean_size: float | None = None  # mean |D_t| the applied threshold gives on the fitting run

    def to_dict(self) -> dict:
        return asdict(self)

    def describe(self) -> str:
        """One sentence for summaries."""
        if self.fit_run is None:
            return f"threshold {self.applied} (fixed, nothing fitted)"
        if self.rule.startswith("null"):
            return (
                f"threshold {self.applied}, fitted by the rule {self.rule} on the decoy run {self.fit_run} "
                f"({len(self.fit_samples)} samples, {self.fit_steps} steps: decoy spans mark "
                f"{self.fit_mean_size:.2f} heads per step there), disjoint from the evaluated samples"
            )
        return (
            f"threshold {self.applied}, fitted by the rule {self.rule} on the fitting stream {self.fit_run} "
            f"({len(self.fit_samples)} samples of {len(self.fit_questions)} questions, {self.fit_steps} steps, "
            f"mean |D_t| there {self.fit_mean_size:.2f}), disjoint from the evaluated questions"
        )


def fit_lines(manifest: dict) -> list[str]:
    """A summary's sentence on the threshold a run fitted (its manifest's ``threshold_fit``), or none."""
    fit = manifest.get("threshold_fit")
    return [f"D_t's {ThresholdFit(**fit).describe()} (the manifest's threshold_fit)."] if fit else []


def question_ids(run: RunDir) -> list[str] | None:
    """The question ids a run's manifest records (``questions.ids``), or None when it records none."""
    questions = run.manifest().get("questions")
    return list(questions["ids"]) if questions and questions.get("ids") else None


def resolve_threshold(
    rule: str | float, score: ScoreKind, evaluated_run: str | Path, fit_run: str | Path | None = None
) -> ThresholdFit:
    """The threshold ``evaluated_run``'s sets are decided with: a fixed rule (or a binary score) as it is; a
    calibrated one fitted on ``fit_run``'s traces of ``score``, refused when the two runs share a question."""
    parsed = ReasoningThreshold.parse(rule)
    if parsed.mode in FITTED and fit_run is not None:
        fit, evaluated = RunDir(fit_run), RunDir(evaluated_run)
        if fit.path.resolve() == evaluated.path.resolve():
            raise DynheadsError(f"the fitting run is the evaluated run ({fit.path}): fit on a disjoint stream")
        fitted_on = f"the {parsed.mode} threshold's fitting stream {fit.path}"
        if parsed.mode == "null":  # needle tasks record no questions: their samples are seeded, one seed each
            refuse_overlap(_seeds(fit), fitted_on, _seeds(evaluated), str(evaluated.path))
        else:
            evaluated_ids = question_ids(evaluated) or [r["sample_id"] for r in evaluated.records()]
            fit_ids = question_ids(fit) or []  # none recorded: fit_threshold refuses it
            refuse_overlap(fit_ids, fitted_on, evaluated_ids, str(evaluated.path))
    return fit_threshold(parsed, score, fit_run)


def fit_for_evaluation(rule: str, score: ScoreKind, fit_run: str | Path, evaluated: Evaluated) -> ThresholdFit:
    """``rule`` fitted on ``fit_run`` for a run that generates its own samples (an ablation's grid), refused where
    the fitting run shares a sample seed or needle value (a seeded task such as NIAH) or a question with them."""
    fit = fit_threshold(rule, score, fit_run)
    if fit.fit_run is None:  # a fixed rule, or a binary score: nothing was fitted
        return fit
    run = RunDir(fit_run)
    fitted_on = f"the {ReasoningThreshold.parse(rule).mode} threshold's fitting run {run.path}"
    if evaluated.samples:
        seeds, answers = set(_seeds(run)), {record.get("answer") for record in run.records()} - {None, ""}
        shared = [s["sample_id"] for s in evaluated.samples if str(s["seed"]) in seeds or s["answer"] in answers]
        if shared:
            raise DynheadsError(
                f"{fitted_on} shares the seed or needle value of {len(shared)} of the samples {evaluated.run} "
                f"evaluates (e.g. {shared[0]}): fit on another seed stream (e.g. --split static)"
            )
    else:
        refuse_overlap(fit.fit_questions, fitted_on, evaluated.questions, evaluated.run)
    return fit


def _seeds(run: RunDir) -> list[str]:
    """The seeds of a run's samples, as text (a decoy run's are its base samples')."""
    return [str(record.get("seed")) for record in run.records() if record.get("seed") is not None]


def fit_threshold(rule: str | float | ReasoningThreshold, score: ScoreKind, fit_run: str | Path | None) -> ThresholdFit:
    """``rule`` fitted on every traced step of ``fit_run`` (a fixed rule, or any rule of a binary score, as it is).
    Checks only that the fitting run records its questions: the caller refuses overlap with what it evaluates
    (``resolve_threshold``, or an ablation that refuses a static list taken from the same fitting run)."""
    parsed = ReasoningThreshold.parse(rule)
    if parsed.mode not in FITTED or HEAD_SCORES.get(score).binary:
        return ThresholdFit(str(parsed), str(parsed))
    if fit_run is None:
        raise DynheadsError(f"the threshold {parsed} is fitted on a fitting stream: give its traced run (--fit-run)")
    fit = RunDir(fit_run)
    decoy = is_decoy(str(fit.manifest().get("kind", "")))
    if decoy != (parsed.mode == "null"):
        raise DynheadsError(
            f"{fit.path} is {'a' if decoy else 'no'} decoy run: null:Q is fitted on a traced decoy task "
            "(dynheads trace --task niah_decoy), calibrated:M on a run of the evaluated task"
        )
    if decoy:
        return fit_calibrated(parsed, score, fit, [])
    fit_ids = question_ids(fit)
    if fit_ids is None:
        raise DynheadsError(
            f"{fit.path}'s manifest records no questions, so its disjointness from the evaluated run cannot be "
            "checked: fit on a traced question stream"
        )
    return fit_calibrated(parsed, score, fit, fit_ids)


def fit_calibrated(rule: ReasoningThreshold, score: ScoreKind, fit: RunDir, fit_ids: list[str]) -> ThresholdFit:
    """Fit ``rule`` (calibrated) on every traced step of ``fit``: a multiple of chance for an attention share, an
    absolute value for any other score (``fit_absolute``)."""
    spec = ScoreSpec(score, threshold=str(rule))
    samples, scores, chances = [], [], []
    for record, trace in fit.iter_traces():
        if trace.chance is None and spec.score.share:
            raise DynheadsError(f"{fit.path} has traces without the chance share: re-trace it to fit {rule}")
        samples.append(record["sample_id"])
        scores.append(spec.trace_scores(trace.scores))
        # a score that is no attention share is fitted and applied as an absolute value: it reads no chance share
        chances.append(trace.chance if trace.chance is not None else np.zeros(len(trace.tokens), np.float32))
    if not samples:
        raise DynheadsError(f"{fit.path} has no traced samples to fit {rule} on")
    # read back from its text, so that what is recorded is exactly what any run applying it decides with
    if spec.score.share:
        fitted = ReasoningThreshold("relative", fit_relative(scores, chances, rule.value))
    else:
        fitted = ReasoningThreshold("absolute", fit_absolute(scores, rule.value))
    applied = ReasoningThreshold.parse(str(fitted))
    sizes = np.concatenate([applied.active(s, c).sum(axis=(1, 2)) for s, c in zip(scores, chances, strict=True)])
    return ThresholdFit(
        rule=str(rule),
        applied=str(applied),
        fit_run=str(fit.path),
        fit_questions=sorted(fit_ids),
        fit_samples=samples,
        fit_steps=int(sizes.size),
        fit_mean_size=float(sizes.mean()) if sizes.size else float("nan"),
    )
