"""The stages of ``dynheads reproduce``, registered by name. A stage's name is its sub-folder of the study and its
key in ``stages.json``: ``reproduce`` writes under these names and the report reads them, so both import them from
here.

A stage that a verdict rests on names its ``evidence``: the document of its folder's ``summary.json``
(``dynheads.tables``) whose ``numbers`` hold what the verdict is decided from (per-sample values, intervals,
counts). The stage writes those numbers once, when it summarises its results; the report reads them and never
recomputes them from the stage's private files (docs/formats.md, "summary.json").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Stage:
    """``name``: folder and ``stages.json`` key; ``evidence``: the markdown name of its summary document whose
    numbers a verdict reads (None: no verdict reads this stage's numbers)."""

    name: str
    evidence: str | None = None


STAGES: dict[str, Stage] = {}


def register(name: str, evidence: str | None = None) -> str:
    """Add a stage (once per name); returns its name, which is what folders and logs are keyed by."""
    if name in STAGES:
        raise ValueError(f"stage {name!r} is registered twice")
    STAGES[name] = Stage(name, evidence)
    return name


def evidence_of(name: str) -> str:
    """The summary document a verdict reads from stage ``name``."""
    evidence = STAGES[name].evidence
    if evidence is None:
        raise ValueError(f"stage {name!r} publishes no numbers for a verdict")
    return evidence


# NIAH (Section 3): the traced grid, static copy heads, then Claims 1-3.
NIAH = register("niah")
STATIC = register("static")
DYNAMISM = register("dynamism", evidence="dynamism.md")
ABLATION = register("ablation", evidence="summary.md")
PROGRESSIVE = register("progressive")
CCA = register("cca", evidence="cca.md")
PROBE = register("probe", evidence="metrics.md")
# HotpotQA (Section 4): static reasoning heads, the traced grid, then Claims 1-3 on Eq. 2 scores.
HOTPOTQA_STATIC = register("hotpotqa-static")
HOTPOTQA = register("hotpotqa")
HOTPOTQA_DYNAMISM = register("hotpotqa-dynamism", evidence="dynamism.md")
HOTPOTQA_CCA = register("hotpotqa-cca", evidence="cca.md")
HOTPOTQA_PROBE = register("hotpotqa-probe", evidence="metrics.md")
HOTPOTQA_ABLATION = register("hotpotqa-ablation", evidence="summary.md")
HOTPOTQA_PROGRESSIVE = register("hotpotqa-progressive")
# Dynamic RAG (Section 5).
RAG = register("rag", evidence="rag.md")
