"""dynheads: which attention heads retrieve from the context at each generated token, and what that means.

Public API (the CLI is a thin layer over it; the runners of whole experiments are in ``dynheads.experiments``)::

    lm = dynheads.load_model()                      # embedded SmolLM2-135M-Instruct GGUF, or any HF model
    sample = dynheads.niah.make_sample(lm.tokenizer, context_tokens=1000, depth=0.5, seed=0)
    trace = dynheads.trace(lm, sample, max_new_tokens=48)
    trace.copy_scores    # [step, layer, head] bool, Eq. 1

Every name in ``__all__`` is part of the declared API; anything reached through a deeper module path may change.
Names are imported on first use, so ``import dynheads`` does not pay for torch and transformers.
"""

from __future__ import annotations

from dynheads.lazy import lazy_exports

__version__ = "0.1.0"

# public name -> "module" (the module itself) or "module:attribute"
_EXPORTS = {
    # models, tracing, traces, run directories
    "DynheadsError": "dynheads.errors:DynheadsError",
    "LoadedModel": "dynheads.models:LoadedModel",
    "load_model": "dynheads.models:load_model",
    "trace": "dynheads.decoding:trace",
    "trace_batch": "dynheads.batching:trace_batch",
    "Trace": "dynheads.traces:Trace",
    "RunDir": "dynheads.runs:RunDir",
    # tasks: make_sample, score, ... per task
    "niah": "dynheads.tasks.niah",
    "hotpotqa": "dynheads.tasks.hotpotqa",
    "multihop": "dynheads.tasks.multihop",
    # static heads and head lists
    "NiahTest": "dynheads.analysis.static:NiahTest",
    "ReasoningTest": "dynheads.analysis.static:ReasoningTest",
    "StaticHeads": "dynheads.analysis.static:StaticHeads",
    "static_heads": "dynheads.analysis.static:static_heads",
    "static_reasoning_heads": "dynheads.analysis.static:static_reasoning_heads",
    "load_head_list": "dynheads.analysis.headlists:load_head_list",
    "save_head_scores": "dynheads.analysis.headlists:save_head_scores",
    # dynamism statistics (Tables 1 and 5)
    "DynamismStats": "dynheads.analysis.dynamism:DynamismStats",
    "binarize": "dynheads.analysis.dynamism:binarize",
    "dynamism_stats": "dynheads.analysis.dynamism:dynamism_stats",
    "table1_markdown": "dynheads.analysis.dynamism:table1_markdown",
    "table5_markdown": "dynheads.analysis.dynamism:table5_markdown",
    # CCA and the head predictor (MLP from hidden state to head scores)
    "CCAConfig": "dynheads.analysis.cca:CCAConfig",
    "samples_from_traces": "dynheads.analysis.cca:samples_from_traces",
    "cca_offsets": "dynheads.analysis.cca:cca_offsets",
    "cca_markdown": "dynheads.analysis.cca:cca_markdown",
    "write_cca": "dynheads.analysis.cca:write_cca",
    "HeadPredictorConfig": "dynheads.analysis.mlp_probe:ProbeConfig",
    "train_head_predictor": "dynheads.analysis.mlp_probe:train_probe",
    "load_head_predictor": "dynheads.analysis.mlp_probe:load_probe",
    # ablation, KV retention, hallucination detection
    "AblationSettings": "dynheads.ablation:AblationSettings",
    "ablated_generate": "dynheads.ablation:ablated_generate",
    "KVSettings": "dynheads.kv:KVSettings",
    "kv_generate": "dynheads.kv:kv_generate",
    "kv_head_matrix": "dynheads.analysis.kvheads:kv_head_matrix",
    "query_head_scores": "dynheads.analysis.kvheads:query_head_scores",
    "write_duo_attention": "dynheads.analysis.kvheads:write_duo_attention",
    "token_features": "dynheads.analysis.hallucination:token_features",
    "Detector": "dynheads.experiments.detect:Detector",
    "apply_detector": "dynheads.experiments.detect:apply_detector",
    # figures and the report
    "plot_head_dynamics": "dynheads.plots.heads:plot_head_dynamics",
    "plot_heatmaps": "dynheads.plots.ablation:plot_heatmaps",
    "plot_cca": "dynheads.plots.cca:plot_cca",
    "write_report": "dynheads.report:write_report",
}
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("dynheads", globals(), _EXPORTS)
