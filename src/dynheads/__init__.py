"""dynheads: which attention heads retrieve from the context at each generated token, and what that means.

Public API (the CLI is a thin layer over it)::

    lm = dynheads.load_model()                      # embedded SmolLM2-135M-Instruct GGUF, or any HF model
    sample = dynheads.niah.make_sample(lm.tokenizer, context_tokens=1000, depth=0.5, seed=0)
    trace = dynheads.trace(lm, sample, max_new_tokens=48)
    trace.copy_scores    # [step, layer, head] bool, Eq. 1

Names are imported on first use, so ``import dynheads.analysis...`` does not pay for torch and transformers.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "DynheadsError": "dynheads.errors",
    "LoadedModel": "dynheads.models",
    "load_model": "dynheads.models",
    "Trace": "dynheads.traces",
    "trace": "dynheads.decoding",
    "niah": "dynheads.tasks.niah",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'dynheads' has no attribute {name!r}")
    module = importlib.import_module(_EXPORTS[name])
    return module if module.__name__.endswith(name) else getattr(module, name)
