"""dynheads: which attention heads retrieve from the context at each generated token, and what that means.

Public API (the CLI is a thin layer over it; the runners of whole experiments are in ``dynheads.experiments``)::

    lm = dynheads.load_model()                      # embedded SmolLM2-135M-Instruct GGUF, or any HF model
    sample = dynheads.niah.make_sample(lm.tokenizer, context_tokens=1000, depth=0.5, seed=0)
    trace = dynheads.trace(lm, sample, max_new_tokens=48)
    trace.copy_scores    # [step, layer, head] bool, Eq. 1
    sample = dynheads.sample_from_text(lm, "The magic word is [[pineapple]].", "What is the magic word?")
    trace.looked_at(tokenizer=lm.tokenizer)  # per step, each dynamic head's attended position and token

Every name in ``__all__`` is part of the declared API; anything reached through a deeper module path may change.
Names are imported on first use, so ``import dynheads`` does not pay for torch and transformers.
"""

from __future__ import annotations

from dynheads.lazy import exports_by_name, lazy_exports

__version__ = "0.1.0"

# module -> the public names it provides ("public=attribute" where the public name differs); a module listed under
# its package is exported itself
_EXPORTS = exports_by_name(
    {
        # models, tracing, traces, run directories
        "dynheads.errors": ("DynheadsError",),
        "dynheads.models": ("LoadedModel", "LoadedTokenizer", "load_model", "load_tokenizer", "with_cache"),
        "dynheads.engine.tracing": ("trace", "trace_batch"),
        "dynheads.traces": ("Trace", "LookedAt"),
        "dynheads.runs": ("RunDir", "Job", "Finished", "run_jobs"),
        # the tasks: make_sample, score, ... per task; the one sample type, the task registry, the score vocabulary
        "dynheads.tasks": ("niah", "hotpotqa", "multihop"),
        "dynheads.tasks.sample": ("Sample",),
        "dynheads.tasks.own_text": ("sample_from_text",),  # a prompt of one's own text and its spans
        "dynheads.tasks.registry": ("Task", "get_task", "register_task=register"),
        "dynheads.scores": ("ScoreSpec", "HeadScore", "HEAD_SCORES", "register_score"),
        # static heads, head lists, dynamism statistics (Tables 1 and 5)
        "dynheads.analysis.static": (
            "NiahTest",
            "ReasoningTest",
            "StaticHeads",
            "static_heads",
            "static_reasoning_heads",
        ),
        "dynheads.analysis.headlists": ("load_head_list", "save_head_scores"),
        "dynheads.analysis.dynamism": (
            "DynamismStats",
            "binarize",
            "dynamism_stats",
            "table1_markdown",
            "table5_markdown",
        ),
        # CCA and the head predictor (the MLP from hidden state to head scores)
        "dynheads.analysis.settings": ("CCAConfig", "HeadPredictorConfig"),
        "dynheads.analysis.cca": ("samples_from_traces", "cca_offsets", "cca_markdown", "write_cca"),
        "dynheads.analysis.head_predictor": ("train_head_predictor", "load_head_predictor"),
        # the registries of named variants (register one to add a KV policy, an ablation or RAG strategy, a stage)
        "dynheads.registry": ("Registry",),
        "dynheads.kv.policies": ("KV_POLICIES", "retention_policy"),
        "dynheads.ablation.strategies": ("ABLATION_STRATEGIES", "ablation_strategy"),
        "dynheads.rag.strategies": ("RAG_STRATEGIES", "RagStrategy"),
        "dynheads.kv.press_registry": ("KVPRESS_PRESSES", "PressEntry"),
        "dynheads.stages": ("STAGES", "Stage"),
        # ablation, KV retention, hallucination detection
        "dynheads.ablation.cascade": ("AblationSettings", "ablated_generate", "ablated_generate_batch"),
        "dynheads.ablation.teacher_forced": ("forced_ablation", "forced_ablations"),
        "dynheads.kv.retention": ("KVSettings", "kv_generate", "kv_generate_batch"),
        "dynheads.kv.cache": ("HeadwiseCache", "headwise_generate"),
        "dynheads.kv.presses": ("head_list_press", "head_tokens_press", "load_voters", "press_from_export"),
        "dynheads.kv.token_votes": ("head_tokens",),
        "dynheads.analysis.kvheads": ("kv_head_matrix", "query_head_scores", "write_duo_attention"),
        "dynheads.analysis.hallucination": ("token_features",),
        "dynheads.analysis.detector": ("Detector", "apply_detector"),
        # figures and the report
        "dynheads.plots.heads": ("plot_head_dynamics",),
        "dynheads.plots.ablation": ("plot_heatmaps",),
        "dynheads.plots.cca": ("plot_cca",),
        "dynheads.report": ("write_report", "write_compare", "run_rules"),
        "dynheads.report.view": ("write_view", "write_trace_view"),  # the clickable per-step view
        # stage results as data (summary.json) and the one table renderer (markdown and HTML)
        "dynheads.tables": ("Summary", "Table", "Heading", "Items", "read_summaries", "write_summary"),
    }
)
__all__ = sorted(_EXPORTS)

__getattr__, __dir__ = lazy_exports("dynheads", globals(), _EXPORTS)
