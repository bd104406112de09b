"""The stages of ``dynheads reproduce``, as the registry ``STAGES`` (name -> the stage's sub-folder, with a
one-line help). A stage's name is its sub-folder of the study, its key in ``stages.json`` and its table in a
preset: ``reproduce`` writes under these names (and refuses a preset table or a stage that is not registered),
and the report reads them, so both import them from here.

A stage that a verdict rests on names its evidence (``EVIDENCE``): the document of its folder's ``summary.json``
(``dynheads.tables``) whose ``numbers`` hold what the verdict is decided from (per-sample values, intervals,
counts). The stage writes those numbers once, when it summarises its results; the report reads them and never
recomputes them from the stage's private files (docs/formats.md, "summary.json").
"""

from __future__ import annotations

from dynheads.errors import DynheadsError
from dynheads.registry import Registry

STAGES = Registry[str]("stage")
EVIDENCE: dict[str, str] = {}  # stage -> the markdown name of its summary document whose numbers a verdict reads


def _stage(name: str, help: str, evidence: str | None = None) -> str:
    STAGES.register(name, name, help=help)
    if evidence:
        EVIDENCE[name] = evidence
    return name


def evidence_of(name: str) -> str:
    """The summary document a verdict reads from stage ``name``."""
    if name not in EVIDENCE:
        raise DynheadsError(f"stage {name!r} publishes no numbers for a verdict")
    return EVIDENCE[name]


# NIAH (Section 3): the traced grid, static copy heads, then Claims 1-3.
NIAH = _stage("niah", "the traced NIAH grid: Eq. 1 copy heads of every step (Section 3.1)")
STATIC = _stage("static", "static retrieval (copy) heads scored as Wu et al.")
DYNAMISM = _stage(
    "dynamism", "Claim 1 on NIAH: dynamic heads against the static ones (Table 1, Figure 1)", "dynamism.md"
)
ABLATION = _stage(
    "ablation", "Claim 2 on NIAH: per-step ablation grid of dynamic, static and random heads (Figure 2)", "summary.md"
)
PROGRESSIVE = _stage("progressive", "Claim 2 on NIAH: progressive ablation of the top-k dynamic heads (Figure 3)")
CCA = _stage("cca", "Claim 3 on NIAH: CCA between hidden states and head scores (Figure 4)", "cca.md")
PROBE = _stage("probe", "Claim 3 on NIAH: the MLP head predictor from hidden states", "metrics.md")
# HotpotQA (Section 4): static reasoning heads, the traced grid, then Claims 1-3 on Eq. 2 scores.
HOTPOTQA_STATIC = _stage("hotpotqa-static", "static reasoning heads on HotpotQA (Eq. 2)")
HOTPOTQA = _stage("hotpotqa", "the traced HotpotQA grid: Eq. 2 scores of every step (Section 4)")
HOTPOTQA_DYNAMISM = _stage("hotpotqa-dynamism", "Claim 1 on HotpotQA (Figure 5)", "dynamism.md")
HOTPOTQA_CCA = _stage("hotpotqa-cca", "Claim 3 on HotpotQA: CCA (Figure 8)", "cca.md")
HOTPOTQA_PROBE = _stage("hotpotqa-probe", "Claim 3 on HotpotQA: the MLP head predictor", "metrics.md")
HOTPOTQA_ABLATION = _stage("hotpotqa-ablation", "Claim 2 on HotpotQA: the ablation grid (Figure 6)", "summary.md")
HOTPOTQA_PROGRESSIVE = _stage("hotpotqa-progressive", "Claim 2 on HotpotQA: progressive ablation (Figure 7)")
# Dynamic RAG (Section 5).
RAG = _stage("rag", "Dynamic RAG with head-based in-context retrieval (Table 4)", "rag.md")
