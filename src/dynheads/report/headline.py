"""The report's first screen: one card per verdict with its figure and the few numbers behind it, beside the paper.

A card shows the verdict (claim, task, status), the one figure that shows the claim (the stage's own PNG; for RAG
a bar chart of F1 per strategy drawn here into ``DIR/report-figures/``), and two to four rows "what | ours |
paper". The full sentence with every number and the rule stays in the claim's section below the cards.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from dynheads.io import atomic_path
from dynheads.paper import (
    PAPER_ABLATION,
    PAPER_DYNAMISM,
    PAPER_MODEL,
    PAPER_PROBE_BINARY,
    PAPER_PROBE_CONTINUOUS,
    PAPER_TABLE4,
    PAPER_TOP1,
)
from dynheads.report import claims
from dynheads.report.claims import Verdict
from dynheads.tasks.niah import NIAH

NOT_STATED = "not stated"
MAX_ROWS = 4  # rows of a card (more when a verdict tests more effects)


@dataclass(frozen=True)
class Headline:
    """One card: ``figure`` is a PNG file (None: ``missing`` says why); ``rows`` are (what, ours, paper)."""

    anchor: str
    verdict: Verdict
    figure: Path | None
    rows: list[tuple[str, str, str]]
    missing: str = ""
    no_numbers: str = ""  # why ``rows`` is empty: a verdict left without numbers (a task the model does not solve)


def headline(
    anchor: str,
    verdict: Verdict,
    root: Path,
    metric: str = "accuracy",
    *,
    paper_task: str | None = None,
    figure: tuple[str, tuple[str, ...]] = ("", ()),
) -> Headline:
    """The card of the verdict found in section ``anchor``; ``metric`` is Claim 2's decisive metric;
    ``paper_task``: the label of the paper's task whose numbers the card shows (default: the verdict's task);
    ``figure``: the stage folder and file patterns of its figure (the first pattern that matches, first match in
    name order; RAG draws its own). A claim without rows of its own here shows its tested effects."""
    numbers = verdict.numbers
    paper = paper_task or verdict.task
    if verdict.claim == claims.CLAIM1:
        rows = _dynamism_rows(numbers, paper)
    elif verdict.claim == claims.CLAIM2:
        rows = _operating_rows(verdict) if "dynamic_drop" in numbers else _ablation_rows(numbers, metric, paper)
    elif verdict.claim == claims.CLAIM3:
        rows = _correlation_rows(numbers, paper)
    elif verdict.claim == claims.RAG:
        rows = _rag_rows(numbers)
    else:
        rows = []
    # the tested effects first, each with n, its 95 % interval and the rule it is held to; then the numbers behind
    # them, up to four rows in all so that every card fits the first screen (the section below has them all)
    effects = [
        (f"{effect.name} ({effect.rule})", effect.interval.text(), _effect_paper(effect.name, paper))
        for effect in verdict.effects
    ]
    rows = effects + rows[: max(MAX_ROWS - len(effects), 1)]
    rows, no_numbers = ([], f"no numbers: {verdict.reason}") if verdict.unsolved else (rows, "")
    if verdict.claim == claims.RAG:
        drawn = _rag_figure(numbers, root / "report-figures" / "rag-f1.png")
        missing = "" if drawn else "no figure: " + ("see below" if verdict.unsolved else "no RAG results")
        return Headline(anchor, verdict, drawn, rows, missing, no_numbers)
    stage, patterns = figure
    if not stage or not (root / stage).is_dir():
        return Headline(anchor, verdict, None, rows, f"no figure: stage {stage or anchor} not run", no_numbers)
    found = next((hits for pattern in patterns if (hits := sorted((root / stage).glob(pattern)))), [])
    missing = "" if found else f"no {' or '.join(patterns)} in {stage}/"
    return Headline(anchor, verdict, found[0] if found else None, rows, missing, no_numbers)


def _fmt(value: float | None, spec: str = ".3f") -> str:
    return "–" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, spec)


def _span(values: list[float], spec: str) -> str:
    return f"{format(min(values), spec)}–{format(max(values), spec)}"


def _paper_dynamism(key: str, spec: str, task: str) -> str:
    return _span([row[key] for row in PAPER_DYNAMISM.values()], spec) if task == NIAH.label else NOT_STATED


def _effect_paper(name: str, task: str) -> str:
    """The paper's value beside a tested effect, where it states one (Table 1's entropy)."""
    return _paper_dynamism("entropy", ".2f", task) if name.startswith("entropy") else NOT_STATED


def _dynamism_rows(numbers: Mapping[str, float | None], task: str) -> list[tuple[str, str, str]]:
    """Beside the tested effects (entropy is one of them): Table 1's top-20 Jaccard with its ceiling, unique heads."""
    ceiling = numbers.get("jaccard_ceiling_k20")
    return [
        (
            f"Jaccard w/ static top-20 (ceiling |D_t|/20 = {_fmt(ceiling, '.2f')}; decides nothing)",
            _fmt(numbers.get("jaccard_static_k20"), ".2f"),
            _paper_dynamism("jaccard_static_k20", ".2f", task),
        ),
        ("unique heads", _fmt(numbers.get("unique_heads"), ".0f"), _paper_dynamism("unique_heads", ".0f", task)),
    ]


def _ablation_rows(numbers: Mapping[str, float | None], metric: str, task: str) -> list[tuple[str, str, str]]:
    paper = PAPER_ABLATION.get(task, {})
    rows = [(f"{metric}, nothing masked", _fmt(numbers.get("none")), NOT_STATED)] if "none" in numbers else []
    return rows + [
        (f"{metric}, {name} heads masked", _fmt(numbers.get(name)), paper.get(name, NOT_STATED))
        for name in ("dynamic", "static", "random")
    ]


def _operating_rows(verdict: Verdict) -> list[tuple[str, str, str]]:
    """Claim 2 at f = 1 (exactly D_t): dynamic - static's reading beside the decided effects, each arm's drop on the
    deciding samples and over all steps of all samples, the overlaps with D_t, and the paper's mean-matched
    controls; the dose and compensation figures have every fraction, with intervals."""
    numbers, arms = verdict.numbers, claims.OPERATING_POINT_ARMS
    reading = verdict.contrasts.get("dynamic - static", "–")
    rows = [
        (
            f"dynamic - static (beside; static holds {_fmt(numbers.get('overlap_static'), '.2f')} of D_t)",
            f"{_fmt(numbers.get('gap_static'), '.3f')}: {reading}",
            NOT_STATED,
        ),
        (
            f"drop at f = 1, non-empty steps of {_fmt(numbers.get('samples_decided'), '.0f')} correct answers: "
            + " / ".join(arms),
            " / ".join(_fmt(numbers.get(f"{arm}_drop"), ".2f") for arm in arms),
            NOT_STATED,
        ),
        (
            f"drop at f = 1, all steps of all {_fmt(numbers.get('samples'), '.0f')} samples: " + " / ".join(arms),
            " / ".join(_fmt(numbers.get(f"{arm}_drop_all"), ".2f") for arm in arms),
            NOT_STATED,
        ),
    ]
    mean_arms = [arm for arm in claims.MEAN_ARMS if f"{arm}_drop" in numbers]
    if mean_arms:
        rows.append(
            (
                "drop, the paper's controls at the mean |D_t|: " + " / ".join(mean_arms),
                " / ".join(_fmt(numbers.get(f"{arm}_drop"), ".2f") for arm in mean_arms),
                NOT_STATED,
            )
        )
    return rows


def _correlation_rows(numbers: Mapping[str, float | None], task: str) -> list[tuple[str, str, str]]:
    metric = "auprc" if "probe_auprc" in numbers else "r2"
    paper_probe = PAPER_PROBE_BINARY if metric == "auprc" else PAPER_PROBE_CONTINUOUS
    in_sample = PAPER_TOP1.get(PAPER_MODEL, {}).get(claims.CCA_OFFSET)
    k = claims.CCA_OFFSET
    return [
        (
            f"CCA top-1 at k={k}, held-out",
            _fmt(numbers.get(f"cca_held_out_k{k}")),
            f"{in_sample:.3f} (in-sample)" if in_sample is not None and task == NIAH.label else NOT_STATED,
        ),
        (f"CCA top-1 at k={k}, shuffled pairs", _fmt(numbers.get(f"cca_shuffled_k{k}")), NOT_STATED),
        (
            f"probe {metric.upper()} / frequency baseline",
            f"{_fmt(numbers.get(f'probe_{metric}'))} / {_fmt(numbers.get(f'baseline_{metric}'))}",
            _span([row[metric] for row in paper_probe.values()], ".2f"),
        ),
    ]


def _rag_rows(numbers: Mapping[str, float | None]) -> list[tuple[str, str, str]]:
    paper = PAPER_TABLE4[PAPER_MODEL]
    rows = []
    for key in sorted(numbers, key=lambda name: (int(name.rsplit("_k", 1)[1]), name)):
        strategy, k = key.rsplit("_k", 1)
        shown = f"{paper[strategy][1]:.3f}" if k == "5" and strategy in paper else NOT_STATED
        rows.append((f"F1, {strategy.capitalize()} (k={k})", _fmt(numbers[key]), shown))
    return rows[:4]


def _rag_figure(numbers: Mapping[str, float | None], path: Path) -> Path | None:
    """Bars: F1 of Dynamic and Static per k (ours), with the paper's k=5 values (llama3.1-8b) beside them."""
    ours = {key: value for key, value in numbers.items() if value is not None and not math.isnan(value)}
    if not ours:
        return None
    from matplotlib.figure import Figure  # only when a RAG stage exists: matplotlib is slow to import

    labels = sorted(ours, key=lambda name: (int(name.rsplit("_k", 1)[1]), name))
    paper = PAPER_TABLE4[PAPER_MODEL]
    figure = Figure(figsize=(4.2, 2.4))
    axes = figure.add_subplot()
    colors = ["#1d3f8f" if name.startswith("dynamic") else "#9aa6bf" for name in labels]
    axes.bar(range(len(labels)), [ours[name] for name in labels], color=colors, label="ours")
    paper_values = [paper[name.rsplit("_k", 1)[0]][1] if name.endswith("_k5") else math.nan for name in labels]
    axes.scatter(
        range(len(labels)),
        paper_values,
        marker="_",
        s=400,
        color="#c0392b",
        zorder=3,
        label=f"paper ({PAPER_MODEL}, k=5)",
    )
    axes.set_xticks(range(len(labels)), [name.replace("_k", "\nk=") for name in labels], fontsize=8)
    axes.set_ylabel("F1")
    axes.set_ylim(0, max(1e-3, *ours.values(), *(v for v in paper_values if not math.isnan(v))) * 1.15)
    axes.legend(fontsize=7, loc="upper right")
    axes.set_title("Dynamic RAG: F1 by strategy", fontsize=9)
    figure.tight_layout()
    with atomic_path(path) as tmp:
        figure.savefig(tmp, format="png", dpi=110)
    return path
