"""The runners of whole experiments: each takes a config and a run directory, writes it and returns it.

    from dynheads.experiments import NiahConfig, run_niah
    run = run_niah(NiahConfig(lengths=(500,), depths=(0.5,), runs=1), "runs/niah")

Every name in ``__all__`` is part of the declared API. The whole study is ``run_reproduce`` (the module
``dynheads.experiments.reproduce`` holds it under the name ``reproduce``). Names are imported on first use.
"""

from __future__ import annotations

from dynheads.lazy import exports_by_name, lazy_exports

# module -> the public names it provides ("public=attribute" where the public name differs)
_EXPORTS = exports_by_name(
    {
        "dynheads.experiments.niah": ("NiahConfig", "run_niah"),
        "dynheads.experiments.hotpotqa": ("HotpotConfig", "run_hotpotqa"),
        "dynheads.experiments.experiment": ("run_task",),
        "dynheads.experiments.static": (
            "StaticConfig",
            "run_static",
            "run_static_qrhead",
            "StaticReasoningConfig",
            "run_static_reasoning",
        ),
        "dynheads.views.analyses": ("dynamism_report", "plot_heads", "cca_report"),
        "dynheads.views.probing": ("train_probe_on_run",),
        "dynheads.experiments.ablation": ("AblationConfig", "run_ablation", "ProgressiveConfig", "run_progressive"),
        "dynheads.experiments.dose": ("run_doses",),
        "dynheads.views.dose_tables": ("write_doses",),
        "dynheads.experiments.paper_stages": ("run_claim2",),
        "dynheads.experiments.rag": ("RagConfig", "run_rag"),
        "dynheads.rag.results": ("rag_table",),
        "dynheads.experiments.kv": ("KVConfig", "run_kv"),
        "dynheads.experiments.rerank": ("RerankConfig", "run_rerank", "summarise_scored"),
        "dynheads.rag.rerank_strategies": ("RERANK_STRATEGIES", "RerankStrategy", "Candidates"),
        "dynheads.views.detect": ("DetectConfig", "run_detect"),
        "dynheads.analysis.detector": ("apply_detector",),
        "dynheads.experiments.halueval": ("HaluevalConfig", "trace_halueval", "run_transfer"),
        "dynheads.experiments.reproduce": ("ReproduceConfig", "run_reproduce=reproduce"),
    }
)
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("dynheads.experiments", globals(), _EXPORTS)
