"""Verdicts on the paper's three claims (and the RAG comparison) from one model's numbers, by explicit rules.

Every rule is a threshold on numbers the pipeline writes; docs/report.md lists them. A verdict is
``supported``, ``not supported`` or ``inconclusive`` (when a number it needs is missing or cannot decide),
always with the numbers it used.

- Claim 1 (dynamism): supported iff Jaccard(D_t, static top-20) < 0.5, unique heads > 20 and
  entropy > ln 20 (the entropy of uniform use of 20 heads).
- Claim 2 (irreplaceability): supported iff masking the dynamic heads lowers the task metric more than
  masking as many static heads and as many random heads, each by at least 0.1. Inconclusive when the
  un-ablated model scores below 0.1 (no masking can then cost 0.1), and when a control (static or random)
  masked no head at all on more samples than the dynamic run did: those samples are the un-ablated run, so
  their score says nothing about the control (this happens with the ``mean`` matching count; with ``per_step``
  matching a control masks nothing on exactly the samples where the dynamic run masks nothing, because both
  runs equal the un-ablated one until the first non-empty D_t). Means are over all samples (zero-masked ones
  counted, the same samples for every strategy); the verdict states the matching mode, the heads masked per
  step and the zero-masked samples of each strategy.
- Claim 3 (correlation): supported iff the held-out CCA top-1 correlation at offset k=1 exceeds the
  shuffled-pairing control by at least 0.1 and the MLP probe beats the frequency baseline (AUPRC for binary
  copy scores, R² for continuous reasoning scores). Not supported as soon as one available test fails;
  inconclusive when all available tests pass but one is missing.
- RAG: supported iff the Dynamic strategy's F1 is above the Static strategy's at every k run.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import pandas as pd

from dynheads.paper import ENTROPY_BASELINE
from dynheads.tasks.registry import HOTPOTQA

Status = Literal["supported", "not supported", "inconclusive"]

JACCARD_MAX = 0.5
UNIQUE_MIN = 20
ABLATION_MARGIN = 0.1
CCA_MARGIN = 0.1
CCA_OFFSET = 1
CLAIM1, CLAIM2, CLAIM3 = "Claim 1 (dynamism)", "Claim 2 (irreplaceability)", "Claim 3 (correlation)"
RAG = "Dynamic RAG (dynamic beats static)"
RULES = (f"Claim 1: Jaccard w/ static top-20 < {JACCARD_MAX}, unique heads > {UNIQUE_MIN} and entropy > ln 20; "
         f"Claim 2: masking the dynamic heads costs at least {ABLATION_MARGIN} more than masking as many static "
         f"heads, and as many random heads (inconclusive when a control masked no head on more samples than "
         f"dynamic); Claim 3: held-out CCA top-1 at k={CCA_OFFSET} at least {CCA_MARGIN} "
         "above the shuffled control, and the probe beats the frequency baseline; RAG: Dynamic F1 above Static at "
         "every k")


@dataclass(frozen=True)
class Verdict:
    """One claim's verdict on one task, with the numbers that decided it."""

    claim: str  # e.g. "Claim 1 (dynamism)"
    task: str  # e.g. "NIAH"
    status: Status
    reason: str
    numbers: dict[str, float | None] = field(default_factory=dict)

    def sentence(self) -> str:
        status = self.status if self.status != "inconclusive" else f"inconclusive ({self.reason})"
        detail = f" {self.reason}" if self.status != "inconclusive" else ""
        return f"{self.claim}, {self.task}: {status}.{detail}"


def _at_least(value: float, margin: float) -> bool:
    """``value >= margin``, forgiving float rounding (0.3 - 0.2 counts as 0.1)."""
    return value >= margin - 1e-9


def _missing(value: float | None) -> bool:
    return value is None or (isinstance(value, float) and math.isnan(value))


def dynamism_verdict(stats: Mapping[str, float] | None, task: str) -> Verdict:
    """Claim 1 from ``DynamismStats.to_dict()`` (keys jaccard_static_k20, unique_heads, entropy)."""
    claim = CLAIM1
    keys = ("jaccard_static_k20", "unique_heads", "entropy")
    if stats is None:
        return Verdict(claim, task, "inconclusive", "no dynamism statistics")
    numbers = {key: stats.get(key) for key in keys}
    absent = [key for key, value in numbers.items() if _missing(value)]
    if absent:
        return Verdict(claim, task, "inconclusive", f"{', '.join(absent)} not available", numbers)
    jaccard, unique, entropy = (float(numbers[key]) for key in keys)
    checks = [
        (jaccard < JACCARD_MAX, f"Jaccard w/ static top-20 {jaccard:.4f} {'<' if jaccard < JACCARD_MAX else '>='} "
                                f"{JACCARD_MAX}"),
        (unique > UNIQUE_MIN, f"unique heads {unique:.0f} {'>' if unique > UNIQUE_MIN else '<='} {UNIQUE_MIN}"),
        (entropy > ENTROPY_BASELINE, f"entropy {entropy:.4f} {'>' if entropy > ENTROPY_BASELINE else '<='} "
                                     f"ln 20 = {ENTROPY_BASELINE:.4f}"),
    ]
    status: Status = "supported" if all(ok for ok, _ in checks) else "not supported"
    return Verdict(claim, task, status, "; ".join(text for _, text in checks) + ".", numbers)


@dataclass(frozen=True)
class AblationMasking:
    """What the ablation grid masked: the matching mode, and per strategy the heads masked per step (mean over
    samples) and the samples that masked no head at any step."""

    matching: str
    masked: dict[str, float]
    zero_masked: dict[str, int]
    samples: dict[str, int]

    def describe(self) -> str:
        parts = [f"{name} {self.masked[name]:.2f} heads/step, {self.zero_masked[name]}/{self.samples[name]} "
                 "samples masked none" for name in ("dynamic", "static", "random") if name in self.masked]
        return f"{self.matching} matching; " + "; ".join(parts)


def masking_from_cells(cells: pd.DataFrame) -> AblationMasking | None:
    """``AblationMasking`` from an ablation grid's cells.csv; None for a cells.csv written before it had the
    ``matching``, ``mean_masked`` and ``zero_masked`` columns."""
    if not {"matching", "mean_masked", "zero_masked", "samples", "strategy"} <= set(cells.columns):
        return None
    groups = cells.assign(masked_sum=cells["mean_masked"] * cells["samples"]).groupby("strategy")
    samples = groups["samples"].sum()
    return AblationMasking(matching=str(cells["matching"].iloc[0]),
                           masked=(groups["masked_sum"].sum() / samples).astype(float).to_dict(),
                           zero_masked=groups["zero_masked"].sum().astype(int).to_dict(),
                           samples=samples.astype(int).to_dict())


def irreplaceability_verdict(means: Mapping[str, float] | None, metric: str, task: str,
                             masking: AblationMasking | None = None) -> Verdict:
    """Claim 2 from the mean task metric per ablation strategy (``none``, ``dynamic``, ``static``, ``random``).
    ``masking`` (from ``masking_from_cells``) says what was compared; without it the verdict says it is unknown."""
    claim = CLAIM2
    if means is None:
        return Verdict(claim, task, "inconclusive", "no ablation results")
    numbers = {name: float(means[name]) for name in ("none", "dynamic", "static", "random") if name in means}
    absent = [name for name in ("dynamic", "static", "random") if _missing(numbers.get(name))]
    if absent:
        return Verdict(claim, task, "inconclusive", f"no {metric} for strategy {', '.join(absent)}", numbers)
    baseline = numbers.get("none")
    if baseline is not None and baseline < ABLATION_MARGIN:
        return Verdict(claim, task, "inconclusive", f"the un-ablated model's {metric} is {baseline:.3f}, so no "
                       f"masking can lower it by {ABLATION_MARGIN}", numbers)
    dynamic = numbers["dynamic"]
    gaps = {name: numbers[name] - dynamic for name in ("static", "random")}
    passed = {name: _at_least(gap, ABLATION_MARGIN) for name, gap in gaps.items()}
    status: Status = "supported" if all(passed.values()) else "not supported"
    text = "; ".join(f"{name} {numbers[name]:.3f} - dynamic {dynamic:.3f} = {gap:.3f} "
                     f"{'>=' if passed[name] else '<'} {ABLATION_MARGIN}" for name, gap in gaps.items())
    prefix = f"{metric} un-ablated {baseline:.3f}; " if baseline is not None else f"{metric}: "
    numbers = {**numbers, **{f"gap_{k}": v for k, v in gaps.items()}}
    if masking is None:
        return Verdict(claim, task, status, prefix + text + "; matching mode and heads masked per strategy "
                       "unknown (cells.csv without the masked-head columns).", numbers)
    numbers.update({f"masked_{name}": float(value) for name, value in masking.masked.items()})
    numbers.update({f"zero_masked_{name}": float(value) for name, value in masking.zero_masked.items()})
    compared = f" Compared: {masking.describe()}; means over all samples, zero-masked ones counted."
    unmatched = [name for name in ("static", "random")
                 if masking.zero_masked.get(name, 0) > masking.zero_masked.get("dynamic", 0)]
    if unmatched:
        detail = ", ".join(f"{name} on {masking.zero_masked[name]}" for name in unmatched)
        return Verdict(claim, task, "inconclusive", f"the control masked no head on more samples than dynamic "
                       f"({detail}, dynamic on {masking.zero_masked.get('dynamic', 0)}): those samples are the "
                       f"un-ablated run, not a matched control; {prefix}{text}.{compared}", numbers)
    return Verdict(claim, task, status, prefix + text + "." + compared, numbers)


def correlation_verdict(held_out: float | None, shuffled: float | None, probe: float | None,
                        baseline: float | None, probe_metric: str, task: str) -> Verdict:
    """Claim 3 from the CCA top-1 at offset 1 (held-out and shuffled) and a probe metric vs its baseline."""
    claim = CLAIM3
    numbers = {"cca_held_out_k1": held_out, "cca_shuffled_k1": shuffled, f"probe_{probe_metric}": probe,
               f"baseline_{probe_metric}": baseline}
    tests: list[tuple[bool | None, str]] = []
    if _missing(held_out) or _missing(shuffled):
        tests.append((None, f"no held-out/shuffled CCA at k={CCA_OFFSET}"))
    else:
        gap = held_out - shuffled
        ok = _at_least(gap, CCA_MARGIN)
        tests.append((ok, f"CCA top-1 at k={CCA_OFFSET}: held-out {held_out:.3f} - shuffled {shuffled:.3f} = "
                          f"{gap:.3f} {'>=' if ok else '<'} {CCA_MARGIN}"))
    if _missing(probe) or _missing(baseline):
        tests.append((None, "no probe metrics"))
    else:
        tests.append((probe > baseline, f"probe {probe_metric} {probe:.4f} {'>' if probe > baseline else '<='} "
                                        f"frequency baseline {baseline:.4f}"))
    text = "; ".join(message for _, message in tests)
    results = [ok for ok, _ in tests]
    if False in results:
        return Verdict(claim, task, "not supported", text + ".", numbers)
    if None in results:
        return Verdict(claim, task, "inconclusive", text, numbers)
    return Verdict(claim, task, "supported", text + ".", numbers)


def rag_verdict(f1: Mapping[tuple[str, int], float], task: str = HOTPOTQA.label) -> Verdict:
    """Does Dynamic beat Static? ``f1`` maps (strategy, k) to mean F1; compared at every k both strategies ran."""
    claim = RAG
    ks = sorted(k for strategy, k in f1 if strategy == "dynamic" and ("static", k) in f1)
    numbers = {f"{strategy}_k{k}": value for (strategy, k), value in f1.items() if strategy in ("dynamic", "static")}
    if not ks:
        return Verdict(claim, task, "inconclusive", "Dynamic and Static were not both run at one k", numbers)
    wins = {k: f1[("dynamic", k)] > f1[("static", k)] for k in ks}
    text = "; ".join(f"k={k}: F1 dynamic {f1[('dynamic', k)]:.4f} {'>' if wins[k] else '<='} static "
                     f"{f1[('static', k)]:.4f}" for k in ks)
    if all(wins.values()):
        return Verdict(claim, task, "supported", text + ".", numbers)
    if not any(wins.values()):
        return Verdict(claim, task, "not supported", text + ".", numbers)
    return Verdict(claim, task, "inconclusive", f"mixed: {text}", numbers)
