"""The runners of whole experiments: each takes a config and a run directory, writes it and returns it.

    from dynheads.experiments import NiahConfig, run_niah
    run = run_niah(NiahConfig(lengths=(500,), depths=(0.5,), runs=1), "runs/niah")

Every name in ``__all__`` is part of the declared API. The whole study is ``run_reproduce`` (the module
``dynheads.experiments.reproduce`` holds it under the name ``reproduce``). Names are imported on first use.
"""

from __future__ import annotations

from dynheads.lazy import lazy_exports

# public name -> "module:attribute"
_EXPORTS = {
    "NiahConfig": "dynheads.experiments.niah:NiahConfig",
    "run_niah": "dynheads.experiments.niah:run_niah",
    "HotpotConfig": "dynheads.experiments.hotpotqa:HotpotConfig",
    "run_hotpotqa": "dynheads.experiments.hotpotqa:run_hotpotqa",
    "StaticConfig": "dynheads.experiments.static:StaticConfig",
    "run_static": "dynheads.experiments.static:run_static",
    "StaticReasoningConfig": "dynheads.experiments.static:StaticReasoningConfig",
    "run_static_reasoning": "dynheads.experiments.static:run_static_reasoning",
    "dynamism_report": "dynheads.experiments.analyses:dynamism_report",
    "plot_heads": "dynheads.experiments.analyses:plot_heads",
    "cca_report": "dynheads.experiments.analyses:cca_report",
    "train_probe_on_run": "dynheads.experiments.probing:train_probe_on_run",
    "AblationConfig": "dynheads.experiments.ablation:AblationConfig",
    "run_ablation": "dynheads.experiments.ablation:run_ablation",
    "ProgressiveConfig": "dynheads.experiments.ablation:ProgressiveConfig",
    "run_progressive": "dynheads.experiments.ablation:run_progressive",
    "RagConfig": "dynheads.experiments.rag:RagConfig",
    "run_rag": "dynheads.experiments.rag:run_rag",
    "rag_table": "dynheads.experiments.rag:rag_table",
    "KVConfig": "dynheads.experiments.kv:KVConfig",
    "run_kv": "dynheads.experiments.kv:run_kv",
    "DetectConfig": "dynheads.experiments.detect:DetectConfig",
    "run_detect": "dynheads.experiments.detect:run_detect",
    "apply_detector": "dynheads.experiments.detect:apply_detector",
    "ReproduceConfig": "dynheads.experiments.reproduce:ReproduceConfig",
    "run_reproduce": "dynheads.experiments.reproduce:reproduce",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("dynheads.experiments", globals(), _EXPORTS)
