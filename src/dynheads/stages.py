"""The stages of a study (``dynheads reproduce``), one registry ``STAGES``: a name, its ``Stage`` and a one-line help,
in run order. A stage's name is its sub-folder of the study, its key in ``stages.json`` and its table in a preset:
``reproduce`` runs and logs the stages under these names (and refuses a preset table that names none), and the
report reads their folders under them.

An entry says how the study runs the stage (``run``), what a verdict reads of it (``evidence``), which section of
the report shows it (``section``) and which config its preset table builds (``config``: the keys and value types of
a preset file's table are checked when it is read, before any model loads). ``run``, ``section`` and ``config`` are
``"module:attribute"`` strings imported only when used, as ``kv.press_registry``'s presses are: this module sits on
the lowest floor and imports neither experiments nor the report, ``reproduce`` imports only the runners (and the
configs) and the report only its sections (it never imports experiments). Register a stage from anywhere (a test
file, a notebook)::

    STAGES.register("steps", Stage(f"{__name__}:count_steps", section=f"{__name__}:STEPS"), help="steps per sample")

A stage that a verdict rests on names its evidence: the document of its folder's ``summary.json``
(``dynheads.tables``) whose ``numbers`` hold what the verdict is decided from (per-sample values, intervals,
counts). The stage writes those numbers once, when it summarises its results; the report reads them and never
recomputes them from the stage's private files (docs/formats.md, "summary.json").
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

from dynheads.errors import DynheadsError
from dynheads.lazy import imported
from dynheads.registry import Registry


@dataclass(frozen=True)
class Stage:
    """One stage of the study; its folder is its name (``study.folder(name)``, ``root / name`` in the report)."""

    run: str  # "module:function" taking the ``Study`` (dynheads.experiments.reproduce): runs it into its folder
    evidence: str | None = None  # the markdown name of its summary document whose numbers a verdict reads
    preset_table: str | None = None  # the preset table its settings come from; None: the one named as the stage
    deals_samples: bool = False  # its runner gives each process of a launch its share of the samples (run_jobs)
    optional: bool = False  # joins only a study whose preset has its table (KV, re-rank, detection); else: every one
    section: str | None = None  # "module:attribute" of the ``ReportSection`` that shows it, if one does
    config: str | None = None  # "module:Class" of the config its preset table's settings build, if they build one

    def runner(self) -> Any:
        """The function that runs the stage, imported now."""
        return imported(self.run)

    def config_class(self) -> type | None:
        """The config class its preset table builds (imported now), or None."""
        return imported(self.config) if self.config else None

    def report_section(self) -> Any:
        """The ``ReportSection`` that shows the stage (imported now), or None."""
        return imported(self.section) if self.section else None


STAGES = Registry[Stage]("stage")


def study_stages(tables: Collection[str] = ()) -> list[str]:
    """The stages of a study whose preset has the tables ``tables``, in run order: every stage that is not optional,
    and each optional one whose table is among them."""
    return [entry.name for entry in STAGES if not entry.value.optional or entry.name in tables]


def preset_table(name: str) -> str:
    """The preset table stage ``name`` reads (the HotpotQA CCA and probe read the NIAH ones)."""
    return STAGES.get(name).preset_table or name


def evidence_of(name: str) -> str:
    """The summary document a verdict reads from stage ``name``."""
    evidence = STAGES.get(name).evidence if name in STAGES else None
    if evidence is None:
        raise DynheadsError(f"stage {name!r} publishes no numbers for a verdict")
    return evidence


RUNNERS = "dynheads.experiments.paper_stages:"  # the paper's stages run by the functions of this module
SECTIONS = "dynheads.report.sections:"  # and are shown by the sections of this one


def _stage(name: str, help: str, *, run: str, section: str | None = None, **fields: Any) -> str:
    """Register the paper's stage ``name``: ``run`` and ``section`` name attributes of ``RUNNERS`` and ``SECTIONS``."""
    reference = SECTIONS + section if section else None
    STAGES.register(name, Stage(RUNNERS + run, section=reference, **fields), help=help)
    return name


# NIAH (Section 3): the traced grid, static copy heads, then Claims 1-3.
NIAH = _stage(
    "niah",
    "the traced NIAH grid: Eq. 1 copy heads of every step (Section 3.1)",
    run="niah",
    config="dynheads.settings:NiahConfig",
    section="niah_setup",
    deals_samples=True,
)
STATIC = _stage(
    "static",
    "static retrieval (copy) heads scored as Wu et al.",
    run="static",
    config="dynheads.settings:StaticConfig",
    section="static_section",
    deals_samples=True,
)
DYNAMISM = _stage(
    "dynamism",
    "Claim 1 on NIAH: dynamic heads against the static ones (Table 1, Figure 1)",
    run="dynamism",
    section="claim1_niah",
    evidence="dynamism.md",
)
ABLATION = _stage(
    "ablation",
    "Claim 2 on NIAH: per-step ablation grid of dynamic, static and random heads (Figure 2)",
    run="ablation",
    config="dynheads.settings:AblationConfig",
    section="claim2_niah",
    evidence="summary.md",
    deals_samples=True,
)
PROGRESSIVE = _stage(
    "progressive",
    "Claim 2 on NIAH: progressive ablation of the top-k dynamic heads (Figure 3)",
    run="progressive",
    config="dynheads.settings:ProgressiveConfig",
    deals_samples=True,
)
CCA = _stage(
    "cca",
    "Claim 3 on NIAH: CCA between hidden states and head scores (Figure 4)",
    run="cca",
    section="claim3_niah",
    evidence="cca.md",
)
PROBE = _stage(
    "probe",
    "Claim 3 on NIAH: the MLP head predictor from hidden states",
    run="probe",
    config="dynheads.analysis.settings:HeadPredictorConfig",
    evidence="metrics.md",
)
# HotpotQA (Section 4): static reasoning heads, the traced grid, then Claims 1-3 on Eq. 2 scores.
HOTPOTQA_STATIC = _stage(
    "hotpotqa-static",
    "static reasoning heads on HotpotQA (Eq. 2)",
    run="hotpotqa_static",
    config="dynheads.settings:StaticReasoningConfig",
    deals_samples=True,
)
HOTPOTQA = _stage(
    "hotpotqa",
    "the traced HotpotQA grid: Eq. 2 scores of every step (Section 4)",
    run="hotpotqa",
    config="dynheads.settings:HotpotConfig",
    section="qa_setup",
    deals_samples=True,
)
HOTPOTQA_DYNAMISM = _stage(
    "hotpotqa-dynamism",
    "Claim 1 on HotpotQA (Figure 5)",
    run="hotpotqa_dynamism",
    section="claim1_qa",
    evidence="dynamism.md",
)
HOTPOTQA_CCA = _stage(
    "hotpotqa-cca",
    "Claim 3 on HotpotQA: CCA (Figure 8)",
    run="hotpotqa_cca",
    section="claim3_qa",
    evidence="cca.md",
    preset_table=CCA,
)
HOTPOTQA_PROBE = _stage(
    "hotpotqa-probe",
    "HotpotQA: the MLP regressor of the Eq. 2 shares (the paper's Table 3, descriptive; RAG's predictor)",
    run="hotpotqa_probe",
    evidence="metrics.md",
    preset_table=PROBE,
)
# Claims 1 and 3's predictor on HotpotQA: trained on D_t, the Eq. 2 sets at the fitted threshold, as NIAH's is on
# Eq. 1's sets. Trained on Eq. 2's shares themselves, the within-step ranking (Claim 1) and the gap over the
# frequency and step-index profiles (Claim 3) call simulated true studies "not supported" at HotpotQA's short
# answers (report.rules, issue 59's known-truth check).
HOTPOTQA_SET_PROBE = _stage(
    "hotpotqa-set-probe",
    "Claims 1 and 3 on HotpotQA: the MLP head predictor of D_t (Eq. 2 sets)",
    run="hotpotqa_set_probe",
    evidence="metrics.md",
    preset_table=PROBE,
)
HOTPOTQA_ABLATION = _stage(
    "hotpotqa-ablation",
    "Claim 2 on HotpotQA: the ablation grid (Figure 6)",
    run="hotpotqa_ablation",
    config="dynheads.settings:AblationConfig",
    section="claim2_qa",
    evidence="summary.md",
    deals_samples=True,
)
HOTPOTQA_PROGRESSIVE = _stage(
    "hotpotqa-progressive",
    "Claim 2 on HotpotQA: progressive ablation (Figure 7)",
    run="hotpotqa_progressive",
    config="dynheads.settings:ProgressiveConfig",
    deals_samples=True,
)
# Dynamic RAG (Section 5).
RAG = _stage(
    "rag",
    "Dynamic RAG with head-based in-context retrieval (Table 4)",
    run="rag",
    config="dynheads.experiments.rag:RagConfig",
    section="rag_section",
    evidence="rag.md",
    deals_samples=True,
)
