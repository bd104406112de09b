"""Claim 2's doses relative to the model's own dynamic sets (``relative_doses`` in a preset's ablation tables).

A fixed dose list means different things on different models: SmolLM2 copies with about 4 heads per step, so 8
masked heads are twice its D_t; Qwen2.5-Coder-0.5B copies with about 24, so 8 are a third of it, and its dose-response
cannot reach the paper's operating point (the whole D_t removed). A relative dose is a multiple of the mean |D_t|
on a *fitting stream* (the traced run that fitted the static list, which nothing evaluates), rounded to heads per
step (at least 1, at most every head); ``1.0`` is the paper's whole-D_t ablation at the mean set size. The fit
(multiples, the mean, the fitting run, its samples and steps, the doses) is written beside the ablation
(``dose_fit.json``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from dynheads.errors import DynheadsError
from dynheads.experiments.analyses import dynamic_sets, load_run
from dynheads.scores import HEAD_SCORES, ScoreKind


@dataclass(frozen=True)
class DoseFit:
    """Relative doses and the heads per step they resolved to on a fitting stream."""

    multiples: list[float]  # of the mean |D_t| on the fitting stream, as the preset gives them
    doses: list[int]  # heads per step: multiple x mean rounded half up, at least 1, at most every head, distinct
    mean_size: float  # mean |D_t| over the fitting stream's steps
    fit_run: str
    fit_samples: list[str]
    fit_steps: int
    threshold: str | None  # what decided D_t there (a continuous score's applied threshold; None: a binary score)

    def to_dict(self) -> dict:
        return asdict(self)


def fit_doses(
    multiples: Sequence[float], fit_run: str | Path, score: ScoreKind, threshold: str | None = None
) -> DoseFit:
    """Resolve ``multiples`` of the mean |D_t| on ``fit_run``'s traces (D_t by ``score``; ``threshold`` for a
    continuous score) to heads per step; refused when a multiple is not positive or no head is dynamic there."""
    if not multiples or min(multiples) <= 0:
        raise DynheadsError(f"relative doses must be positive multiples of the mean |D_t|, got {list(multiples)}")
    binary = HEAD_SCORES.get(score).binary
    if not binary and threshold is None:
        raise DynheadsError(
            f"the {score} score is continuous: doses relative to its mean |D_t| need the threshold that decides D_t"
        )
    run, traces = load_run(fit_run)
    sizes = [dynamic_sets(trace, score, threshold or 0.0).sum(axis=(1, 2)) for trace in traces]
    steps = np.concatenate(sizes) if sizes else np.zeros(0)
    if not steps.size or not steps.any():
        raise DynheadsError(
            f"no head is dynamic at any step of {run.path} ({steps.size} steps): doses relative to the mean |D_t| "
            "are undefined there; give the ablation fixed doses"
        )
    mean, total = float(steps.mean()), int(np.prod(traces[0].shape))
    doses = sorted({min(total, max(1, math.floor(multiple * mean + 0.5))) for multiple in multiples})  # half up
    return DoseFit(
        multiples=[float(m) for m in multiples],
        doses=doses,
        mean_size=mean,
        fit_run=str(run.path),
        fit_samples=[record["sample_id"] for record in run.records()],
        fit_steps=int(steps.size),
        threshold=threshold,
    )


def relative_doses(settings: dict, fit_run: Path, score: ScoreKind, threshold: str | None = None) -> DoseFit | None:
    """An ablation table's ``relative_doses`` (multiples of the mean |D_t| on ``fit_run``) resolved into its
    ``doses``, in place; None when the table gives fixed doses; refused when it gives both."""
    multiples = settings.pop("relative_doses", None)
    if multiples is None:
        return None
    if settings.get("doses"):
        raise DynheadsError("an ablation table gives both doses and relative_doses: keep one")
    fit = fit_doses(multiples, fit_run, score, threshold)
    settings["doses"] = tuple(fit.doses)
    return fit
